"""short_qa: one- or two-sentence questions (expected output 50-100 tokens), in English and Korean.

Built from three independent pools: the question (each used at most once), an answer-shape
constraint that also sets the output budget, and an optional system message."""
from __future__ import annotations

import random

LO, HI = 50, 100
KOREAN_SHARE = 0.25
SYSTEM_MIN_WORDS = 8

_EN = (
    "Why do onions make people cry when they are cut?", "How do bees decide where to build a new hive?",
    "What makes a rainbow appear after a storm?", "Why does ice float on water instead of sinking?",
    "How do vaccines train the immune system?", "How does a virus differ from a bacterium?",
    "Why do cats purr?", "How does a compass needle know which way is north?", "What causes ocean tides?",
    "Why do leaves change colour in autumn?", "How do noise-cancelling headphones block sound?",
    "What is a black hole, in simple terms?", "Why does bread go stale?", "How does a microwave oven heat food?",
    "Why do we get goosebumps?", "What is the greenhouse effect?", "How do plants know which way is up?",
    "Why is seawater salty when river water is not?", "How do octopuses change colour?", "What causes thunder?",
    "Why do many people need reading glasses after the age of forty?",
    "How can a heat pump move heat from a cold place to a warm one?", "What does the human appendix do?",
    "Why do stars twinkle while planets mostly do not?", "How do migrating birds find their way?",
    "What does an operating system actually do?", "How does public-key encryption let two strangers share a secret?",
    "RAM versus storage: what does each one do?", "Why do websites ask me to accept cookies?",
    "What is a race condition in programming?", "How does GPS work out where my phone is?",
    "What separates a compiler from an interpreter?",
    "Why does a new USB stick show less free space than the label promises?",
    "What is a content delivery network used for?", "How does two-factor authentication make an account safer?",
    "What does garbage collection mean in a programming language?",
    "Why do large language models sometimes state things that are false?",
    "What does the S in HTTPS add to plain HTTP?", "How do QR codes store information?",
    "What is technical debt in a software project?", "What does speculative decoding do in a language model server?",
    "Why is it hard for a computer to generate truly random numbers?",
    "What is an API? Use an everyday analogy.", "Why was the printing press so important in European history?",
    "What was the Silk Road, and what travelled along it besides silk?", "Why did ancient Egyptians build pyramids?",
    "How did people tell the time before mechanical clocks?", "What was the Great Wall of China built for?",
    "Why do some countries drive on the left and others on the right?",
    "Where does the custom of birthday cakes come from?", "Why did the Titanic sink so quickly?",
    "What was the Hanseatic League?", "How did the ancient Olympic Games begin?",
    "Why is Latin still used for scientific names of plants and animals?", "Why is the Dead Sea so salty?",
    "What causes a desert to form?", "Why does Iceland have so many volcanoes?", "How were fjords formed?",
    "Why is the Amazon rainforest important for the whole planet?", "What is a monsoon?",
    "Why do trees stop growing above a certain altitude on mountains?",
    "How much water does an adult really need each day?", "Why is sleep important for memory?",
    "How can I tell a cold from the flu?", "Why should you finish a course of antibiotics?",
    "How does regular exercise affect mood?", "What does a calorie actually measure?",
    "Why do muscles feel sore a day or two after hard exercise?", "Is cracking your knuckles bad for you?",
    "What is inflation, and why do central banks try to control it?", "Why do airline ticket prices change so often?",
    "Stocks and bonds: how do they differ for an investor?", "How does compound interest work?",
    "What is a supply chain?", "Why do many countries set a minimum wage?", "What does a trade deficit mean?",
    "How do insurance companies make money?", "How can I keep cut flowers fresh for longer?",
    "What is the best way to remove a red wine stain from a cotton shirt?", "How can I tell if an egg is still fresh?",
    "Why does a cast-iron pan need seasoning?", "How often should I water a cactus kept indoors?",
    "What is the quickest way to cool a hot drink without diluting it?",
    "How do I stop my glasses from fogging up when I wear a face mask?", "Why does a moving bicycle stay upright?",
    "How can I make cooked rice less sticky?", "What should I pack for a one-day hike in the mountains?",
    "How do I choose a ripe avocado?", "Why does my phone battery drain faster in cold weather?",
    "When should I write 'affect' and when 'effect'?", "Where does the word 'robot' come from?",
    "Why is English spelling so inconsistent?", "What is a palindrome? Give one example.",
    "What does the idiom 'to bite the bullet' mean?", "Why do some languages have grammatical gender?",
    "Where is the line between a dialect and a language?", "Why can't you divide by zero?",
    "What is a prime number, and why are primes useful in cryptography?", "What is the Monty Hall problem?",
    "How many distinct ways can the letters of the word LEVEL be arranged?",
    "Mean or median: when does the choice really matter?",
    "Why is 0.999... (repeating) equal to 1?", "Where are logarithms used in everyday life?",
    "What does 'statistically significant' mean?", "What makes a poem a haiku?",
    "Why do orchestras tune to the oboe?", "Why do some recipes use baking soda and others baking powder?",
    "Why do old books smell the way they do?", "What is the golden ratio, and where does it appear?",
    "Why are flamingos pink?", "How does the Elo rating system rank chess players?",
    "What is the offside rule in football, in simple terms?", "Why do we yawn?",
    "How does a chameleon catch insects with its tongue?", "What is the difference between weather and climate?",
    "Why do wet fingers stick to very cold metal?", "How do hot-air balloon pilots steer?",
    "What is permafrost, and why does its thawing matter?", "Why does time seem to pass faster as we get older?",
    "What does a sommelier do?", "How is decaffeinated coffee made?",
    "Why are cities usually warmer than the countryside around them?",
    "How can you tell an alligator from a crocodile?", "What is a carbon footprint?",
    "Why are manhole covers usually round?",
)
_KO = (
    "비행기는 그렇게 무거운데 어떻게 하늘을 날 수 있나요?", "김치가 발효되면 왜 신맛이 나나요?",
    "온돌은 어떤 원리로 방을 따뜻하게 하나요?", "미세먼지와 초미세먼지는 크기 말고도 차이가 있나요?",
    "커피를 마시면 왜 잠이 잘 안 오나요?", "한글은 누가, 왜 만들었나요?", "계절이 바뀌는 이유는 무엇인가요?",
    "전기차 배터리는 겨울에 왜 빨리 닳나요?", "주식과 채권의 차이를 쉽게 설명해 주세요.",
    "금리가 오르면 왜 집값이 떨어지는 경향이 있나요?", "클라우드 컴퓨팅이란 무엇인가요?",
    "여러 사이트에서 같은 비밀번호를 쓰면 왜 위험한가요?", "지진이 나면 건물 안에서는 어떻게 행동해야 하나요?",
    "장마는 왜 해마다 비슷한 시기에 시작되나요?", "바닷물은 왜 짠가요?", "고양이는 왜 상자에 들어가는 걸 좋아하나요?",
    "운동을 하고 나면 왜 기분이 좋아지나요?", "물가가 오르면 월급의 실제 가치는 어떻게 변하나요?",
    "양자 컴퓨터는 일반 컴퓨터와 무엇이 다른가요?", "단풍은 왜 지역마다 드는 시기가 다른가요?",
    "라면을 끓일 때 왜 물을 먼저 끓이고 면을 넣나요?", "독감 예방주사는 왜 해마다 맞아야 하나요?",
    "머신러닝과 딥러닝의 차이가 궁금해요.", "태양광 발전은 흐린 날에도 전기를 만들 수 있나요?",
    "조선 시대 사람들은 시간을 어떻게 알았나요?", "유통기한이 지난 우유, 소비기한 안이면 마셔도 되나요?",
    "나트륨을 너무 많이 먹으면 몸에 어떤 문제가 생기나요?", "블록체인이 무엇인지 비유를 들어 설명해 주세요.",
    "환율이 오르면 왜 수출 기업에 유리한가요?", "잠을 적게 자면 기억력에 어떤 영향이 있나요?",
    "식물은 왜 햇빛이 드는 쪽으로 자라나요?", "첨성대는 어떤 용도로 만들어졌나요?",
    "스마트폰 화면을 오래 보면 눈이 왜 피로해지나요?", "분리배출할 때 페트병 라벨을 떼야 하는 이유는 뭔가요?",
    "하루에 물은 얼마나 마시는 게 좋은가요?", "무지개는 왜 여러 가지 색으로 나뉘어 보이나요?",
    "재택근무의 장점과 단점은 무엇인가요?", "뜨거운 음식을 바로 냉장고에 넣으면 안 되는 이유가 있나요?",
    "제주도의 돌하르방은 무엇을 상징하나요?", "철새는 어떻게 먼 길을 잃지 않고 날아가나요?",
    "전세와 월세 중 세입자에게 어느 쪽이 유리한가요?", "번아웃 증후군에는 어떤 증상이 있나요?",
)
# (constraint appended to the question, output budget in tokens); kept short so that two prompts
# sharing a constraint still differ mostly in their question.
_EN_SHAPES = (("Answer in a single sentence.", 50), ("Answer in one or two sentences.", 60),
              ("Keep it under 50 words.", 70), ("Reply in a short paragraph.", 100),
              ("Give one concrete example.", 100), ("Explain it simply, for a curious child.", 90),
              ("Be concise.", 70), ("", 80), ("Answer directly, then add some context.", 80))
_KO_SHAPES = (("두세 문장으로 답해 주세요.", 100), ("짧고 쉽게 설명해 주세요.", 90), ("", 80),
              ("한 문장으로 답하고 이유를 덧붙여 주세요.", 90), ("초등학생도 알아듣게 알려 주세요.", 100))
# A system message replaces the constraint (it shapes the answer instead); it is only given to
# questions of at least SYSTEM_MIN_WORDS words, so that it never outweighs the question itself.
_EN_SYSTEMS = ("Answer briefly and accurately.", "You are a friendly science teacher.",
               "Be brief; admit uncertainty.")
_KO_SYSTEMS = ("짧고 정확하게 한국어로 답하세요.", "Always answer in Korean.")


def _one(rng: random.Random, question: str, korean: bool) -> dict:
    shape, budget = rng.choice(_KO_SHAPES if korean else _EN_SHAPES)
    if len(question.split()) >= (SYSTEM_MIN_WORDS // 2 if korean else SYSTEM_MIN_WORDS) and rng.random() < 0.3:
        system = rng.choice(_KO_SYSTEMS if korean else _EN_SYSTEMS)
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                "max_tokens": budget}
    return {"messages": [{"role": "user", "content": f"{question} {shape}".strip()}], "max_tokens": budget}


def generate(rng: random.Random, n: int) -> list[dict]:
    n_ko = round(n * KOREAN_SHARE)
    if n - n_ko > len(_EN) or n_ko > len(_KO):
        raise ValueError(f"short_qa: {n} prompts need more questions than the pools hold "
                         f"({len(_EN)} English, {len(_KO)} Korean)")
    picked = [(q, False) for q in rng.sample(_EN, n - n_ko)] + [(q, True) for q in rng.sample(_KO, n_ko)]
    rng.shuffle(picked)
    return [_one(rng, q, ko) for q, ko in picked]
