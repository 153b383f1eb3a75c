"""A toy language model and a chi-square harness for the losslessness of speculative sampling.

Shared by tests/test_sampling_lossless.py (multi-step speculative sampling) and
tests/test_seeded_sampling.py (the seeded, position-keyed race).
"""
from __future__ import annotations

import bisect
import random
from collections.abc import Callable

import numpy as np
import torch
from scipy.stats import chisquare

from actors.sampling import logits_to_probs, sample_distinct
from actors.tree import SubsetProposal, TokenTree, merge_trees

#
# A tiny fixed "language model": the next-token distribution is a seeded random table over
# (position of the last token, last token). Target and draft are two such tables. A generation
# loop runs speculative steps (propose a tree from the draft, score it with the target, verify)
# until it has N_TOKENS tokens; the empirical joint distribution of those tokens must equal the
# target's exact autoregressive distribution.

V, MAX_POS, N_TOKENS, ROOT = 6, 12, 3, 0
TRIALS = 20_000
P_PASS, P_FAIL = 1e-3, 1e-6


class ToyLM:
    def __init__(self, seed: int, sharpness: float, top_k: int = 0, min_p: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(MAX_POS, V, V, generator=g, dtype=torch.float64) * sharpness
        self.probs = logits_to_probs(logits, 1.0, top_k=top_k, min_p=min_p)  # [pos, last token, next token]
        self._cum = self.probs.cumsum(-1).tolist()
        self._order = self.probs.argsort(dim=-1, descending=True, stable=True).tolist()
        self._rows = [list(self.probs[pos].unbind()) for pos in range(MAX_POS)]

    def dist(self, pos: int, last: int) -> torch.Tensor:  # [V]
        return self._rows[pos][last]

    def draw(self, pos: int, last: int, rng: random.Random) -> int:
        cum = self._cum[pos][last]
        return min(bisect.bisect_right(cum, rng.random() * cum[-1]), V - 1)

    def top(self, pos: int, last: int, k: int) -> list[int]:
        return self._order[pos][last][:k]

    def rows(self, tree: TokenTree, root_pos: int) -> torch.Tensor:  # [n, V] target after each node
        return self.probs[torch.tensor(tree.positions(root_pos)), torch.tensor(tree.tokens)]

    def exact(self) -> np.ndarray:  # [V] * N_TOKENS joint distribution of the first tokens
        joint = self.probs[0, ROOT].numpy()
        for pos in range(1, N_TOKENS):
            joint = joint[..., None] * self.probs[pos].numpy().reshape((1,) * (pos - 1) + (V, V))
        return joint


TARGET = ToyLM(seed=11, sharpness=1.3)
TARGET_TOPK = ToyLM(seed=11, sharpness=1.3, top_k=4)  # zeros in p
TARGET_MINP = ToyLM(seed=11, sharpness=1.3, min_p=0.1)  # TARGET under min-p 0.1
DRAFT = ToyLM(seed=23, sharpness=1.0)
DRAFT_TOPK = ToyLM(seed=29, sharpness=1.6, top_k=3)  # zeros in q
SHARP_DRAFT = ToyLM(seed=23, sharpness=2.0)  # peaked q: i.i.d. siblings often repeat a token


# Proposers: (context position of the root, root token, rng) -> TokenTree
def _grow_sampled(tree: TokenTree, node: int, pos: int, length: int, draft: ToyLM, rng: random.Random) -> None:
    for depth in range(length):
        q = draft.dist(pos + depth, tree.tokens[node])
        node = tree.add(node, draft.draw(pos + depth, tree.tokens[node], rng), q)


def _grow_greedy(tree: TokenTree, node: int, pos: int, length: int, draft: ToyLM) -> None:
    for depth in range(length):
        node = tree.add(node, draft.top(pos + depth, tree.tokens[node], 1)[0])


def sampled_tree(width: int, depth: int, draft: ToyLM = DRAFT) -> Callable:
    """width i.i.d. children sampled from q at depth 1, each continued by a sampled chain."""

    def propose(pos: int, root: int, rng: random.Random) -> TokenTree:
        tree = TokenTree.root(root)
        for _ in range(width):
            child = tree.add(0, draft.draw(pos, root, rng), draft.dist(pos, root))
            _grow_sampled(tree, child, pos + 1, depth - 1, draft, rng)
        return tree

    return propose


def distinct_tree(width: int, depth: int, draft: ToyLM = SHARP_DRAFT, renormalise: bool = True) -> Callable:
    """``width`` distinct children drawn one after another from q without replacement
    (``sample_distinct``: each recorded with the q it was drawn from), the first continued by a
    sampled chain: the EAGLE proposer's shape for unseeded sampled requests. renormalise=False
    records the plain q for every sibling: what a proposer must NOT do."""

    def propose(pos: int, root: int, rng: random.Random) -> TokenTree:
        tree = TokenTree.root(root)
        q = draft.dist(pos, root)
        picks, proposals = sample_distinct(q, width, torch.Generator().manual_seed(rng.getrandbits(63)))
        kids = [tree.add(0, int(t), r if renormalise else q) for t, r in zip(picks, proposals)]
        _grow_sampled(tree, kids[0], pos + 1, depth - 1, draft, rng)
        return tree

    return propose


SUBSET = torch.tensor([4, 1, 3, 0])  # a draft vocabulary: part of the V tokens, in its own order


def subset_tree(width: int, depth: int, draft: ToyLM = SHARP_DRAFT, ids: torch.Tensor = SUBSET) -> Callable:
    """``distinct_tree`` from a draft whose q lives on the tokens ``ids`` only (an EAGLE head's
    draft vocabulary), each sibling recorded as a SubsetProposal (q over ``ids``, never spread over
    the V tokens), the first continued by a chain of single draws recorded the same way."""

    def propose(pos: int, root: int, rng: random.Random) -> TokenTree:
        tree, node = TokenTree.root(root), 0
        for d in range(depth):
            q = draft.dist(pos + d, tree.tokens[node])[ids]
            q = q / q.sum()
            if d == 0:
                rows, proposals = sample_distinct(q, width, torch.Generator().manual_seed(rng.getrandbits(63)))
            else:  # one draw
                rows, proposals = [min(bisect.bisect_right(q.cumsum(0).tolist(), rng.random()), len(ids) - 1)], [q]
            kids = [tree.add(node, int(ids[r]), SubsetProposal(pr, ids, float(pr[r])))
                    for r, pr in zip(rows, proposals)]
            node = kids[0]
        return tree

    return propose


def deterministic_tree(width: int, depth: int, draft: ToyLM = DRAFT) -> Callable:
    """The draft's top-`width` tokens at depth 1 (deltas), each continued greedily."""

    def propose(pos: int, root: int, rng: random.Random) -> TokenTree:
        tree = TokenTree.root(root)
        for token in draft.top(pos, root, width):
            _grow_greedy(tree, tree.add(0, token), pos + 1, depth - 1, draft)
        return tree

    return propose


def merged_tree(pos: int, root: int, rng: random.Random) -> TokenTree:
    """Three proposers merged: deterministic top-2 tree, sampled width-2 tree, a greedy chain that
    duplicates the first deterministic branch (deduplicated) and a sampled chain from a second draft."""
    trees = [
        deterministic_tree(2, 2)(pos, root, rng),
        sampled_tree(2, 3)(pos, root, rng),
        deterministic_tree(1, 3)(pos, root, rng),
        sampled_tree(1, 2, DRAFT_TOPK)(pos, root, rng),
    ]
    return merge_trees(trees)


def merged_sampled_children(fold_duplicates: bool = False) -> Callable:
    """Three proposers each sampling one child from the same peaked q, merged. With
    fold_duplicates, sampled siblings with equal tokens become one node: what merge_trees must NOT do."""

    def propose(pos: int, root: int, rng: random.Random) -> TokenTree:
        chains = [sampled_tree(1, 1, SHARP_DRAFT)(pos, root, rng) for _ in range(3)]
        if not fold_duplicates:
            return merge_trees(chains)
        tree = TokenTree.root(root)
        for token, q in {c.tokens[1]: c.draft_probs[1] for c in chains}.items():
            tree.add(0, token, q)
        return tree

    return propose


def generate(propose: Callable, verify: Callable, target: ToyLM, seed: int, trials: int) -> np.ndarray:
    """[trials, N_TOKENS] tokens from the speculative loop; one draft rng and one verify generator."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    out = np.empty((trials, N_TOKENS), dtype=np.int64)
    for t in range(trials):
        seq = [ROOT]
        while len(seq) <= N_TOKENS:
            tree = propose(len(seq) - 1, seq[-1], rng)
            seq += verify(tree, target.rows(tree, len(seq) - 1), gen).output_tokens
        out[t] = seq[1 : N_TOKENS + 1]
    return out


def chi_square_pvalues(samples: np.ndarray, target: ToyLM) -> dict[str, float]:
    """p-values of the first token, the first 2 (joint) and the first 3 (joint) against the exact target."""
    exact = target.exact()
    pvalues = {}
    for m, name in ((1, "first"), (2, "joint2"), (3, "joint3")):
        probs = exact.sum(axis=tuple(range(m, N_TOKENS))).ravel()
        cells = np.ravel_multi_index(samples[:, :m].T, (V,) * m)
        observed = np.bincount(cells, minlength=V**m).astype(float)
        expected = probs * len(samples)
        assert observed[probs == 0].sum() == 0, "a token sequence the target cannot produce was generated"
        small = (expected < 5) & (probs > 0)  # pool sparse cells so the chi-square approximation holds
        big = expected >= 5
        obs = np.append(observed[big], observed[small].sum())
        exp = np.append(expected[big], expected[small].sum())
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        pvalues[name] = float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
    return pvalues
