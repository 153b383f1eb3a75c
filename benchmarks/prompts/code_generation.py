"""code_generation: functions, classes, queries and scripts (expected output 100-500 tokens).

Composed from a task pool (each task used at most once), a target language drawn from the languages
that suit the task, a request frame, zero to two extra constraints (which move the output budget),
an occasional Korean framing and an occasional system message."""
from __future__ import annotations

import random

from benchmarks.prompts.text import clamp_round

LO, HI = 100, 500
_GENERAL = ("Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C++", "C#", "Kotlin")
_SCRIPTING = ("Python", "JavaScript", "TypeScript", "Go")
_SIZE = {"s": 170, "m": 260, "l": 380}

# (kind, text, size); "fn" and "class" are completed with a language, the others are whole requests.
_TASKS = (
    ("fn", "merges overlapping intervals given as (start, end) pairs and returns them sorted by start", "s"),
    ("fn", "returns the k most frequent words in a text, breaking ties alphabetically", "s"),
    ("fn", "checks whether a string made of the brackets ()[]{} is balanced", "s"),
    ("fn", "computes the Levenshtein edit distance between two strings", "s"),
    ("fn", "finds the length of the longest substring without repeating characters", "s"),
    ("fn", "rotates a square matrix 90 degrees clockwise in place", "s"),
    ("fn", "does a binary search on a sorted list and returns the insertion point when the value is missing", "s"),
    ("fn", "returns all permutations of a list without using a library permutation function", "s"),
    ("fn", "groups a list of words into lists of anagrams", "s"),
    ("fn", "finds the shortest path between two cells of a grid with walls, using breadth-first search", "m"),
    ("fn", "runs Dijkstra's algorithm on a weighted graph given as an adjacency list and returns the path", "m"),
    ("fn", "detects a cycle in a directed graph and returns the nodes of one cycle if there is one", "m"),
    ("fn", "orders tasks by their dependencies (topological sort) and reports an error on circular "
     "dependencies", "m"),
    ("fn", "converts a Roman numeral to an integer and rejects malformed numerals", "s"),
    ("fn", "spells out an integer below one million in English words", "m"),
    ("fn", "returns the n-th row of Pascal's triangle", "s"),
    ("fn", "finds two numbers in a list that add up to a target and returns their indices", "s"),
    ("fn", "keeps a running median of a stream of numbers using two heaps", "m"),
    ("fn", "compresses a string with run-length encoding, together with the matching decoder", "s"),
    ("fn", "checks whether a filled 9x9 Sudoku grid is valid", "s"),
    ("fn", "generates all valid combinations of n pairs of parentheses", "s"),
    ("fn", "merges k sorted lists into one sorted list efficiently", "s"),
    ("fn", "returns the overlapping area of two axis-aligned rectangles, or zero when they do not overlap", "s"),
    ("fn", "lists all primes up to n with the sieve of Eratosthenes", "s"),
    ("fn", "returns the best profit from one buy and one later sell, given a list of daily prices", "s"),
    ("fn", "reads a CSV of transactions (date, category, amount) and totals the amounts per category per month",
     "m"),
    ("fn", "counts HTTP status codes per hour in a web server access log", "m"),
    ("fn", "removes duplicate customer records, treating email addresses case-insensitively and keeping the "
     "newest record", "m"),
    ("fn", "flattens a nested dictionary into a single level with dotted keys such as a.b.c", "s"),
    ("fn", "splits a sequence into chunks of a given size, the last chunk possibly shorter", "s"),
    ("fn", "parses durations such as 1h30m, 45s or 2d into a number of seconds", "s"),
    ("fn", "formats a number of bytes as a human-readable string such as 1.5 MB", "s"),
    ("fn", "normalises phone numbers written in several common formats to the E.164 format", "m"),
    ("fn", "computes a moving average over a time series that may have missing days", "m"),
    ("fn", "parses a simple INI-style configuration file into nested dictionaries", "m"),
    ("fn", "finds the pair of products most often bought together in a list of orders", "m"),
    ("fn", "turns an article title into a URL slug, for example 'Hello, World!' into 'hello-world'", "s"),
    ("fn", "compares two versions of a list of records by id and reports what was added, removed and changed",
     "m"),
    ("fn", "retries an HTTP request with exponential backoff and random jitter", "m"),
    ("fn", "downloads a list of URLs concurrently, never running more than five requests at once", "m"),
    ("fn", "generates a secure random password with a configurable length and character classes", "s"),
    ("fn", "renders a list of dictionaries as a Markdown table with aligned columns", "m"),
    ("fn", "computes the day of the week for any date without using a date library", "s"),
    ("fn", "tokenises and evaluates arithmetic expressions with + - * / and parentheses, respecting precedence",
     "l"),
    ("fn", "advances Conway's Game of Life by one step on a grid whose edges wrap around", "s"),
    ("fn", "converts colours between RGB and HSL", "m"),
    ("fn", "wraps text at a given width without breaking words", "s"),
    ("fn", "prints a line-by-line diff of two texts, marking added and removed lines", "m"),
    ("fn", "validates a JSON-like value against a small schema of types, required keys and nested objects", "l"),
    ("class", "an LRU cache whose get and put operations both run in constant time", "m"),
    ("class", "a min-heap priority queue with push, pop and peek", "m"),
    ("class", "a token-bucket rate limiter that can be shared between threads", "m"),
    ("class", "a trie that supports insert, exact search and listing all words with a given prefix", "m"),
    ("class", "a bank account with deposits, withdrawals, an overdraft limit and a transaction history", "m"),
    ("class", "an in-memory key-value store whose keys can expire after a time-to-live", "m"),
    ("class", "a fixed-capacity circular buffer that overwrites the oldest item when full", "s"),
    ("class", "a matrix type with addition, multiplication and transpose", "l"),
    ("class", "an event emitter where listeners can subscribe, unsubscribe and receive events", "m"),
    ("class", "a union-find (disjoint set) structure with path compression and union by rank", "s"),
    ("class", "a shopping cart that applies percentage and fixed discounts and then adds sales tax", "l"),
    ("class", "a traffic light state machine with timed transitions and a pedestrian button", "m"),
    ("class", "a worker pool that runs jobs from a queue on N workers and returns the results in input order",
     "l"),
    ("class", "a bounded producer-consumer queue with a clean shutdown", "l"),
    ("program", "a command-line tool like wc that counts lines, words and characters in the files given as "
     "arguments", "m"),
    ("program", "a command-line to-do list that keeps tasks in a JSON file and supports add, list, done and "
     "remove", "l"),
    ("program", "a command-line temperature converter between Celsius, Fahrenheit and Kelvin that rejects bad "
     "input", "s"),
    ("program", "a small script that polls a directory every two seconds and reports new or modified files", "m"),
    ("program", "an HTTP endpoint that accepts JSON with a name and an age, validates both and returns a "
     "greeting", "m"),
    ("program", "HTTP middleware that logs the method, path, status code and duration of every request", "m"),
    ("program", "a paginated HTTP endpoint that lists products with limit and cursor query parameters", "l"),
    ("sql", "Write a SQL query that, for tables employees(id, name, department_id, salary) and departments(id, "
     "name), returns the highest-paid employee of each department.", "s"),
    ("sql", "Write a SQL query that computes monthly active users for the last twelve months from a table "
     "events(user_id, event_time).", "s"),
    ("sql", "Using orders(id, customer_id, order_date, total), write a SQL query listing the customers who "
     "ordered in January but not in February.", "s"),
    ("sql", "Write a SQL query with a window function that ranks products by revenue within each category, given "
     "products(id, name, category) and sales(product_id, quantity, unit_price).", "m"),
    ("sql", "Design a SQL schema for a small library: books, members and loans, with primary keys, foreign keys, "
     "sensible constraints and useful indexes.", "l"),
    ("sql", "Write a SQL query that returns the 7-day rolling average of daily sign-ups from users(id, "
     "created_at).", "s"),
    ("sql", "Write SQL that deletes duplicate rows from contacts(id, email, phone), keeping the row with the "
     "lowest id for each email.", "s"),
    ("shell", "Write a bash script that backs up a directory into a dated .tar.gz archive and deletes archives "
     "older than 14 days.", "m"),
    ("shell", "Write a bash script that prints the ten largest files under a directory with human-readable "
     "sizes.", "s"),
    ("shell", "Write a bash script that reads URLs from a file, checks each one responds with HTTP 200 and prints "
     "a summary of failures.", "m"),
    ("shell", "Write a bash script that renames every .jpeg file in a folder to .jpg, handling spaces in file "
     "names safely.", "s"),
    ("shell", "Give a shell pipeline that counts unique client IP addresses in an nginx access log and lists the "
     "top twenty by request count.", "s"),
    ("snippet", "Find and fix the bug in this Python function, then explain it in one sentence:\n\n"
     "def average(values):\n    total = 0\n    for i in range(1, len(values)):\n        total += values[i]\n"
     "    return total / len(values)", "s"),
    ("snippet", "Rewrite this JavaScript using async/await instead of callbacks, keeping the error handling:\n\n"
     "function loadUser(id, cb) {\n  db.find(id, (err, user) => {\n    if (err) return cb(err);\n"
     "    api.profile(user.handle, (err2, profile) => {\n      if (err2) return cb(err2);\n"
     "      cb(null, { ...user, profile });\n    });\n  });\n}", "s"),
    ("snippet", "Add type hints and a docstring to this Python function and make it handle an empty list:\n\n"
     "def top_scores(scores, n):\n    ranked = sorted(scores, key=lambda s: s[1], reverse=True)\n"
     "    return [name for name, _ in ranked[:n]]", "s"),
    ("snippet", "This Go program has a data race. Explain why and fix it:\n\n"
     "var hits int\nfunc handler(w http.ResponseWriter, r *http.Request) {\n    hits++\n"
     "    fmt.Fprintf(w, \"%d\", hits)\n}", "s"),
    ("snippet", "Write pytest unit tests for this function, covering the edge cases:\n\n"
     "def is_leap_year(year: int) -> bool:\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
     "m"),
)
_KO_TASKS = (
    ("Python으로 주어진 문자열에서 한글 음절만 골라 초성으로 바꿔 주는 함수를 작성해 주세요. "
     "예를 들어 '한국어'는 'ㅎㄱㅇ'이 되어야 합니다.", "m"),
    ("JavaScript로 장바구니 총액을 계산하는 함수를 만들어 주세요. 상품마다 가격과 수량이 있고, "
     "5만 원 이상이면 배송비 3천 원을 면제합니다.", "s"),
    ("TypeScript로 할 일 목록을 관리하는 클래스를 작성해 주세요. 추가, 완료 표시, 삭제, 미완료 항목 조회 기능이 "
     "필요합니다.", "m"),
    ("Python으로 CSV 파일에서 월별 매출 합계를 구해 막대그래프용 딕셔너리로 반환하는 함수를 작성하고, "
     "코드에 한국어 주석을 달아 주세요.", "m"),
    ("Go 언어로 여러 URL에 동시에 요청을 보내고 응답 시간을 측정해 출력하는 프로그램을 작성해 주세요.", "m"),
    ("SQL로 회원 테이블 members(id, name, joined_at)와 주문 테이블 orders(id, member_id, amount, ordered_at)에서 "
     "가입 후 30일 안에 첫 주문을 한 회원 수를 구하는 쿼리를 작성해 주세요.", "s"),
    ("Java로 간단한 도서 대출 시스템을 설계해 주세요. Book, Member, Loan 클래스와 대출·반납 메서드가 있어야 "
     "합니다.", "l"),
    ("Rust로 텍스트 파일을 읽어 단어 빈도를 세고 가장 많이 나온 단어 10개를 출력하는 프로그램을 작성해 주세요.",
     "m"),
)
_FN_FRAMES = ("Write a {lang} function that {text}.", "In {lang}, implement a function that {text}.",
              "I need a {lang} function that {text}.", "Could you write a function in {lang} that {text}?")
_CLASS_FRAMES = ("Implement {text} in {lang}.", "Write a {lang} class for {text}.",
                 "Design and implement {text}, in {lang}.")
_PROGRAM_FRAMES = ("Write {text} in {lang}.", "Using {lang}, build {text}.")
# (sentence, extra budget); "types" only makes sense for languages with optional annotations.
_CONSTRAINTS = (("Include three unit tests.", 110), ("Do not use third-party libraries.", 0),
                ("State the time complexity in one sentence after the code.", 30),
                ("Handle invalid input with a clear error message.", 40), ("Keep it under 40 lines.", -40),
                ("Add a short usage example.", 40), ("Output only the code, with no explanation.", -50),
                ("Comment the tricky parts.", 30))
_KO_WRAP = ("다음 요구사항에 맞는 코드를 작성하고, 코드 아래에 한국어로 짧게 설명해 주세요.\n",
            "아래 작업을 해 주세요. 설명은 한국어로 부탁드립니다.\n")
_SYSTEMS = ("You are a senior software engineer. Write clear, idiomatic, well-tested code.",
            "You are a coding assistant. Prefer readable code over clever code.")


def _request(rng: random.Random, kind: str, text: str) -> str:
    if kind in ("sql", "shell", "snippet", "ko"):
        return text
    langs = _SCRIPTING if kind == "program" else _GENERAL
    frames = {"fn": _FN_FRAMES, "class": _CLASS_FRAMES, "program": _PROGRAM_FRAMES}[kind]
    return rng.choice(frames).format(lang=rng.choice(langs), text=text)


def _one(rng: random.Random, kind: str, text: str, size: str) -> dict:
    request, budget = _request(rng, kind, text), _SIZE[size]
    if kind in ("fn", "class", "program"):
        for sentence, extra in rng.sample(_CONSTRAINTS, rng.choice((0, 1, 1, 2))):
            request, budget = f"{request} {sentence}", budget + extra
    if kind != "ko" and rng.random() < 0.1:
        request = rng.choice(_KO_WRAP) + request
        budget += 60
    messages = [{"role": "user", "content": request}]
    if rng.random() < 0.2:
        messages.insert(0, {"role": "system", "content": rng.choice(_SYSTEMS)})
    return {"messages": messages, "max_tokens": clamp_round(budget, LO, HI)}


def generate(rng: random.Random, n: int) -> list[dict]:
    pool = list(_TASKS) + [("ko", text, size) for text, size in _KO_TASKS]
    if n > len(pool):
        raise ValueError(f"code_generation: {n} prompts need more than the {len(pool)} tasks in the pool")
    return [_one(rng, *task) for task in rng.sample(pool, n)]
