"""The training prompt mix: varied chat prompts built from our own templates and word lists, plus
offline text found on every machine (docstrings of the Python standard library).

Why its own lists: the draft must generalise to chat traffic, so the mix covers the same *kinds*
of task a chat model sees (questions, how-to, code, rewriting, creative writing, translation,
structured output, arithmetic, summaries of long documents), but it never uses the benchmark
prompts (benchmarks/prompts/) or their topics: ``BENCHMARK_TOPICS`` are filtered out, and a test
checks that no benchmark prompt appears. Deterministic for a given seed.

Why vocabulary words: with ~100 hand-written concepts the answers repeat their topics, and a head
trained on them scored 0.53 top-1 on held-out answers of the same mix but 0.30 on the benchmark's
prompts. The tokenizer's own whole-word tokens (``vocabulary_words``: ~15,000 on SmolLM2) give the
mix thousands of topics at no cost.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import random
import re

# Topics the benchmark prompts are about: never used here, so measured acceptance is held-out.
BENCHMARK_TOPICS = (
    "australia", "hash table", "sky blue", "seasons", "palindrome", "fibonacci", "fib(", "highest total order",
    "lines of all", "bike lane", "photosynthesis", "lighthouse", "snowed-in", "sunrise", "moved to thursday",
    "passport", "planet", "alice", "technical documentation", "mystery story", "anagram",
)

CONCEPTS = (
    "plate tectonics", "the water cycle", "compound interest", "inflation", "supply and demand", "vaccines",
    "black holes", "the immune system", "DNA replication", "antibiotic resistance", "climate change",
    "the greenhouse effect", "nuclear fission", "solar panels", "wind turbines", "electric motors",
    "the internet", "public-key cryptography", "TCP/IP", "DNS", "HTTP cookies", "garbage collection",
    "recursion", "binary search", "linked lists", "sorting algorithms", "big-O notation", "virtual memory",
    "operating system schedulers", "containers and Docker", "version control with Git", "unit testing",
    "REST APIs", "relational databases", "database indexes", "caching", "load balancing", "neural networks",
    "gradient descent", "overfitting", "decision trees", "the French Revolution", "the Industrial Revolution",
    "the printing press", "the Silk Road", "ancient Egypt", "the Renaissance", "the Cold War",
    "the invention of the telephone", "impressionist painting", "jazz", "the symphony orchestra",
    "the rules of chess", "the Olympic Games", "volcanoes", "earthquakes", "hurricanes", "coral reefs",
    "rainforests", "bees and pollination", "migration of birds", "how plants grow", "the human heart",
    "sleep", "nutrition and protein", "meditation", "the stock market", "bonds", "credit scores",
    "budgeting", "remote work", "time management", "public speaking", "negotiation", "leadership",
    "the scientific method", "statistics and averages", "probability", "prime numbers", "the Pythagorean theorem",
    "calculus", "electricity", "magnetism", "gravity", "the speed of light", "sound waves", "rainbows",
    "tides", "glaciers", "deserts", "fermentation", "bread baking", "coffee roasting", "composting",
    "recycling", "3D printing", "blockchains", "quantum computers", "GPS", "batteries", "the microwave oven",
    "refrigerators", "airplane wings", "submarines", "bridges", "skyscrapers", "roman aqueducts",
    "the human eye", "memory and learning", "language acquisition in children", "dinosaurs", "evolution",
)

PAIRS = (
    ("Python", "JavaScript"), ("lists", "tuples in Python"), ("TCP", "UDP"), ("SQL", "NoSQL databases"),
    ("weather", "climate"), ("viruses", "bacteria"), ("stocks", "bonds"), ("renting", "buying a home"),
    ("cats", "dogs as pets"), ("tea", "coffee"), ("trains", "planes for travel in Europe"),
    ("processes", "threads"), ("RAM", "disk storage"), ("a compiler", "an interpreter"),
    ("machine learning", "traditional programming"), ("mitosis", "meiosis"), ("speed", "velocity"),
    ("empathy", "sympathy"), ("a crocodile", "an alligator"), ("baking soda", "baking powder"),
    ("Git merge", "Git rebase"), ("a virus", "a worm in computer security"), ("HTTP", "HTTPS"),
    ("static typing", "dynamic typing"), ("a lake", "a pond"), ("frogs", "toads"),
)

TASKS = (
    "change a flat bicycle tire", "start a vegetable garden", "learn a new language as an adult",
    "prepare for a job interview", "write a good cover letter", "organize a small closet",
    "make a simple tomato sauce", "train a puppy to sit", "set up a Python virtual environment",
    "back up the photos on my phone", "reduce my electricity bill", "keep houseplants alive",
    "run my first 5 kilometres", "save money on groceries", "plan a birthday party for a child",
    "study for a math exam", "write a clear email to a professor", "clean a cast iron pan",
    "brew pour-over coffee", "choose a laptop for programming", "improve my handwriting",
    "fall asleep faster", "read more books", "make a budget spreadsheet", "debug a slow web page",
    "review a pull request", "name variables well in code", "give constructive feedback",
    "pack for a week-long trip", "learn to juggle", "paint a room", "host a board game night",
)

CODE_SPECS = (
    "reverses the words in a sentence", "counts the vowels in a string", "returns the largest of three numbers",
    "checks whether a number is prime", "computes the factorial of n", "merges two sorted lists",
    "removes duplicates from a list while keeping order", "converts Celsius to Fahrenheit",
    "finds the most common word in a text", "flattens a nested list", "validates an email address",
    "returns the n-th triangular number", "computes the greatest common divisor of two integers",
    "groups a list of words by their first letter", "parses a date string in YYYY-MM-DD format",
    "reads a CSV file and returns the sum of one column", "implements a stack with push and pop",
    "implements a simple queue", "counts word frequencies", "checks whether two strings are anagrams",
    "rotates a list by k positions", "computes the average of a list of numbers",
    "finds the second largest number in a list", "converts a decimal number to binary",
    "capitalizes the first letter of every word", "returns all even numbers from a list",
    "computes the distance between two points", "generates a random password",
    "chunks a list into pieces of size n", "checks whether a year is a leap year",
    "sums the digits of an integer", "transposes a matrix", "implements binary search on a sorted list",
    "counts the lines in a text file", "retries a function call up to three times",
    "memoizes a function", "computes a running total of a list", "finds the longest word in a sentence",
    "converts a dictionary to a list of key-value pairs sorted by value", "detects a cycle in a linked list",
)

LANGS = ("Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "Ruby")

CREATIVE_FORMS = (
    "a haiku", "a limerick", "a four-line poem", "a short poem", "a very short story", "a fable with a moral",
    "a dialogue between two friends", "a product description", "a motivational speech", "a diary entry",
    "a postcard message", "the first paragraph of a fantasy novel", "a song chorus", "a riddle",
    "a thank-you note", "a short news report", "a recipe introduction", "a travel blog paragraph",
)

CREATIVE_SUBJECTS = (
    "a cat who learns to fly", "an old bookshop", "the first day of autumn", "a robot learning to cook",
    "a city at night", "a lost umbrella", "friendship", "a mountain village", "a rainy afternoon",
    "a dragon afraid of fire", "the last day of school", "a train journey", "a garden in spring",
    "a tiny island", "an inventor's workshop", "a forgotten violin", "a penguin on holiday", "a busy market",
    "a time traveller's breakfast", "the moon", "a river", "a brave little mouse", "winter fog",
    "an astronaut's letter home", "a talking tree", "the smell of fresh bread", "a bicycle",
)

AUDIENCES = ("a five-year-old", "a high school student", "a beginner", "an expert", "a busy manager", "a grandparent")

SENTENCES = (
    "The library closes early on Sundays.", "Could you tell me where the train station is?",
    "I would like to order a coffee with milk.", "We are going to the beach tomorrow if it does not rain.",
    "My brother works as a nurse in a large hospital.", "The museum has a new exhibition about ancient coins.",
    "Please turn off the lights when you leave the room.", "This soup needs a little more salt.",
    "The children played in the park until dinner time.", "How much does this jacket cost?",
    "I have been learning to play the guitar for two years.", "The new software update fixes several bugs.",
    "Our team won the match in the last minute.", "It is important to drink enough water every day.",
    "The flight was delayed because of the storm.", "She reads a book every week.",
    "Can we reschedule our call to next Monday?", "The garden is full of flowers in May.",
    "I forgot my keys at the office.", "Thank you very much for your help yesterday.",
)

TARGET_LANGS = ("German", "Italian", "Portuguese", "Dutch", "French", "Spanish", "Japanese", "Chinese", "Polish")

ENTITIES = (
    ("movie", "title, director, year and main actors"), ("recipe", "name, servings, ingredients and steps"),
    ("employee", "name, role, department and start date"), ("car", "make, model, year and fuel type"),
    ("city", "name, country, population and famous landmarks"), ("song", "title, artist, album and length"),
    ("laptop", "brand, CPU, RAM and price"), ("restaurant", "name, cuisine, rating and address"),
    ("event", "name, date, location and attendees"), ("course", "title, teacher, credits and topics"),
    ("smartphone", "brand, model, storage and colors"), ("user account", "username, email, roles and created_at"),
)

TABLE_TOPICS = (
    ("fruits", "name, color and vitamin"), ("programming languages", "name, year and typical use"),
    ("countries in Europe", "country, capital and language"), ("animals", "animal, habitat and diet"),
    ("famous scientists", "name, field and discovery"), ("sports", "sport, players per team and equipment"),
    ("musical instruments", "instrument, family and origin"), ("rivers", "river, continent and length"),
)

QUESTION_STEMS = (
    "What is {c}?", "Explain {c} to {a}.", "How does {c} work?", "Why is {c} important?",
    "Give me three interesting facts about {c}.", "What are common misconceptions about {c}?",
    "Write a short paragraph about {c}.", "What should a beginner know about {c}?",
    "Describe the history of {c} briefly.", "What are the advantages and disadvantages of {c}?",
    "Explain {c} in simple terms.", "Summarize the key ideas behind {c}.",
)


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def stdlib_paragraphs(limit: int = 1500, min_chars: int = 160, max_chars: int = 700, per_module: int = 12) -> list[str]:
    """Docstring paragraphs of the Python standard library (at most ``per_module`` from each module,
    so that many modules contribute): offline prose about software."""
    import sys

    out: list[str] = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in ("antigravity", "this", "idlelib", "tkinter", "turtledemo"):
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # platform-specific or optional modules
            continue
        docs = [inspect.getdoc(mod) or ""]
        docs += [inspect.getdoc(obj) or "" for _, obj in inspect.getmembers(mod)
                 if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == name]
        paras = [_clean(p) for doc in docs for p in doc.split("\n\n")]
        out += [p for p in paras if min_chars <= len(p) <= max_chars and not p.startswith((">>>", ".."))][:per_module]
        if len(out) >= limit:
            break
    return out[:limit]


def stdlib_functions(limit: int = 300) -> list[tuple[str, str]]:
    """(module, function name) of documented pure-Python stdlib functions: 'explain' prompts."""
    out = []
    for info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if info.name not in ("json", "textwrap", "shutil", "statistics", "string", "fnmatch", "glob", "heapq",
                             "bisect", "functools", "itertools", "os", "random", "csv", "difflib", "calendar"):
            continue
        mod = importlib.import_module(info.name)
        for fname, obj in inspect.getmembers(mod, inspect.isfunction):
            if not fname.startswith("_") and inspect.getdoc(obj):
                out.append((info.name, fname))
    return out[:limit]


def vocabulary_words(tokenizer, min_len: int = 6) -> list[str]:
    """Lower-case alphabetic whole-word tokens of ``tokenizer`` (a leading-space marker stripped),
    at least ``min_len`` letters, sorted: a topic list of the target's own vocabulary."""
    words = set()
    for tok in tokenizer.get_vocab():
        w = tok[1:] if tok[:1] in ("\u0120", "\u2581") else ""  # GPT-2 / SentencePiece word-start markers
        if len(w) >= min_len and w.isascii() and w.isalpha() and w.islower():
            words.add(w)
    return sorted(words)


def _word_prompt(rng: random.Random, words: list[str]) -> str:
    w, w2, a = rng.choice(words), rng.choice(words), rng.choice(AUDIENCES)
    return rng.choice((
        f"What does the word \"{w}\" mean? Use it in two example sentences.",
        f"Tell me about {w}.", f"Explain the idea of {w} to {a}.",
        f"Write a short paragraph that uses the words \"{w}\" and \"{w2}\".",
        f"Write a short story about {w} and {w2}.", f"Write a poem about {w}.",
        f"Give me five questions someone might ask about {w}, with short answers.",
        f"Write a JSON object describing \"{w}\" with the fields word, meaning, example and synonyms.",
        f"Write a YAML list of three things related to {w}, each with a name and a description.",
        f"What is the connection between {w} and {w2}?", f"Write an email to a colleague about {w}.",
    ))


def long_document(rng: random.Random, paras: list[str], words: tuple[int, int] = (400, 1100)) -> str:
    """A document of consecutive docstring paragraphs (about ``words`` words: 400-1,100 in the
    prompt mix) and a request about it."""
    start = rng.randrange(len(paras))
    doc, n = [], 0
    for p in paras[start:] + paras[:start]:
        doc.append(p)
        n += len(p.split())
        if n >= rng.randint(*words):
            break
    ask = rng.choice(("Summarize this document in a few paragraphs.", "Write a summary of the text above for a newcomer.",
                      "What are the main points of this document? Answer in a bulleted list.",
                      "Summarize the text above in five sentences."))
    return "\n\n".join(doc) + "\n\n" + ask


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(12, 999), rng.randint(3, 99)
    return rng.choice((
        f"What is {a} times {b}? Show your work.",
        f"A shop sells pens for {b} cents each. How much do {a} pens cost in dollars?",
        f"If a train travels {a} kilometres in {b % 9 + 2} hours, what is its average speed?",
        f"What is {a} divided by {b}, rounded to two decimal places?",
        f"I have {a} apples and give away {b}. How many are left? Explain briefly.",
    ))


def _one_prompt(rng: random.Random, paras: list[str], funcs: list[tuple[str, str]], words: list[str]) -> str:
    kind = rng.choices(range(12), weights=(12, 5, 7, 13, 8, 9, 6, 6, 2, 2, 22 if words else 0, 8))[0]
    if kind == 10:
        return _word_prompt(rng, words)
    if kind == 11:
        return long_document(rng, paras)
    c, a = rng.choice(CONCEPTS), rng.choice(AUDIENCES)
    if kind == 0:
        return rng.choice(QUESTION_STEMS).format(c=c, a=a)
    if kind == 1:
        x, y = rng.choice(PAIRS)
        return rng.choice(("What is the difference between {} and {}?", "Compare {} and {}.",
                           "Which is better for a beginner, {} or {}? Explain.")).format(x, y)
    if kind == 2:
        t = rng.choice(TASKS)
        return rng.choice((f"How do I {t}?", f"Give me step-by-step instructions to {t}.",
                           f"List {rng.randint(3, 7)} tips to {t}.", f"What mistakes should I avoid when I {t}?"))
    if kind == 3:
        lang, spec = rng.choice(LANGS), rng.choice(CODE_SPECS)
        return rng.choice((f"Write a {lang} function that {spec}.",
                           f"Write a {lang} function that {spec}, and explain how it works.",
                           f"Implement a function in {lang} that {spec}. Include a short example.",
                           f"Write a unit test for a {lang} function that {spec}."))
    if kind == 4:
        p = rng.choice(paras)
        return rng.choice((f"Summarize the following text in one sentence:\n\n{p}",
                           f"Explain this documentation in plain language:\n\n{p}",
                           f"List the key points of this text as bullets:\n\n{p}",
                           f"Rewrite this paragraph so a beginner can understand it:\n\n{p}",
                           f"Suggest a short title for this text:\n\n{p}"))
    if kind == 5:
        return rng.choice(("Write {} about {}.", "Compose {} about {}.", "Please write {} about {}.")).format(
            rng.choice(CREATIVE_FORMS), rng.choice(CREATIVE_SUBJECTS))
    if kind == 6:
        return rng.choice(("Translate this sentence to {}: {}", "How do you say this in {}? \"{}\"",
                           "Please translate into {}:\n{}")).format(rng.choice(TARGET_LANGS), rng.choice(SENTENCES))
    if kind == 7:
        (e, fields), (t, cols) = rng.choice(ENTITIES), rng.choice(TABLE_TOPICS)
        return rng.choice((f"Create a JSON object for a {e} with the fields {fields}.",
                           f"Make a markdown table of five {t} with the columns {cols}.",
                           f"Write a YAML example describing a {e} ({fields}).",
                           f"Give me CSV data for four {t} with the columns {cols}."))
    if kind == 8:
        return _arithmetic(rng)
    mod, fn = rng.choice(funcs)
    return rng.choice((f"What does the Python function {mod}.{fn} do? Give an example.",
                       f"Show how to use {mod}.{fn} in Python."))


def build_prompt_mix(n: int, seed: int = 0, words: list[str] | None = None,
                     korean_frac: float = 0.0) -> list[list[dict]]:
    """``n`` distinct chat conversations (one user turn, sometimes a system turn), benchmark topics
    excluded; ``words`` (``vocabulary_words``) adds prompts on thousands of topics; ``korean_frac``:
    the share written in Korean (``training.korean_mix``; 0 gives the English mix unchanged)."""
    from training.korean_mix import korean_prompt, korean_system

    if not 0.0 <= korean_frac <= 1.0:
        raise ValueError(f"korean_frac={korean_frac}: must be within [0, 1]")
    rng, ko_rng = random.Random(seed), random.Random(f"korean-{seed}")
    paras, funcs = stdlib_paragraphs(), stdlib_functions()
    systems = ("You are a helpful assistant.", "You are a concise assistant. Keep answers short.",
               "You are a friendly teacher.", "You are an expert software engineer.")
    seen: set[str] = set()
    out: list[list[dict]] = []
    for _ in range(n * 20):
        if len(out) >= n:
            break
        korean = korean_frac > 0 and ko_rng.random() < korean_frac
        r = ko_rng if korean else rng
        text = korean_prompt(r, paras) if korean else _one_prompt(rng, paras, funcs, words or [])
        if text in seen or any(t in text.lower() for t in BENCHMARK_TOPICS):
            continue
        seen.add(text)
        msgs = [{"role": "user", "content": text}]
        if r.random() < 0.2:
            msgs.insert(0, {"role": "system", "content": korean_system(r) if korean else r.choice(systems)})
        out.append(msgs)
    return out
