"""Structured output: a request's answer held to a grammar (any JSON object, a JSON schema, a regular
expression, a Lark grammar, or one of a list of strings) by masking the target's logits.

llguidance compiles the grammar against the tokenizer once per request and answers, from the state a
request's committed tokens left, which tokens may come next: a bitmask over the vocabulary. A row of
logits is masked by setting every forbidden token to -inf before sampling or verification (after the
penalties of actors/logits_processing.py, before temperature, top-k and top-p).

Under speculation a token tree holds several continuations at once, so each node's row is masked
with the state its own path leaves (``GrammarState.forbidden`` walks the tree, consuming and rolling back
tokens); verification then compares the drafts against the constrained distributions, so the output
is exactly constrained plain decoding's: its argmax (greedy), its distribution (sampling) or its race
(seeded). A draft token the grammar forbids has probability 0 and is rejected like any other token the
target would not produce. Committed tokens advance the state (``GrammarState.advance``); when the
grammar is complete only EOS is allowed, so the answer ends there.

Two of llguidance's behaviours shape the walk: a matcher that consumes a forbidden token enters an
error state it never leaves (so a node's token is checked against its parent's mask first), and
rolling back across a consumed EOS loses count, and a matcher that stopped (nothing can extend the
text) refuses EOS: EOS is never consumed (an EOS node's row, and a row that allows nothing, stays
unmasked: the answer ends at EOS and never reads it).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Collection, Sequence
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

Kind = Literal["json_object", "json_schema", "regex", "grammar", "choice", "tool_calls"]
# JSON as json.dumps writes it: ", " and ": " between items and keys, no other whitespace (flexible
# whitespace lets a small model pad an answer with newlines until max_tokens)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept per engine (requests with the same schema copy one)


class StructuredOutput(BaseModel):
    """What the answer must match. ``kind``: ``json_object`` (any JSON object; ``value`` unused),
    ``json_schema`` (``value``: the schema, an object, kept as compact JSON text in its key order), ``regex``
    (Rust regex syntax), ``grammar`` (Lark syntax, llguidance's dialect), ``choice`` (``value``: the
    allowed strings), ``tool_calls`` (a Lark grammar of calls of a request's tools: a grammar,
    counted apart in the metrics)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Kind
    value: str | tuple[str, ...] = ""

    @field_validator("value", mode="before")
    @classmethod
    def _value(cls, v: Any, info) -> Any:
        kind = info.data.get("kind")
        if kind == "json_schema":
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except json.JSONDecodeError as e:
                    raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(v, dict):
                raise ValueError(f"a JSON schema must be an object, got {type(v).__name__}")
            return json.dumps(v, separators=(",", ":"))  # the schema's key order is the answer's
        if kind == "choice":
            if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
                raise ValueError("choice needs a non-empty list of strings")
            if not all(isinstance(c, str) and c for c in v):
                raise ValueError(f"choice: every choice must be a non-empty string, got {list(v)!r}")
            return tuple(v)
        if kind in ("regex", "grammar", "tool_calls") and (not isinstance(v, str) or not v):
            raise ValueError(f"{kind} needs a non-empty string")
        return v

    @model_validator(mode="after")
    def _json_object_has_no_value(self) -> StructuredOutput:
        if self.kind == "json_object" and self.value:
            raise ValueError("json_object takes no value (use json_schema for a schema)")
        return self

    def grammar(self) -> str:
        """llguidance's grammar text for this constraint."""
        from llguidance import LLMatcher

        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(self.value, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.value)
        if self.kind == "choice":  # Lark string literals take JSON's escapes
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.value))
        return LLMatcher.grammar_from_lark(self.value)


def forbidden_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bitmask [n, ceil(V / 32)] int32 (bit j of word w set: token 32 w + j may come next) ->
    forbidden [n, V] bool. Little-endian words: token t is bit t % 8 of byte t // 8 (numpy unpacks
    that in ~20 us for 49k tokens, 3x faster than shifting in torch)."""
    flipped = np.invert(bitmask.cpu().numpy()).view(np.uint8)  # [n, 4 W]
    return torch.from_numpy(np.unpackbits(flipped, axis=-1, bitorder="little")[:, :vocab]).view(torch.bool)


def mask_logits(logits: torch.Tensor, forbidden: torch.Tensor) -> torch.Tensor:
    """logits [n, V], forbidden [n, V] bool -> logits with every forbidden token at -inf (in place)."""
    return logits.masked_fill_(forbidden.to(logits.device), float("-inf"))


class GrammarCompiler:
    """One engine's grammars: the tokenizer as llguidance reads it (built on first use, ~0.5 s) and
    the compiled grammars of recent requests (each request gets a copy)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Collection[int]):
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, frozenset(eos_ids)
        self._ll_tokenizer = None

    def warm_up(self) -> None:
        """Build the tokenizer and llguidance's caches for it (~2 s on the CPU machine, once per
        process): a server does this before taking traffic, or its first structured request would
        hold the engine's step loop (every request) that long."""
        self.state(StructuredOutput(kind="json_object")).forbidden([-1], [0])

    def state(self, constraint: StructuredOutput) -> GrammarState:
        """A fresh state for one request (ValueError with llguidance's message for a bad grammar)."""
        return GrammarState(self._compiled(constraint.grammar()).deep_copy(), self.vocab_size, self.eos_ids)

    @functools.lru_cache(maxsize=GRAMMAR_CACHE_SIZE)  # noqa: B019 (one compiler per engine, kept for its life)
    def _compiled(self, grammar: str):
        from llguidance import LLMatcher

        matcher = LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error().strip())
        return matcher

    @property
    def ll_tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance.hf

            self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size,
                                                              eos_token=sorted(self.eos_ids))
        return self._ll_tokenizer


class GrammarState:
    """One request's place in its grammar: what may come next after its committed tokens, and after
    each node of a token tree drafted from there."""

    def __init__(self, matcher, vocab_size: int, eos_ids: Collection[int]):
        self.matcher, self.vocab_size, self.eos_ids = matcher, vocab_size, frozenset(eos_ids)
        self.words = (vocab_size + 31) // 32

    def forbidden(self, parents: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """forbidden [n, V] bool for the n nodes of a token tree (``parents[i] < i``; node 0 the root,
        already committed): row i forbids what may not follow the path root -> i. Rows of nodes the
        grammar cannot reach (a forbidden token on the path), of EOS nodes and of states that allow
        nothing forbid nothing: the answer never reads them."""
        n, m = len(parents), self.matcher
        bitmask = torch.full((n, self.words), -1, dtype=torch.int32)
        live = [False] * n
        paths: list[list[int]] = [[] for _ in range(n)]
        consumed: list[int] = []  # the nodes whose tokens the matcher holds, root first
        self._fill(bitmask, 0)
        live[0] = True
        for i in range(1, n):
            p, tok = parents[i], int(tokens[i])
            paths[i] = paths[p] + [i]
            if not live[p] or tok in self.eos_ids or not _bit(bitmask[p], tok):
                continue
            common = 0
            while common < min(len(consumed), len(paths[p])) and consumed[common] == paths[p][common]:
                common += 1
            if len(consumed) > common:
                m.rollback(len(consumed) - common)
                del consumed[common:]
            for node in paths[i][common:]:
                if not m.consume_token(int(tokens[node])):
                    raise RuntimeError(f"structured output: the grammar refused token {tokens[node]} it allowed: "
                                       f"{m.get_error()}")
                consumed.append(node)
            live[i] = self._fill(bitmask, i)
        if consumed:
            m.rollback(len(consumed))
        return forbidden_tokens(bitmask, self.vocab_size)

    def _fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Row ``row`` of ``bitmask`` from the matcher's state; a state that allows nothing leaves the
        row allowing everything. Returns whether the row is the grammar's."""
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, row)
        if not bool(bitmask[row].any()):
            bitmask[row] = -1
            return False
        return True

    def forced(self) -> list[int]:
        """The tokens the grammar forces next, whatever the model would say (a schema's next key,
        the rest of an enum value), as the tokenizer splits them; [] when it leaves a choice."""
        return [t for t in self.matcher.compute_ff_tokens() if t not in self.eos_ids]

    def advance(self, tokens: Sequence[int]) -> str | None:
        """Commit ``tokens`` (the answer's next tokens, in order). Returns None, or the error when
        the grammar refuses one (never for tokens sampled from masked rows). EOS, which ends the
        answer, is not consumed: a complete grammar's matcher may already have stopped."""
        tokens = [int(t) for t in tokens if int(t) not in self.eos_ids]
        if tokens and not self.matcher.consume_tokens(tokens):
            return f"structured output: the grammar refused token {list(tokens)}: {self.matcher.get_error().strip()}"
        return None


def _bit(words: torch.Tensor, token: int) -> bool:
    """Whether ``token``'s bit is set in one row of a bitmask [W] int32."""
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)
