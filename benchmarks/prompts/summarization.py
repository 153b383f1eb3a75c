"""summarization: summarize a 500-1000 word document (expected output 150-300 tokens).

Documents come from the genre templates (ten genres, an equal share each); the instruction varies in
form (bullets, paragraph, word budget, TL;DR, focus, Korean output), in placement (before or after
the document) and in an optional system message. The document always sits between two lines of
three double quotes, so a reader of the set can recover it exactly."""
from __future__ import annotations

import random

from benchmarks.prompts.documents import render_document
from benchmarks.prompts.genres import GENRES
from benchmarks.prompts.korean import josa
from benchmarks.prompts.text import clamp_round, deck

FENCE = '"""'
LO, HI = 150, 300

_KO_NAMES = {"local news report": "지역 뉴스 기사", "set of meeting minutes": "회의록",
             "internal policy memo": "사내 공지문", "local history essay": "지역사 에세이",
             "quarterly business update": "분기 실적 보고서", "incident postmortem": "장애 사후 분석 보고서",
             "product review": "제품 리뷰", "science news feature": "과학 기사",
             "profile of a person's career": "인물 소개 글", "travel guide": "여행 안내문"}
_FOCUS = ("what was decided and what happens next", "the main problem and how it is being addressed",
          "the key facts and figures", "the arguments on each side", "anything a newcomer would need to know")
_AUDIENCES = ("a busy manager", "a newspaper reader", "a colleague who missed it", "a high-school student",
              "someone deciding whether to read the full text")
_SYSTEMS = ("You write accurate, neutral summaries. Never add information that is not in the text.",
            "You are a careful assistant. Keep summaries faithful to the source and free of speculation.",
            "당신은 문서를 정확하고 간결하게 요약하는 비서입니다. 원문에 없는 내용은 덧붙이지 마세요.")


def _instruction(rng: random.Random, kind: str) -> tuple[str, int]:
    """One summarization instruction and the output budget it implies (tokens)."""
    form = rng.randrange(8)
    if form == 0:
        k = rng.randint(3, 6)
        return f"Summarize the following {kind} in {k} bullet points.", 110 + 30 * k
    if form == 1:
        return f"Write a one-paragraph summary of this {kind} for {rng.choice(_AUDIENCES)}.", 200
    if form == 2:
        w = rng.randrange(90, 201, 10)
        return f"Summarize the main points of the {kind} below in about {w} words.", clamp_round(w * 1.5, LO, HI)
    if form == 3:
        return ("Give a short summary of the text below, then list every number and date it mentions with what "
                "each refers to.", 280)
    if form == 4:
        return f"Summarize this {kind}, focusing on {rng.choice(_FOCUS)}.", 220
    if form == 5:
        return "TL;DR of the following, in no more than three sentences:", 150
    ko = _KO_NAMES[kind]
    if form == 6:
        n = rng.randint(3, 5)
        return f"다음 {josa(ko, '을/를')} 한국어로 {n}문장 이내로 요약해 주세요.", 300
    return f"아래 {ko}의 핵심 내용을 한국어로 세 가지 항목으로 정리하고, 마지막에 한 줄 평을 덧붙여 주세요.", 300


def _prompt(rng: random.Random, instruction: str, document: str) -> str:
    fenced = f"{FENCE}\n{document}\n{FENCE}"
    if rng.random() < 0.5:
        return f"{instruction}\n\n{fenced}"
    label = rng.choice(("Text:", "Document:", "Here is the text.", "Source:"))
    return f"{label}\n{fenced}\n\n{instruction}"


def generate(rng: random.Random, n: int) -> list[dict]:
    """n prompts, cycling through the genres so each gets an equal share (n=100: ten each), and
    dealing each genre's topics so that no topic repeats before all have been used."""
    topics = [deck(rng, range(len(g.topics))) for g in GENRES]
    out = []
    for i in range(n):
        genre = GENRES[i % len(GENRES)]
        document = render_document(rng, genre, next(topics[i % len(GENRES)]))
        instruction, budget = _instruction(rng, genre.name)
        messages = [{"role": "user", "content": _prompt(rng, instruction, document)}]
        if rng.random() < 0.25:
            messages.insert(0, {"role": "system", "content": rng.choice(_SYSTEMS)})
        out.append({"messages": messages, "max_tokens": clamp_round(budget, LO, HI)})
    return out
