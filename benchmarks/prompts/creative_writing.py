"""creative_writing: stories, essays, poems, letters, diaries, dialogues and fables (expected output
300-800 tokens), in English and Korean.

Each prompt draws a form and deals independent building blocks from shuffled decks (character,
setting, inciting event, theme, tone, constraint, object), so no combination repeats and every block
is used before any is reused."""
from __future__ import annotations

import random
from typing import Callable

from benchmarks.prompts.korean import josa, particle
from benchmarks.prompts.text import Novelty, clamp_round, deck

LO, HI = 300, 800
KOREAN_SHARE = 0.24

_CHARACTERS = (
    "a retired lighthouse keeper", "a twelve-year-old chess prodigy", "a night-shift nurse",
    "a beekeeper who is secretly afraid of bees", "a street musician with a borrowed guitar",
    "a translator who has stopped speaking", "a robot that repairs antique clocks", "a grandmother learning to code",
    "a ferry captain on her final crossing", "a museum guard who talks to the paintings",
    "a baker who can taste other people's moods", "a cartographer mapping a city that keeps rearranging itself",
    "a young firefighter on the first day of the job", "a detective who only takes cases on Sundays",
    "an elderly tailor with failing eyesight", "a border guard on a forgotten mountain pass",
    "a teenage radio amateur", "a postal worker in a village without street names",
    "a gardener on an orbiting space station", "a librarian in a half-flooded city",
    "a violin teacher with one last pupil", "a retired spy who now runs a second-hand bookshop",
    "a fox who wants to become a mail carrier", "a weather forecaster who is always wrong",
    "a hotel night porter", "a beachcomber who catalogues everything the sea returns",
)
_SETTINGS = (
    "a small island during a week-long storm", "a night train crossing a desert", "a city where it never stops "
    "snowing", "an abandoned amusement park", "a village that appears only one day a year",
    "a research station in Antarctica", "a crowded market on the last evening of the year",
    "an underground city beneath an uninhabitable surface", "a hospital corridor at three in the morning",
    "a seaside town out of season", "a generation ship halfway to its destination", "a bookshop on its last day "
    "of business", "a mountain hut cut off by an avalanche", "a floating city built on old tankers",
    "a small-town radio station during a blackout", "a rooftop garden above a noisy city",
    "a border town where two languages meet", "an orchard in the week of the first frost",
)
_EVENTS = (
    "finds a letter addressed to them, dated fifty years in the future",
    "must decide whether to reveal a secret that would help a stranger",
    "receives a phone call from someone who died years ago", "discovers that the map everyone relies on is wrong",
    "has one day to keep a promise broken long ago", "is asked for help by an old rival",
    "loses the only object that connects them to home", "is asked to teach the one skill they never mastered",
    "notices the same stranger in every old photograph they own", "wakes up speaking a language nobody recognises",
    "is handed a key to a door that does not exist", "hears a song on the radio that only they seem to remember",
    "is left in charge of something far too important", "finds a child's drawing of their own house, drawn "
    "decades ago",
)
_TONES = ("melancholic but hopeful", "dry and witty", "tense and suspenseful", "warm and gentle", "eerie",
          "playful", "bittersweet", "quietly funny", "dreamlike", "matter-of-fact")
_CONSTRAINTS = ("Write in the first person.", "Use the present tense throughout.",
                "End with a twist that is surprising but fair.", "Avoid the word 'suddenly'.",
                "Let the dialogue carry most of the story.", "Use at least three of the five senses.",
                "Begin in the middle of the action.", "Give the story a title.",
                "Keep every sentence short and plain.", "Leave the ending open.")
_OBJECTS = ("a red umbrella", "a stopped wristwatch", "a jar of honey", "a paper crane", "an old brass key",
            "a photograph with a torn corner", "a blue bicycle", "a cassette tape", "a chipped teacup",
            "a compass that points south")
_THEMES = ("why small daily rituals matter", "what a city sounds like at night", "the value of getting lost",
           "learning a difficult skill as an adult", "the objects we cannot throw away",
           "friendship between generations", "the usefulness of boredom", "the first time living alone",
           "what repairing things teaches us", "the kindness of strangers", "leaving a hometown",
           "the sound of rain on different roofs")
_POEM_FORMS = ("free-verse poem", "sonnet", "sequence of five haiku", "ballad in four stanzas", "prose poem",
               "villanelle")
_RECIPIENTS = ("their younger self", "a neighbour they have never met", "the city they are leaving",
               "a teacher from long ago", "the person who will live in their house next")
_ESSAY_MOVES = ("End with a question to the reader.", "Include one short anecdote about a stranger.",
                "Use no more than five paragraphs.", "Quote something a relative once told you.",
                "Avoid the word 'journey'.")
_MORALS = ("patience is often faster than haste", "a promise is only as strong as the one who keeps it",
           "the smallest helper can matter most", "pride makes a poor map", "sharing makes a harvest larger",
           "a borrowed voice never sings for long", "those who listen learn the way home")
_ANIMALS = ("a tortoise and a magpie", "two rival ants", "an old owl and a young fox", "a goat and a heron",
            "a cat and a family of mice", "a sleepless bear and a cricket", "a crow and a snail",
            "a hedgehog and a hare")


class _Blocks:
    """One shuffled deck per building-block pool, shared by all prompts of a run."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        pools = dict(character=_CHARACTERS, setting=_SETTINGS, event=_EVENTS, tone=_TONES,
                     constraint=_CONSTRAINTS, object=_OBJECTS, theme=_THEMES, poem=_POEM_FORMS,
                     recipient=_RECIPIENTS, moral=_MORALS, animals=_ANIMALS, essay_move=_ESSAY_MOVES,
                     ko_character=_KO_CHARACTERS,
                     ko_setting=_KO_SETTINGS, ko_event=_KO_EVENTS, ko_tone=_KO_TONES, ko_theme=_KO_THEMES,
                     ko_constraint=_KO_CONSTRAINTS, ko_opening=_KO_OPENINGS)
        self._decks = {k: deck(rng, v) for k, v in pools.items()}

    def __getattr__(self, name: str) -> str:
        return next(self._decks[name])


def _story(b: _Blocks) -> tuple[str, float]:
    words = b.rng.randrange(400, 701, 50)
    frame = b.rng.randrange(3)
    if frame == 0:
        text = (f"Write a short story of about {words} words in which the main character, {b.character}, "
                f"{b.event}. Set it in {b.setting}. The tone should be {b.tone}.")
    elif frame == 1:
        text = (f"Tell a story set in {b.setting}: {b.character} {b.event}. Keep it {b.tone}, around {words} "
                f"words, and work in {b.object}.")
    else:
        text = (f"Premise: {b.character}, living in {b.setting}, {b.event}. Turn this into a short story of "
                f"roughly {words} words.")
    return f"{text} {b.constraint}", words * 1.35


def _flash(b: _Blocks) -> tuple[str, float]:
    return (f"Write a piece of flash fiction, under 250 words, in which {b.character} {b.event}. Make it "
            f"{b.tone}. {b.constraint}", 380)


def _essay(b: _Blocks) -> tuple[str, float]:
    words = b.rng.randrange(400, 601, 50)
    frame = b.rng.randrange(3)
    if frame == 0:
        text = (f"Write a personal essay of about {words} words on {b.theme}. Ground it in one specific memory "
                f"involving {b.object}, and keep the voice {b.tone}.")
    elif frame == 1:
        text = (f"Write a reflective essay on {b.theme}. Open with a scene in {b.setting} and let {b.object} "
                f"recur as an image. About {words} words, {b.tone} in tone.")
    else:
        text = (f"In roughly {words} words, argue that {b.theme} deserves more attention than it gets, using "
                f"{b.object} as your central example. {b.essay_move}")
    return text, words * 1.4


def _poem(b: _Blocks) -> tuple[str, float]:
    return f"Write a {b.poem} about {b.theme}, set in {b.setting}. The mood should be {b.tone}.", 320


def _letter(b: _Blocks) -> tuple[str, float]:
    return (f"Write a letter from {b.character} to {b.recipient}, explaining why they kept {b.object} all "
            f"these years. About 300 words, {b.tone} in tone.", 480)


def _diary(b: _Blocks) -> tuple[str, float]:
    return (f"Write three diary entries by {b.character}, spread over one week in {b.setting}, during which "
            f"the writer {b.event}. {b.constraint}", 620)


def _dialogue(b: _Blocks) -> tuple[str, float]:
    return (f"Write a scene told almost entirely in dialogue between {b.character} and {b.character}, who meet "
            f"by chance in {b.setting}. One of them has {b.object} that the other needs. Make it {b.tone}.", 520)


def _fable(b: _Blocks) -> tuple[str, float]:
    return (f"Write a fable about {b.animals} who meet in {b.setting}. It should teach that {b.moral}, state that "
            f"moral in its last line, and feel {b.tone}.", 450)


_KO_CHARACTERS = ("은퇴한 등대지기", "새벽 시장의 국밥집 사장님", "처음 자취를 시작한 대학생", "시골 분교의 마지막 선생님",
                  "막차를 모는 버스 기사", "바둑을 좋아하는 할머니", "편의점 야간 아르바이트생", "고양이와 사는 번역가",
                  "제주의 나이 든 해녀", "정년을 앞둔 우체국 집배원", "동네 세탁소 주인", "이삿짐센터 직원")
_KO_SETTINGS = ("눈이 많이 내린 강원도 산골 마을", "비 오는 날의 서울 지하철", "학생이 세 명뿐인 섬마을 학교",
                "재개발을 앞둔 오래된 골목", "한여름 밤의 한강 공원", "설날 아침의 시골집", "바닷가의 작은 기차역",
                "새벽 네 시의 수산 시장", "장마철의 작은 헌책방", "첫눈 오는 날의 대학 캠퍼스", "문을 닫기 직전의 동네 목욕탕",
                "가을 운동회가 열리는 초등학교", "폐업을 앞둔 시골 다방", "불 꺼진 심야의 편의점 앞")
_KO_EVENTS = ("오래전에 부치지 못한 편지를 발견하는", "낯선 사람에게서 뜻밖의 도움을 받는", "마지막 근무 날을 맞이하는",
              "잃어버린 물건을 찾아 온 동네를 헤매는", "수십 년 만에 옛 친구의 연락을 받는",
              "처음으로 누군가에게 진심을 털어놓는", "오래 지켜 온 비밀이 들통나는")
_KO_TONES = ("잔잔하고 따뜻한", "유머러스한", "쓸쓸하지만 희망적인", "긴장감 넘치는", "몽환적인", "담담한", "아련한",
             "경쾌한", "차분하고 사색적인", "장난스러운")
_KO_THEMES = ("혼자 먹는 밥", "오래된 물건", "이사", "첫 출근", "할머니의 부엌", "기다림", "동네 목욕탕",
              "비 오는 날의 냄새", "늦게 배운 취미", "잃어버린 우산", "엄마의 손글씨", "막차", "여름방학",
              "버스 창밖 풍경", "처음 받은 월급", "이름 모를 이웃")
_KO_CONSTRAINTS = ("1인칭 시점으로 써 주세요.", "대화를 적극적으로 활용해 주세요.", "마지막 문장에 작은 반전을 넣어 주세요.",
                   "계절감이 잘 드러나게 써 주세요.", "제목도 함께 붙여 주세요.", "문장은 짧고 담백하게 써 주세요.")
_KO_STORY_FORMS = ("단편 소설로", "동화로", "편지 형식으로", "일기 형식으로")
_KO_OPENINGS = ("구체적인 장면 하나에서 시작하고,", "어린 시절의 기억으로 글을 열고,", "누군가와 나눈 대화 한 토막으로 시작하고,",
                "냄새나 소리 같은 감각적인 묘사로 시작하고,")


def _ko_story(b: _Blocks) -> tuple[str, float]:
    if b.rng.random() < 0.5:
        form = b.rng.choice(_KO_STORY_FORMS)
        length = b.rng.choice(("1,500자 안팎으로", "원고지 10매 정도로", "A4 한 장 정도로"))
        return (f"{josa(b.ko_setting, '을/를')} 배경으로, {josa(b.ko_character, '이/가')} {b.ko_event} 이야기를 "
                f"{form} 써 주세요. 분위기는 {b.ko_tone} 느낌으로, 분량은 {length} 해 주세요. {b.ko_constraint}", 800)
    form = b.rng.choice(("짧은 소설을", "동화를", "콩트를"))
    return (f"{josa(b.ko_character, '이/가')} 주인공인 {form} 써 주세요. 배경은 {b.ko_setting}입니다. 주인공이 "
            f"{b.ko_event} 장면에서 이야기를 시작하고, {b.ko_tone} 분위기를 끝까지 유지해 주세요.", 700)


def _ko_essay(b: _Blocks) -> tuple[str, float]:
    theme, frame = b.ko_theme, b.rng.randrange(3)
    if frame == 0:
        length = b.rng.choice(("1,200자 정도의", "원고지 8매 분량의", "A4 한 장 정도의"))
        return (f"{josa(theme, '을/를')} 주제로 {length} 수필을 써 주세요. {b.ko_opening} {b.ko_tone} 문체를 "
                f"유지해 주세요. {b.ko_constraint}", 700)
    if frame == 1:
        return (f"{theme}에 얽힌 개인적인 기억을 떠올리며 수필 한 편을 써 주세요. {b.ko_opening} 분위기는 "
                f"{b.ko_tone} 느낌이면 좋겠습니다. 분량은 1,000자 안팎으로 하고, {b.ko_constraint}", 650)
    return (f"'{theme}'{particle(theme, '이라는/라는')} 제목으로 짧은 에세이를 써 주세요. {b.ko_opening} "
            f"{b.ko_tone} 분위기를 살리되, 마지막은 독자에게 건네는 질문으로 끝내 주세요. 배경으로 {b.ko_setting}의 "
            f"모습을 한 번 등장시켜 주세요.", 600)


def _ko_poem(b: _Blocks) -> tuple[str, float]:
    frame = b.rng.randrange(3)
    if frame == 0:
        stanzas = b.rng.choice(("세", "네", "다섯"))
        return (f"{b.ko_theme}에 대한 시를 써 주세요. {stanzas} 연으로 구성하고, {b.ko_tone} 분위기를 살려 주세요. "
                f"배경은 {b.ko_setting}입니다.", 400)
    if frame == 1:
        return (f"{b.ko_setting}에서 본 풍경을 담은 짧은 시를 한 편 지어 주세요. 제목은 "
                f"'{b.ko_theme}'{particle(b.ko_theme, '으로/로')} 하고, 각 연은 네 줄 이내로, 전체적으로 "
                f"{b.ko_tone} 느낌이 나게 써 주세요.", 350)
    return (f"{b.ko_character}의 목소리로 {b.ko_theme}에 관한 시를 써 주세요. 반복되는 후렴구를 하나 넣고, "
            f"{b.ko_tone} 어조를 지켜 주세요.", 400)


_EN_FORMS: tuple[Callable[[_Blocks], tuple[str, float]], ...] = (
    _story, _story, _story, _flash, _essay, _essay, _poem, _letter, _diary, _dialogue, _fable)
_KO_FORMS = (_ko_story, _ko_story, _ko_essay, _ko_poem)
_SYSTEMS = ("You are an award-winning fiction writer. Prefer concrete detail to abstraction.",
            "You are a creative writing tutor producing model answers for students.")


def generate(rng: random.Random, n: int) -> list[dict]:
    blocks = _Blocks(rng)
    n_ko = round(n * KOREAN_SHARE)
    forms = [rng.choice(_EN_FORMS) for _ in range(n - n_ko)] + [rng.choice(_KO_FORMS) for _ in range(n_ko)]
    rng.shuffle(forms)
    novelty = Novelty()
    return [_distinct(rng, blocks, form, novelty) for form in forms]


def _distinct(rng: random.Random, blocks: _Blocks, form: Callable, novelty: Novelty, tries: int = 30) -> dict:
    """A prompt of `form` that is no near-duplicate of the earlier ones (redrawing its blocks if needed)."""
    for _ in range(tries):
        text, budget = form(blocks)
        messages = [{"role": "user", "content": text}]
        if rng.random() < 0.15:
            messages.insert(0, {"role": "system", "content": rng.choice(_SYSTEMS)})
        if novelty.accept("\n".join(m["content"] for m in messages)):
            return {"messages": messages, "max_tokens": clamp_round(budget, LO, HI)}
    raise ValueError(f"creative_writing: no new {form.__name__} prompt in {tries} tries; enlarge its block pools")
