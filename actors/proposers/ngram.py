"""Prompt lookup (n-gram): propose what followed the longest earlier occurrence of the suffix."""
from __future__ import annotations

import numpy as np

from actors.proposers.base import DraftRequest, Proposer
from actors.tree import TokenTree, merge_trees, truncate_tree


class NgramProposer(Proposer):
    """Prompt lookup: find the longest suffix (``n_max`` down to ``n_min`` tokens) that occurred
    earlier in prompt + output and propose what followed it. Width > 1 at depth 1 proposes the
    continuations of several distinct earlier matches (most recent first).

    ``width`` > 1 (``--draft default``'s lookup): a lookup draft asks for ``width`` draft nodes per
    depth, as a dynamic tree does (within its cap), and fills them: each of up to ``width`` distinct
    continuations runs as far as the nodes allow (``max_nodes``, within ``max_depth``), merged and
    cut breadth-first. Where text is copied, ten tokens of one continuation are worth more than the
    head's ten-node tree; the head's nodes stay where lookup finds nothing."""

    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 4, width: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram sizes must satisfy 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        if width < 1:
            raise ValueError(f"ngram width must be >= 1 (draft nodes per depth), got {width}")
        self.n_min, self.n_max, self.width = n_min, n_max, width

    def nodes_per_depth(self, source: str | None) -> int:
        return self.width if source is not None and source.startswith(self.name) else 1

    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        return [self._propose_one(r) for r in reqs]

    def _propose_one(self, req: DraftRequest) -> TokenTree:
        tokens = np.asarray(req.token_ids, dtype=np.int64)
        depth = len(req.expansion)
        width = req.expansion[0] if req.expansion else 0
        if self.width > 1 and depth:  # fill the reserved nodes: farther, and up to `width` candidates
            depth, width = max(depth, min(req.max_nodes, req.depth_limit)), max(width, self.width)
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
