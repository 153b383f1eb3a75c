"""Dynamic draft trees (EAGLE-2): grow the tree where the draft is confident, keep the best nodes.

A chain spends every draft token on the draft's first choice; when that choice is wrong at depth 1
the rest is wasted. A dynamic tree of width w keeps, per depth, the w candidates with the highest
path score (the draft's log-probability of the whole path from the root) and expands each of
them by its w best next tokens; at the end the ``n`` best-scoring candidates of every depth become
the token tree that the target verifies in one pass. A path score is the draft's own estimate of
the chance that the target accepts the whole path, so the kept nodes are those most likely to be
accepted. Scores only fall along a path (log-probabilities are <= 0), so ranked by score (ties
to the shallower node) a parent always comes before its children.

A floor on the path score (``min_score``, the log of the least path probability worth a verified
row) keeps only candidates whose expected acceptance pays for their row: the tree is as large as
the draft is confident, and growth stops at the first depth where no candidate reaches it. Each
verified row costs ~10% of a decode step on the 2-core CPU, and the head's path probability is a
fair estimate of acceptance there (2026-11-29, held-out greedy: nodes the head gave 0.8-1.0 were
accepted 94% of the time, those under 0.05, 2%). Filtering by score keeps the set parent-closed.

Pure bookkeeping on Python floats; the proposer (actors/proposers/eagle.py) runs the draft model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from actors.tree import TokenTree


@dataclass(slots=True)
class DraftPool:
    """Candidates of one sequence's tree: index i has a token, a parent (-1 = the root), a path
    score and a depth (1 = a child of the root)."""

    root_token: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)

    def add(self, parent: int, token: int, logp: float) -> int:
        """A candidate under ``parent`` (-1: the root) whose own log-probability is ``logp``."""
        base, depth = (0.0, 1) if parent < 0 else (self.scores[parent], self.depths[parent] + 1)
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.scores.append(base + float(logp))
        self.depths.append(depth)
        return len(self.tokens) - 1

    def _rank(self, i: int) -> tuple[float, int, int]:
        return -self.scores[i], self.depths[i], i

    def best(self, among: list[int], w: int, min_score: float = float("-inf")) -> list[int]:
        """The ``w`` best candidates of ``among`` by path score whose score reaches ``min_score``
        (the next frontier), best first."""
        return [i for i in sorted(among, key=self._rank)[:w] if self.scores[i] >= min_score]

    def to_tree(self, n: int, min_score: float = float("-inf")) -> TokenTree:
        """The token tree of the ``n`` best candidates whose path score reaches ``min_score`` and
        whose ancestors are all kept (by the rank order a parent always comes first), nodes ordered
        by depth so that parents come first; only the root when no candidate reaches it."""
        keep: list[int] = []
        kept = {-1}
        for i in sorted(range(len(self.tokens)), key=self._rank):
            if len(keep) >= n or self.scores[i] < min_score:
                break
            if self.parents[i] in kept:
                keep.append(i)
                kept.add(i)
        tree = TokenTree.root(self.root_token)
        node_of = {-1: 0}
        for i in sorted(keep, key=lambda i: (self.depths[i], self._rank(i))):
            node_of[i] = tree.add(node_of[self.parents[i]], self.tokens[i])
        return tree
