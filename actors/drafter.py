"""Proposers: one interface, batched across sequences; each returns one token tree per request.

- ``ngram``: prompt lookup (longest suffix match in prompt + output), deterministic proposals;
- ``layerskip:N`` and ``draft``: model proposers, see actors/model_drafter.py;
- ``MergedProposer``: several proposers' trees merged into one (SpecInfer's merge);
- ``FallbackProposer``: one proposer's tree where it drafts anything, another's elsewhere.
A proposer that fails raises; the engine then decodes that step without speculation.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from actors.sampling_params import SamplingParams
from actors.tree import TokenTree, merge_trees, truncate_tree


@dataclass(slots=True)
class DraftRequest:
    seq_id: int
    token_ids: list[int]  # prompt + output; the last one is the root of the tree
    expansion: list[int]  # branching per depth; a chain of K is [1] * K
    max_nodes: int  # draft-node slots reserved for this step
    params: SamplingParams
    generator: torch.Generator | None
    block_table: list[int]  # target block table, covering positions up to len(token_ids)-1+max_nodes

    @property
    def root_position(self) -> int:
        return len(self.token_ids) - 1

    @staticmethod
    def make_dummy(token_ids: list[int], k: int = 3) -> "DraftRequest":
        return DraftRequest(0, list(token_ids), [1] * k, k, SamplingParams(), None, [])


class Proposer(ABC):
    name: str = "proposer"

    @abstractmethod
    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        """One tree per request, rooted at the request's last token, at most ``max_nodes`` drafts."""

    def release(self, seq_id: int) -> None:
        """The sequence finished, was aborted or preempted: drop any per-sequence state."""

    def draft_source(self, token_ids: list[int]) -> str | None:
        """What kind of draft this proposer would make after ``token_ids`` (None: no draft at all).
        The adaptive policy keeps acceptance estimates per kind: n-gram lookup after a 4-token
        match is right far more often than after a 1-token one."""
        return self.name

    def nodes_per_depth(self, source: str | None) -> int:
        """Draft nodes per depth of what this proposer drafts from ``source`` (a dynamic tree of
        width w: w; a chain: 1): what the engine reserves and the adaptive policy pays for."""
        return 1

    def sampled_siblings(self, source: str | None) -> int:
        """Distinct draws this proposer makes at the first depth of an unseeded sampled request's
        chain from ``source`` (1: a plain chain). Multi-step speculative sampling tries them in
        turn, so the first position is accepted more often for one more verified node each."""
        return 1


class NgramProposer(Proposer):
    """Prompt lookup: find the longest suffix (``n_max`` down to ``n_min`` tokens) that occurred
    earlier in prompt + output and propose what followed it. Width > 1 at depth 1 proposes the
    continuations of several distinct earlier matches (most recent first)."""

    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram sizes must satisfy 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_min, self.n_max = n_min, n_max

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        return [self._propose_one(r) for r in reqs]

    def _propose_one(self, req: DraftRequest) -> TokenTree:
        tokens = np.asarray(req.token_ids, dtype=np.int64)
        depth = len(req.expansion)
        width = req.expansion[0] if req.expansion else 0
        trees = [TokenTree.chain(int(tokens[-1]), c) for c in self._continuations(tokens, depth, width)]
        if not trees:
            return TokenTree.root(int(tokens[-1]))
        return truncate_tree(merge_trees(trees), req.max_nodes)

    def draft_source(self, token_ids: list[int]) -> str | None:
        n, _ = self._longest_match(np.asarray(token_ids, dtype=np.int64))
        return f"ngram{n}" if n else None

    def _longest_match(self, tokens: np.ndarray) -> tuple[int, np.ndarray]:
        """(n, starts): the longest suffix length in n_min..n_max that occurred earlier with a
        continuation, and where (ascending); (0, []) when none did. One pass over the history finds
        where the last token occurred before; longer suffixes only filter those places."""
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # earlier places of the last token
        found, found_ends = 0, ends[:0]
        for n in range(1, min(self.n_max, len(tokens) - 1) + 1):
            if n > 1:
                ends = ends[ends >= n - 1]
                ends = ends[tokens[ends - (n - 1)] == tokens[-n]]
            if not len(ends):
                break
            if n >= self.n_min:
                found, found_ends = n, ends
        return found, found_ends - (found - 1) if found else found_ends

    def _continuations(self, tokens: np.ndarray, depth: int, width: int) -> list[list[int]]:
        n, starts = self._longest_match(tokens)
        out: list[list[int]] = []
        for s in starts[::-1]:  # most recent match first
            cont = tokens[s + n: s + n + depth].tolist()
            if cont and cont not in out:
                out.append(cont)
            if len(out) >= width:
                break
        return out


class MergedProposer(Proposer):
    """Runs several proposers and merges their trees per request (SpecInfer's merge)."""

    name = "merged"

    def __init__(self, proposers: list[Proposer]):
        self.proposers = proposers

    def nodes_per_depth(self, source: str | None) -> int:
        return max(p.nodes_per_depth(source) for p in self.proposers)

    def sampled_siblings(self, source: str | None) -> int:
        return max(p.sampled_siblings(source) for p in self.proposers)

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        per = [p.propose(reqs) for p in self.proposers]
        return [truncate_tree(merge_trees([t[i] for t in per]), r.max_nodes) for i, r in enumerate(reqs)]

    def release(self, seq_id: int) -> None:
        for p in self.proposers:
            p.release(seq_id)


class FallbackProposer(Proposer):
    """``first``'s tree for each request where it drafted anything, ``second``'s for the others.

    ``--draft default`` is prompt lookup (a suffix of >= 2 tokens recurs: copying, loops, code
    edits) before the EAGLE head: lookup is right more often where it matches, and the head drafts
    where it does not. Features for a feature-reading ``second`` (EAGLE) are forwarded on every
    step, so it stays in sync while ``first`` drafts."""

    name = "fallback"

    def __init__(self, first: Proposer, second: Proposer):
        self.first, self.second = first, second
        self.needs_hidden = getattr(first, "needs_hidden", False) or getattr(second, "needs_hidden", False)
        self.num_first = self.num_second = 0  # requests drafted by each (read by tests)

    def draft_source(self, token_ids: list[int]) -> str | None:
        src = self.first.draft_source(token_ids)
        return src if src is not None else self.second.draft_source(token_ids)

    def nodes_per_depth(self, source: str | None) -> int:
        return max(self.first.nodes_per_depth(source), self.second.nodes_per_depth(source))

    def sampled_siblings(self, source: str | None) -> int:
        return max(self.first.sampled_siblings(source), self.second.sampled_siblings(source))

    def observe(self, seq_id: int, start: int, features) -> None:
        for p in (self.first, self.second):
            if getattr(p, "needs_hidden", False):
                p.observe(seq_id, start, features)

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        trees = self.first.propose(reqs)
        rest = [i for i, t in enumerate(trees) if t.num_draft_tokens == 0]
        if rest:
            for i, tree in zip(rest, self.second.propose([reqs[i] for i in rest])):
                trees[i] = tree
        self.num_first += len(reqs) - len(rest)
        self.num_second += len(rest)
        return trees

    def release(self, seq_id: int) -> None:
        self.first.release(seq_id)
        self.second.release(seq_id)
