"""Speculative verification as pure functions: which draft tokens the target accepts, and the token after.

No model, no engine state: a token tree and the target's logits or probabilities in, tokens out;
the draws are actors/sampling.py's, in a fixed order, so each verifier is the reference oracle of
any optimised path. Greedy: the longest path the target's argmax agrees with. Unseeded sampling:
multi-step speculative sampling (SpecInfer), lossless for every tree whose sampled nodes are
independent draws from the proposal they record. Seeded sampling: the (seed, position) race of
actors/sampling.py, so the output is plain decoding's for that seed whatever was drafted.

Vocabulary (ARCHITECTURE.md §3): **accepted** draft tokens agree with the target; the **recovered**
token is sampled from the residual distribution at the first rejection; the **bonus** token is the
target's extra token when a whole path was accepted. Tokens per step = accepted + 1.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from actors.sampling import native_row, params_probs, sample, sample_at, sample_unseeded, uniform
from actors.sampling_params import SamplingParams
from actors.tree import Proposal, SubsetProposal, TokenTree
from kernels import cpu_native


@dataclass(slots=True)
class VerifyResult:
    accepted_nodes: list[int]  # tree node indices along the accepted path, root excluded
    accepted_tokens: list[int]  # their tokens
    next_token: int  # recovered token at the first rejection, or the bonus token
    bonus: bool  # True when the accepted path ended at a leaf (for a root-only tree: the plain next token)

    @property
    def output_tokens(self) -> list[int]:
        """Tokens this step emits: accepted + [next_token]."""
        return [*self.accepted_tokens, self.next_token]


def verify_greedy(tree: TokenTree, target_argmax: torch.Tensor | Sequence[int]) -> VerifyResult:
    """Greedy verification. target_argmax [n]: the target's greedy token after node i (its logits row).

    A node is accepted when its parent is accepted and its token equals target_argmax[parent]; the
    result is the deepest accepted node's path (first in index order among equals: duplicates).
    """
    argmax = target_argmax.tolist() if isinstance(target_argmax, torch.Tensor) else list(target_argmax)
    if len(argmax) != tree.size:
        raise ValueError(f"target_argmax has {len(argmax)} entries for a tree of {tree.size} nodes")
    accepted = [False] * tree.size
    accepted[0] = True
    depth = [0] * tree.size
    best = 0
    for i in range(1, tree.size):
        parent = tree.parents[i]
        if accepted[parent] and tree.tokens[i] == argmax[parent]:
            accepted[i] = True
            depth[i] = depth[parent] + 1
            if depth[i] > depth[best]:
                best = i
    nodes = tree.path_to(best)[1:]
    has_children = any(tree.parents[j] == best for j in range(best + 1, tree.size))
    return VerifyResult(nodes, [tree.tokens[i] for i in nodes], int(argmax[best]), bonus=not has_children)


def proposal_prob(q: Proposal, token: int) -> float:
    """q(token) of the proposal a draft node's ``token`` was drawn from (1 for a deterministic draft)."""
    if q is None:
        return 1.0
    if isinstance(q, SubsetProposal):
        return q.token_prob
    return float(q[token])


def _residual(p: torch.Tensor, q: Proposal, token: int) -> torch.Tensor:
    """norm(max(0, p - q)) [V]; q None = delta at token. Falls back to p if float error leaves no mass."""
    if q is None:
        r = p.clone()
        r[token] = 0.0
    elif isinstance(q, SubsetProposal):
        r = p.clone()
        r[q.ids] = (p[q.ids] - q.probs.to(p.dtype)).clamp_min_(0.0)
    else:
        r = (p - q).clamp_min(0.0)
    total = r.sum()
    if not total > 0:
        return p
    return r / total


def verify_sampling(
    tree: TokenTree, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> VerifyResult:
    """Multi-step speculative sampling (SpecInfer MSS); target_probs [n, V]: the target's distribution after node i.

    At node u with residual p = target_probs[u], try u's children in order: child c (proposal q_c, a
    delta when None) is accepted with probability min(1, p[tok]/q_c[tok]); on acceptance move to c,
    on rejection p <- norm(max(0, p - q_c)). When no child is accepted, sample the next token from p:
    recovered after rejections, bonus at a leaf. For a chain this is standard rejection sampling.
    Randomness, in order: one uniform per child tried, then one draw for the next token.
    """
    if target_probs.dim() != 2 or target_probs.shape[0] != tree.size:
        raise ValueError(f"target_probs must be [{tree.size}, V] for this tree, got {tuple(target_probs.shape)}")
    return _multi_step(tree, lambda i: _DenseRow(target_probs[i]), generator, target_probs.device)


def verify_sampling_logits(tree: TokenTree, logits: torch.Tensor, params: SamplingParams,
                           generator: torch.Generator | None = None) -> VerifyResult:
    """``verify_sampling(tree, params_probs(logits, params), generator)`` for logits [n, V] of an
    unseeded request, the same draws in the same order, with a node's distribution formed only
    where a child is tried there (the rows the walk visits, not all n), and the next token drawn
    straight from its logits row (``sample_unseeded``) where no child was rejected: at a leaf, and
    for a sequence without a draft (plain decoding). Where the native kernels can read a row
    (``native_row``), a child's p(token) and the residual after one rejected child are read and drawn
    from the logits, with no vocabulary-sized tensor made (a chain's whole verification)."""
    if logits.dim() != 2 or logits.shape[0] != tree.size:
        raise ValueError(f"logits must be [{tree.size}, V] for this tree, got {tuple(logits.shape)}")
    return _multi_step(tree, lambda i: _LogitRow(logits[i], params), generator, logits.device)


class _DenseRow:
    """A node's distribution, or a residual of it, as a tensor p [V]."""

    __slots__ = ("p",)

    def __init__(self, p: torch.Tensor):
        self.p = p

    def at(self, token: int) -> float:
        return float(self.p[token])

    def minus(self, q: Proposal, token: int) -> "_DenseRow":
        """The residual after a draft ``token`` drawn from ``q`` was rejected."""
        return _DenseRow(_residual(self.p, q, token))

    def draw(self, generator: torch.Generator | None) -> int:
        return sample(self.p, generator)


class _LogitRow:
    """A node's distribution given by its logits row [V] under ``params``: formed as a tensor
    (``params_probs``) only where the native kernels cannot read the row."""

    __slots__ = ("logits", "params", "_native", "_dense")

    def __init__(self, logits: torch.Tensor, params: SamplingParams):
        self.logits, self.params = logits, params
        self._native, self._dense = None, None

    @property
    def native(self) -> bool:
        """Whether the kernels read this row (``native_row``), asked once and only where a child is
        tried: a row that is only drawn from (every plain sampled token) leaves it to sample_unseeded."""
        if self._native is None:
            self._native = native_row(self.logits, self.params)
        return self._native

    def dense(self) -> _DenseRow:
        if self._dense is None:
            p = self.params
            self._dense = _DenseRow(params_probs(self.logits, p))
        return self._dense

    def at(self, token: int) -> float:
        if self.native:
            p = cpu_native.softmax_at(self.logits, self.params.temperature, token)
            if p >= 0:
                return p
        return self.dense().at(token)

    def minus(self, q: Proposal, token: int):
        if self.native and not isinstance(q, torch.Tensor):
            return _NativeResidual(self, q, token)
        return self.dense().minus(q, token)

    def draw(self, generator: torch.Generator | None) -> int:
        return sample_unseeded(self.logits, self.params, generator)


class _NativeResidual:
    """norm(max(0, p - q)) of a natively read logits row after one rejected draft (q a delta or a
    SubsetProposal), drawn from the logits; formed as a tensor only where another sibling is tried."""

    __slots__ = ("row", "q", "token")

    def __init__(self, row: _LogitRow, q: Proposal, token: int):
        self.row, self.q, self.token = row, q, token

    def _dense(self) -> _DenseRow:
        return self.row.dense().minus(self.q, self.token)

    def at(self, token: int) -> float:
        return self._dense().at(token)

    def minus(self, q: Proposal, token: int) -> _DenseRow:
        return self._dense().minus(q, token)

    def draw(self, generator: torch.Generator | None) -> int:
        """One uniform: the residual's CDF inverted at it; where float error left the residual no
        mass, p's at the same uniform (``_residual`` falls back to p alike); a row the kernel refuses
        (a NaN or +inf logit) is drawn by the tensor path."""
        logits, t, u = self.row.logits, self.row.params.temperature, uniform(generator, "cpu")
        q = self.q
        ids, probs = (None, None) if q is None else (q.ids.to(torch.int64).contiguous(),
                                                      q.probs.to(torch.float32).contiguous())
        token = cpu_native.sample_residual_logits(logits, t, u, self.token, ids, probs)
        if token == -2:
            token = cpu_native.sample_logits(logits, t, u)
        return token if token >= 0 else self._dense().draw(generator)


def _multi_step(tree: TokenTree, row_of, generator: torch.Generator | None,
                device: torch.device | str) -> VerifyResult:
    """verify_sampling's walk; row_of(i) -> the target's distribution after node i (a _DenseRow,
    _LogitRow: asked for only where a child is tried, or where the next token is drawn)."""
    kids = tree.child_lists()
    node, nodes, row = 0, [], None
    while kids[node]:
        row = row_of(node)
        for child in kids[node]:
            token, q = tree.tokens[child], tree.draft_probs[child]
            if uniform(generator, device) * proposal_prob(q, token) < row.at(token):
                node, row = child, None
                break
            row = row.minus(q, token)
        else:  # no child accepted: the next token is the residual's
            break
        nodes.append(node)
    next_token = (row if row is not None else row_of(node)).draw(generator)
    return VerifyResult(nodes, [tree.tokens[i] for i in nodes], next_token, bonus=not kids[node])


def verify_keyed(tree: TokenTree, target_probs: torch.Tensor, seed: int, root_position: int) -> VerifyResult:
    """Verification for seeded requests; target_probs [n, V]: the target's distribution after node i.

    Walk from the root: the target's token after a node at depth d is sample_at(p, seed,
    root_position + d + 1); move to the first child holding that token, stop when none does (that
    token is then the recovered or bonus token). The draft's q plays no part, so the emitted tokens
    are exactly plain decoding's for this seed; a draft token t is accepted with probability p[t]
    when drafts are deterministic, as in rejection sampling.
    """
    if target_probs.dim() != 2 or target_probs.shape[0] != tree.size:
        raise ValueError(f"target_probs must be [{tree.size}, V] for this tree, got {tuple(target_probs.shape)}")
    kids = tree.child_lists()
    node, nodes = 0, []
    while True:
        token = sample_at(target_probs[node], seed, root_position + len(nodes) + 1)
        node = next((c for c in kids[node] if tree.tokens[c] == token), -1)
        if node < 0:
            break
        nodes.append(node)
    last = nodes[-1] if nodes else 0
    return VerifyResult(nodes, [tree.tokens[i] for i in nodes], token, bonus=not kids[last])


def reference_speculative_sample(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Chain speculative sampling, written to be read: the oracle for verify_sampling and kernels.

    draft_tokens: K proposed tokens; draft_probs [K, V]: the q each was sampled from (None: all
    deterministic, q = one-hot); target_probs [K+1, V]: the target after the root and each draft.
    Returns the emitted tokens: accepted drafts, then the recovered or bonus token.
    """
    out: list[int] = []
    for i, token in enumerate(draft_tokens):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.nn.functional.one_hot(torch.tensor(token, device=p.device), p.shape[-1]).to(p.dtype)
        else:
            q = draft_probs[i]
        u = uniform(generator, p.device)
        if u * float(q[token]) < float(p[token]):  # accept with probability min(1, p/q)
            out.append(token)
            continue
        residual = (p - q).clamp_min(0.0)
        if not residual.sum() > 0:
            residual = p
        out.append(sample(residual / residual.sum(), generator))  # recovered
        return out
    out.append(sample(target_probs[len(draft_tokens)], generator))  # bonus
    return out
