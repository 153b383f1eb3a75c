"""Composes long English documents (500-1000 words) from genre templates, for summarization inputs
and translation sources.

A genre is a set of topics, a facts function (invented names and numbers drawn from the seeded rng)
and ordered sections; a section is a list of sentence slots, and a slot offers one to three phrasings.
Two documents of one genre therefore differ in topic, facts, phrasing and which optional sections
they keep, which keeps their word 5-gram overlap low while each still reads as one coherent text."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from benchmarks.prompts.text import word_count

MIN_WORDS, MAX_WORDS = 500, 1000


@dataclass(frozen=True)
class Section:
    slots: tuple  # each a phrasing or a tuple of alternative phrasings
    optional: bool = False


@dataclass(frozen=True)
class Genre:
    name: str  # what the instruction calls the text: "news report", "incident postmortem", ...
    title: str
    topics: tuple[dict, ...]  # what a document is about: the project, product, study, place, ...
    facts: Callable[[random.Random, dict], dict]  # topic + invented names and numbers
    sections: tuple[Section, ...]


def S(*slots, optional: bool = False) -> Section:
    return Section(tuple(slots), optional)


def _sentence(rng: random.Random, slot) -> str:
    return slot if isinstance(slot, str) else rng.choice(slot)


def render_section(rng: random.Random, section: Section, facts: dict) -> str:
    return " ".join(_sentence(rng, s) for s in section.slots).format_map(facts)


def render_document(rng: random.Random, genre: Genre, topic: int) -> str:
    """Title plus paragraphs about genre.topics[topic]; optional sections are kept at random, then
    added or dropped until the whole is within [MIN_WORDS, MAX_WORDS]. Raises when a genre cannot
    reach that range."""
    facts = genre.facts(rng, genre.topics[topic])
    title = genre.title.format_map(facts)
    paras = [render_section(rng, s, facts) for s in genre.sections]
    optional = [i for i, s in enumerate(genre.sections) if s.optional]
    keep = {i for i in range(len(paras)) if i not in optional or rng.random() < 0.6}
    order = optional[:]
    rng.shuffle(order)

    def length() -> int:
        return word_count(title) + sum(word_count(paras[i]) for i in keep)

    for i in order:
        if length() >= MIN_WORDS + 40:
            break
        keep.add(i)
    for i in order:
        if length() <= MAX_WORDS - 40:
            break
        keep.discard(i)
    n = length()
    if not MIN_WORDS <= n <= MAX_WORDS:
        raise ValueError(f"genre {genre.name!r} rendered {n} words; templates must allow "
                         f"{MIN_WORDS}-{MAX_WORDS}")
    body = "\n\n".join(paras[i] for i in sorted(keep))
    return f"{title}\n\n{body}"


def render_paragraph(rng: random.Random, genre: Genre, index: int) -> str:
    """One section of a genre with fresh facts and a random topic: a paragraph to translate."""
    return render_section(rng, genre.sections[index], genre.facts(rng, rng.choice(genre.topics)))
