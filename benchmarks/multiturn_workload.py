"""The multi-turn workload of ``benchmarks.multiturn``: conversations about a long document, as token ids.

Each conversation opens with a document of ``lo``..``hi`` tokens (composed offline from the genre
templates of the prompt set, ``benchmarks/prompts/documents.py``, seeded) and a question; every
later turn's prompt is the previous turn's prompt + its answer + a new question, token for token,
so that the previous turn's KV is a prefix of the next prompt (a prefix hit when it is still in
the device pool or a KV tier). With a chat template the pieces around the answer and the question
are the template's own (an end-of-turn marker, the user's turn, the assistant's generation
prompt); without one (the byte-level tiny test model) a plain ``Question: ... Answer:`` frame.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

QUESTIONS = (
    "Summarize the document in two sentences.",
    "Who are the people named in the document, and what does each of them do?",
    "Which numbers does the document give, and what do they measure?",
    "What is the main problem or risk the document describes?",
    "What happens next, according to the document?",
    "Write a one-line headline for the document.",
    "Which decision in the document matters most, and why?",
    "List three facts from the document that a newcomer should know.",
    "What does the document leave unclear?",
    "Explain the document to a twelve-year-old in three sentences.",
    "Which places are mentioned in the document?",
    "What would you ask the author of the document?",
)
_DOC, _ANSWER, _QUESTION = "\x00DOC\x00", "\x00ANSWER\x00", "\x00QUESTION\x00"


@dataclass(frozen=True)
class Conversation:
    """Token ids of one conversation's fixed parts; the answers come from the engine."""
    first: list[int]  # turn 1's prompt: the document and the first question, framed
    followups: list[list[int]]  # turns 2..T: what follows the previous answer (end of turn, question, framing)


def next_prompt(prev_prompt: list[int], answer: list[int], followup: list[int], eos_ids: set[int]) -> list[int]:
    """Turn t's prompt: turn t-1's prompt + its answer (without a trailing end-of-sequence token,
    which the chat frame's end-of-turn marker replaces) + the follow-up."""
    while answer and answer[-1] in eos_ids:
        answer = answer[:-1]
    return prev_prompt + answer + followup


class ChatFrame:
    """The text around a conversation's pieces: the tokenizer's chat template when it has one."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        if self.chat:
            first = self._render([{"role": "user", "content": _DOC}])
            self.head, self.tail = first.split(_DOC)
            turns = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _ANSWER},
                     {"role": "user", "content": _QUESTION}]
            after = self._render(turns).split(_ANSWER)[1]
            self.mid, self.tail2 = after.split(_QUESTION)
        else:
            self.head, self.tail, self.mid, self.tail2 = "", "\nAnswer:", "\n\nQuestion: ", "\nAnswer:"

    def _render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def first(self, doc_ids: list[int], question: str) -> list[int]:
        q = f"\n\n{question}" if self.chat else f"\n\nQuestion: {question}"  # in the user's turn, after the document
        return self.encode(self.head) + doc_ids + self.encode(q + self.tail)

    def followup(self, question: str) -> list[int]:
        return self.encode(self.mid + question + self.tail2)


def document_ids(tokenizer, rng: random.Random, num_tokens: int, genre_offset: int) -> list[int]:
    """``num_tokens`` token ids of documents of the prompt set's genres (several joined when one is
    shorter), cut at that length."""
    from benchmarks.prompts.documents import render_document
    from benchmarks.prompts.genres import GENRES

    ids: list[int] = []
    k = genre_offset
    while len(ids) < num_tokens:
        genre = GENRES[k % len(GENRES)]
        text = render_document(rng, genre, rng.randrange(len(genre.topics)))
        ids += list(tokenizer.encode(("\n\n" if ids else "") + text, add_special_tokens=False))
        k += 1
    return ids[:num_tokens]


def build_workload(tokenizer, num_conversations: int, turns: int, doc_tokens: tuple[int, int],
                   seed: int) -> list[Conversation]:
    """Deterministic for a seed: conversation c's document length is drawn from ``doc_tokens``
    (inclusive), its genres start at c, its questions at a seeded offset."""
    frame = ChatFrame(tokenizer)
    convs = []
    for c in range(num_conversations):
        rng = random.Random(f"multiturn:{seed}:{c}")
        doc = document_ids(tokenizer, rng, rng.randint(*doc_tokens), c)
        q0 = rng.randrange(len(QUESTIONS))
        qs = [QUESTIONS[(q0 + t) % len(QUESTIONS)] for t in range(turns)]
        convs.append(Conversation(frame.first(doc, qs[0]), [frame.followup(q) for q in qs[1:]]))
    return convs


def max_context(conv: Conversation, max_tokens: int) -> int:
    """Tokens the conversation's last turn can reach: every prompt piece plus every answer."""
    return len(conv.first) + sum(len(f) for f in conv.followups) + max_tokens * (len(conv.followups) + 1)


def blocks(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def multiturn_sizes(convs: list[Conversation], max_tokens: int, concurrency: int, block_size: int) -> dict:
    """Blocks of the whole workload (every conversation's last turn, answered) and of a device pool
    with room for ``concurrency`` of the longest conversations (so that no request is preempted)."""
    need = [blocks(max_context(c, max_tokens), block_size) for c in convs]
    return {"workload_blocks": sum(need), "longest_blocks": max(need),
            "device_blocks": concurrency * max(need) + 8, "host_blocks": sum(need) + 16}


def preemption_sizes(prompts: list[list[int]], max_tokens: int, block_size: int) -> dict:
    """A device pool of about a third of what every request needs at its end (at least two of the
    longest), and a host tier holding all of it (so that every preemption can swap)."""
    need = [blocks(len(p) + max_tokens, block_size) for p in prompts]
    return {"workload_blocks": sum(need), "device_blocks": max(2 * max(need) + 8, sum(need) // 3),
            "host_blocks": sum(need) + 16}


def parse_range(flag: str, text: str) -> tuple[int, int]:
    """'1000,2000' -> (1000, 2000); '300' -> (300, 300)."""
    try:
        parts = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected N or LO,HI (integers), e.g. 1000,2000") from None
    lo, hi = (parts[0], parts[0]) if len(parts) == 1 else tuple(parts) if len(parts) == 2 else (0, -1)
    if len(parts) > 2 or lo < 16 or hi < lo:
        raise ValueError(f"{flag} {text!r}: expected N or LO,HI with 16 <= LO <= HI")
    return lo, hi
