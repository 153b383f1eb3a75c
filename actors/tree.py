"""Token trees: speculative proposals arranged as a tree, stored flattened with a parent index.

Node 0 is the **root**, the sequence's last committed token (its logits row gives the target's
distribution for depth 1). Nodes 1.. are **draft tokens**. Nodes are topologically ordered
(``parents[i] < i``), so a single forward pass over ``tokens`` with ``ancestor_mask()`` as the
window mask scores every node, and verification walks the tree in index order.

Each draft node records the proposal it came from (``draft_probs``): the distribution q it was
*sampled* from ([V], or a ``SubsetProposal``: q over part of the vocabulary, as an
EAGLE head's draft vocabulary), or ``None`` for a deterministic proposal (top-k expansion, n-gram lookup, greedy
draft), which verification treats as a delta at the node's token. Multi-step speculative sampling
(``actors.spec_verify.verify_sampling``) is lossless only if every sampled node is an independent draw
from its q, which is why ``merge_trees`` never merges a sampled node into another node.
"""
from __future__ import annotations

import numbers
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

MAX_TREE_NODES = 64  # draft nodes per tree: bounds the verify slots one sequence may reserve


@dataclass(frozen=True, slots=True)
class SubsetProposal:
    """A draft node's proposal q over part of the vocabulary (an EAGLE head's draft vocabulary):
    ``probs`` [S] at the token ids ``ids`` [S] (distinct), 0 elsewhere; ``token_prob`` is q at the
    node's own token. Verification reads q at that token and subtracts q from the target's
    distribution where a draft is rejected, so q never has to be spread over the whole vocabulary
    (a [V] buffer per node and depth)."""
    probs: torch.Tensor  # [S] float
    ids: torch.Tensor  # [S] int64
    token_prob: float

    def __post_init__(self) -> None:
        if self.probs.dim() != 1 or self.ids.shape != self.probs.shape:
            raise ValueError(f"SubsetProposal needs probs [S] and ids [S], got {tuple(self.probs.shape)} and "
                             f"{tuple(self.ids.shape)}")

    def cpu(self) -> "SubsetProposal":
        return SubsetProposal(self.probs.cpu(), self.ids.cpu(), self.token_prob)


Proposal = torch.Tensor | SubsetProposal | None  # [V] q, q over a subset, or None: deterministic (a delta)


@dataclass(slots=True)
class TokenTree:
    tokens: list[int]  # [n] node tokens; tokens[0] = root = last committed token
    parents: list[int]  # [n] parent index; parents[0] == -1, parents[i] < i
    draft_probs: list[Proposal]  # [n] of proposal q: [V] float, a SubsetProposal, or None = deterministic (delta)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0 or len(self.parents) != n or len(self.draft_probs) != n:
            raise ValueError(
                f"TokenTree needs equal, non-empty tokens/parents/draft_probs "
                f"(got {n}, {len(self.parents)}, {len(self.draft_probs)})"
            )
        if self.parents[0] != -1 or self.draft_probs[0] is not None:
            raise ValueError(f"node 0 is the root: parents[0] must be -1 (got {self.parents[0]}) and its draft_probs None")
        for i in range(1, n):
            if not 0 <= self.parents[i] < i:
                raise ValueError(f"parents[{i}] = {self.parents[i]} must be in [0, {i}) (topological order)")

    @classmethod
    def root(cls, token: int) -> TokenTree:
        """A tree holding only the root (the last committed token): nothing proposed yet."""
        return cls([int(token)], [-1], [None])

    @classmethod
    def chain(cls, root: int, tokens: Sequence[int], draft_probs: torch.Tensor | Sequence | None = None) -> TokenTree:
        """A chain root -> tokens[0] -> tokens[1] ...; draft_probs: [K, V] (or K rows / Nones), None = deterministic."""
        if draft_probs is not None and len(draft_probs) != len(tokens):
            raise ValueError(f"chain of {len(tokens)} tokens got {len(draft_probs)} draft_probs rows")
        tree = cls.root(root)
        for i, token in enumerate(tokens):
            tree.add(i, token, None if draft_probs is None else draft_probs[i])
        return tree

    def add(self, parent: int, token: int, q: Proposal = None) -> int:
        """Append a draft node under ``parent`` (q: the distribution it was sampled from, [V] or a
        SubsetProposal); returns its index."""
        if not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} is not a node of this tree (size {len(self.tokens)})")
        if isinstance(q, torch.Tensor) and q.dim() != 1:
            raise ValueError(f"draft distribution q must be a [V] vector, got shape {tuple(q.shape)}")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.draft_probs.append(q)
        return len(self.tokens) - 1

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def num_draft_tokens(self) -> int:
        return len(self.tokens) - 1

    @property
    def depths(self) -> list[int]:
        depths = [0] * len(self.tokens)
        for i in range(1, len(self.tokens)):
            depths[i] = depths[self.parents[i]] + 1
        return depths

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def children(self, i: int) -> list[int]:
        """Children of node i, in index order."""
        return [j for j in range(i + 1, len(self.tokens)) if self.parents[j] == i]

    def child_lists(self) -> list[list[int]]:
        """children(i) for every node at once (one pass)."""
        kids: list[list[int]] = [[] for _ in self.tokens]
        for i in range(1, len(self.tokens)):
            kids[self.parents[i]].append(i)
        return kids

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root to node i, both included."""
        path = []
        while i != -1:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool: mask[i, j] is True iff node j is an ancestor of node i or i itself (True = visible)."""
        n = len(self.tokens)
        mask = np.zeros((n, n), dtype=np.bool_)  # built in numpy: a torch row copy is ~4 us, per node
        for i in range(n):
            if i > 0:
                mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return torch.from_numpy(mask)

    def positions(self, context_len: int) -> list[int]:
        """Position of each node when the root sits at position ``context_len``: context_len + depth."""
        return [context_len + d for d in self.depths]


def parse_expansion(text: str | Sequence[int]) -> list[int]:
    """Parse a SpecInfer expansion config ("1,1,3,1,1" = branching per depth) into a list of ints."""
    if isinstance(text, str):
        body = text.strip().strip("<>[]()").strip()
        if not body:
            raise ValueError(f"expansion config {text!r} is empty; give the branching per depth, e.g. '1,1,3,1,1'")
        values = []
        for part in body.split(","):
            try:
                values.append(int(part.strip()))
            except ValueError:
                raise ValueError(
                    f"expansion config {text!r}: {part.strip()!r} is not an integer; "
                    f"use comma-separated positive integers, e.g. '1,1,3,1,1'"
                ) from None
    else:
        values = list(text)
        if not values:
            raise ValueError(f"expansion config {text!r} is empty; give the branching per depth, e.g. [1, 1, 3, 1, 1]")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"expansion config {text!r}: {v!r} is not an integer")
        values = [int(v) for v in values]
    for depth, v in enumerate(values, start=1):
        if v < 1:
            raise ValueError(f"expansion config {text!r}: branching {v} at depth {depth} must be a positive integer")
    total = expansion_num_nodes(values)
    if total > MAX_TREE_NODES:
        raise ValueError(
            f"expansion config {text!r} yields {total} draft nodes, over the limit of {MAX_TREE_NODES} "
            f"nodes per tree; lower the branching or the depth"
        )
    return values


def expansion_num_nodes(expansion: Sequence[int]) -> int:
    """Draft nodes an expansion can produce: depth d holds prod(expansion[:d]) nodes (slot reservation)."""
    total, width = 0, 1
    for branching in expansion:
        width *= int(branching)
        total += width
    return total


def merge_trees(trees: Sequence[TokenTree]) -> TokenTree:
    """SpecInfer's merge: the union of the trees' root-to-node paths, in input order.

    Children with the same token under the same (merged) parent become one node only when both are
    deterministic (q None); a sampled node always stays its own node so that every sampled proposal
    remains an independent draw (multi-step speculative sampling stays lossless). The q tensors are
    shared, not copied.
    """
    if not trees:
        raise ValueError("merge_trees needs at least one tree")
    root = trees[0].tokens[0]
    for tree in trees:
        if tree.tokens[0] != root:
            raise ValueError(
                f"cannot merge token trees with different roots ({root} and {tree.tokens[0]}); "
                f"every proposal for one sequence must start from its last committed token"
            )
    merged = TokenTree.root(root)
    deterministic: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged deterministic node
    for tree in trees:
        where = [0] * tree.size  # node of `tree` -> node of `merged`
        for i in range(1, tree.size):
            parent, token, q = where[tree.parents[i]], tree.tokens[i], tree.draft_probs[i]
            if q is None and (parent, token) in deterministic:
                where[i] = deterministic[(parent, token)]
                continue
            where[i] = merged.add(parent, token, q)
            if q is None:
                deterministic[(parent, token)] = where[i]
    return merged


def truncate_tree(tree: TokenTree, max_nodes: int) -> TokenTree:
    """Keep the root and at most ``max_nodes`` draft nodes, the first ones in breadth-first order.

    The kept set is prefix-closed (every kept node's parent is kept) and keeps the original relative
    order, so the result is topological. Returns ``tree`` itself when it already fits.
    """
    if max_nodes < 0:
        raise ValueError(f"max_nodes must be >= 0 (got {max_nodes})")
    if tree.num_draft_tokens <= max_nodes:
        return tree
    kids = tree.child_lists()
    keep: list[int] = []
    queue = deque(kids[0])
    while queue and len(keep) < max_nodes:
        i = queue.popleft()
        keep.append(i)
        queue.extend(kids[i])
    out = TokenTree.root(tree.tokens[0])
    where = {0: 0}
    for i in sorted(keep):
        where[i] = out.add(where[tree.parents[i]], tree.tokens[i], tree.draft_probs[i])
    return out
