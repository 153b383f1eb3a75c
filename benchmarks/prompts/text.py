"""Small text helpers and name pools shared by the category generators.

Every name here is invented on purpose: prompts about fictional towns, people and firms cannot be
answered from memorised facts, and they never collide with real documents a draft model was
trained on."""
from __future__ import annotations

import random
import re
from typing import Iterator, Sequence, TypeVar

T = TypeVar("T")

FIRST_NAMES = (
    "Amara", "Bastian", "Chiara", "Dmitri", "Elif", "Farida", "Gareth", "Hana", "Ibrahim", "Jonas",
    "Keiko", "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Samir", "Tamsin",
    "Umar", "Vera", "Wendell", "Ximena", "Yusuf", "Zofia", "Anneke", "Bruno", "Celeste", "Desmond",
    "Esther", "Felix", "Greta", "Hector", "Ingrid", "Jalen", "Kofi", "Leona", "Marcus", "Noor",
)
LAST_NAMES = (
    "Okafor", "Lindqvist", "Marchetti", "Halvorsen", "Delacroix", "Brennan", "Castellanos", "Nakamura",
    "Abernathy", "Szabo", "Whitlock", "Petrosyan", "Oyelaran", "Fairbanks", "Moreau", "Kowalczyk",
    "Thorne", "Bautista", "Eriksen", "Quarshie", "Holloway", "Varga", "Mensah", "Ashdown", "Ferreira",
    "Lachance", "Dunmore", "Kimura", "Rautio", "Sandoval", "Pemberton", "Achterberg", "Galloway", "Iyer",
)
_TOWN_HEADS = ("Ash", "Elm", "Stone", "Red", "Fair", "Oak", "Mill", "Wex", "Hart", "Bram", "Cold",
               "Glen", "Thorn", "Wil", "Hazel", "Kings", "Marl", "Pen", "Rook", "Sel", "Brack", "Lark")
_TOWN_TAILS = ("ford", "brook", "field", "haven", "mere", "wick", "ton", "bury", "dale", "port",
               "combe", "stead", "moor", "holt")
_FIRM_HEADS = ("Northwind", "Bluefern", "Corvid", "Halcyon", "Ironbark", "Larchmont", "Meridian",
               "Quillon", "Saltmarsh", "Tessellate", "Umbra", "Verdant", "Wayfarer", "Zephyrine",
               "Amberline", "Copperleaf", "Driftwood", "Foxglove", "Granite Peak", "Juniper")
_FIRM_TAILS = ("Systems", "Labs", "Logistics", "Foods", "Analytics", "Robotics", "Health", "Energy",
               "Software", "Materials", "Networks", "Outfitters")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")


_WORD = re.compile(r"\w+")


def word_count(text: str) -> int:
    """Whitespace-separated words: the unit of the summarization input bounds (500-1000 words)."""
    return len(text.split())


def people(rng: random.Random, n: int) -> list[str]:
    """n different full names with n different surnames, so that later surname-only mentions are
    unambiguous."""
    firsts = rng.sample(FIRST_NAMES, n)
    lasts = rng.sample(LAST_NAMES, n)
    return [f"{f} {s}" for f, s in zip(firsts, lasts)]


def town(rng: random.Random) -> str:
    return rng.choice(_TOWN_HEADS) + rng.choice(_TOWN_TAILS)


def towns(rng: random.Random, n: int) -> list[str]:
    """n different town names."""
    heads = rng.sample(_TOWN_HEADS, n)
    return [h + rng.choice(_TOWN_TAILS) for h in heads]


def firm(rng: random.Random, tail: str | None = None) -> str:
    """An invented company name; pass tail ('Foods', 'Robotics', ...) to match the firm's trade."""
    return f"{rng.choice(_FIRM_HEADS)} {tail or rng.choice(_FIRM_TAILS)}"


def surname(full_name: str) -> str:
    return full_name.split()[-1]


def clamp_round(value: float, lo: int, hi: int, step: int = 10) -> int:
    """Round to a multiple of step and clamp into [lo, hi] (max_tokens must stay in its range)."""
    return max(lo, min(hi, int(round(value / step)) * step))


def deck(rng: random.Random, pool: Sequence[T]) -> Iterator[T]:
    """Deal items of pool in shuffled order, reshuffling only once all have been dealt, so that
    building blocks repeat as little as the pool size allows."""
    while True:
        cards = list(pool)
        rng.shuffle(cards)
        yield from cards


def apportion(weights: Sequence[float], n: int) -> list[int]:
    """Split n into integer shares proportional to weights (largest remainder; ties go to the earlier
    weight), so shares always sum to n and no share is off by more than one from its exact quota."""
    total = sum(weights)
    quotas = [w * n / total for w in weights]
    shares = [int(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in by_remainder[: n - sum(shares)]:
        shares[i] += 1
    return shares


def shingles(text: str, n: int = 5) -> frozenset:
    """Word n-grams of the lower-cased text (Hangul counts as word characters)."""
    tokens = _WORD.findall(text.lower())
    return frozenset(tuple(tokens[i:i + n]) for i in range(max(1, len(tokens) - n + 1)))


class Novelty:
    """Accepts a prompt only when its word 5-gram Jaccard similarity to every prompt accepted so far
    stays below `limit`: a guard for generators whose short templates could, by chance, deal the
    same blocks twice."""

    def __init__(self, limit: float = 0.4):
        self.limit = limit
        self.seen: list[frozenset] = []

    def accept(self, text: str) -> bool:
        new = shingles(text)
        if any(len(new & old) / len(new | old) >= self.limit for old in self.seen):
            return False
        self.seen.append(new)
        return True
