"""Sampling and speculative verification as pure functions: the reference oracle of every optimised path.

No model, no engine state: tensors and token trees in, tokens out. Two sources of randomness:

- unseeded requests: the ``generator`` passed in, drawn in a fixed order (multi-step speculative
  sampling, the highest acceptance for sampled drafts);
- seeded requests: a race fixed by (seed, position) (``position_race``). The token at position j is
  argmax(p_j / E_j) with E_j ~ Exp(1) drawn from (seed, j) alone, whether it came from plain
  decoding or from verifying a draft, so the output of a seeded request does not depend on the
  proposer, the draft depth, the batch or the load: it is the output plain decoding gives for that
  seed (drafter-invariant speculative decoding, Daliri et al. 2024). Still lossless: E_j is
  independent of everything that chose the prefix before position j.

Vocabulary (ARCHITECTURE.md §3): **accepted** draft tokens agree with the target; the **recovered**
token is sampled from the residual distribution at the first rejection; the **bonus** token is the
target's extra token when a whole path was accepted. Tokens per step = accepted + 1.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from actors.sampling_params import SamplingParams
from actors.tree import Proposal, SubsetProposal, TokenTree
from kernels import cpu_native

_TOP_P_PREFIX = 1024  # top-p first tries this many most-probable tokens before a full sort


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> probs [..., V]: temperature, then top-k (0 = off), then top-p (1.0 = off).

    Apply the same settings to the target and the draft. top-k keeps every token tied with the k-th
    largest logit; top-p keeps the smallest most-probable set whose mass reaches top_p.
    Float32 at least (float64 stays float64).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to sample (got {temperature}); use greedy() for temperature 0")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, 0 = off (got {top_k})")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], 1.0 = off (got {top_p})")
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    if 0 < top_k < logits.shape[-1]:
        pivot = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < pivot, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = _top_p_candidates(probs, top_k, top_p)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the most probable token has mass_before 0: always kept
        drop = torch.ones_like(probs, dtype=torch.bool).scatter(-1, order, drop_sorted)  # outside: dropped
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _top_p_candidates(probs: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [..., V] -> (values, indices) [..., m], descending, covering every token top-p may keep.

    A full sort of V = 49k is slow on CPU; top-p can only keep tokens inside any most-probable
    prefix whose mass already reaches top_p, so a partial top-k suffices when one exists.
    """
    vocab = probs.shape[-1]
    if 0 < top_k < vocab:  # only the top-k survivors (k, plus ties) have mass
        return probs.topk(int((probs > 0).sum(dim=-1).max()), dim=-1)
    if vocab > _TOP_P_PREFIX:
        values, indices = probs.topk(_TOP_P_PREFIX, dim=-1)
        if bool((values.cumsum(dim=-1)[..., -1] >= top_p).all()):  # the same sums a full sort would see
            return values, indices
    return probs.sort(dim=-1, descending=True)


def uniform(generator: torch.Generator | None, device: torch.device | str) -> float:
    """One U[0, 1) draw (float64) from ``generator``, whichever device the caller's tensors are on."""
    return float(torch.rand((), dtype=torch.float64, generator=generator, device=_rng_device(generator, device)))


def _rng_device(generator: torch.Generator | None, device: torch.device | str) -> torch.device | str:
    """Where draws from ``generator`` are made: its own device (the global generator: ``device``)."""
    return generator.device if generator is not None else device


def exponential_draws(n: int, generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """[n] float64 Exp(1) draws from ``generator`` (on its device, then moved to ``device``):
    -log(1 - U), U ~ U[0, 1). Four times faster on CPU than ``exponential_`` (0.19 vs 0.72 ms for
    49k): the races of seeded positions and of distinct draft draws."""
    u = torch.rand(n, dtype=torch.float64, generator=generator, device=_rng_device(generator, device))
    return u.neg_().log1p_().neg_().to(device)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token from probs [V] (need not be normalised) by inverting its CDF: one uniform draw
    u, the first token whose cumulative mass (float64) exceeds u times the total. A token without
    mass never covers any u. No device sync until the final int; on CPU 0.07 ms for 49k tokens,
    against 0.57 ms for the exponential race (V draws), which a sampled request paid once per token."""
    if probs.dim() != 1:
        raise ValueError(f"sample() takes one [V] distribution, got shape {tuple(probs.shape)}")
    cdf = probs.double().cumsum(0)
    u = torch.rand(1, dtype=torch.float64, generator=generator, device=_rng_device(generator, probs.device))
    u = u.to(cdf.device) * cdf[-1]
    token = int(torch.searchsorted(cdf, u, right=True))
    if token < probs.shape[0] and probs[token] > 0:
        return token
    return _last_with_mass(probs)  # u * total rounded up to the total, or no mass at all


def sample_unseeded(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """One token from logits [V] under ``params``' temperature, top-k and top-p, drawn from
    ``generator``: ``sample(logits_to_probs(logits, ...), generator)`` in distribution, one uniform
    draw. Where only the temperature shapes it (no top-k or top-p) and the row is fp32 on the CPU,
    the native kernel inverts the CDF in two passes over the logits, making no buffer: ~25 us for
    49,152 logits where the torch path took ~0.3 ms (four vocabulary-sized buffers, cold after the
    forward). Rows with a NaN or +inf logit, or no mass, take the torch path."""
    if (logits.dim() == 1 and logits.dtype is torch.float32 and logits.device.type == "cpu"
            and logits.stride(0) == 1 and logits.shape[0] > 0 and not 0 < params.top_k < logits.shape[0]
            and params.top_p >= 1.0 and cpu_native.load()):
        token = cpu_native.sample_logits(logits, params.temperature, uniform(generator, "cpu"))
        if token >= 0:
            return token
    return sample(logits_to_probs(logits, params.temperature, params.top_k, params.top_p), generator)


def _last_with_mass(probs: torch.Tensor) -> int:
    """probs [V] -> the highest index with positive mass (where a draw rounded to the total lands)."""
    support = (probs > 0).nonzero()
    if support.numel() == 0:
        raise ValueError("cannot sample from a distribution with no positive mass")
    return int(support[-1])


def sample_distinct(q: torch.Tensor, width: int, generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [S] -> (picks [w] int64, proposals [w, S]): up to ``width`` distinct tokens drawn one after
    another without replacement (w = fewer if q has fewer tokens with mass), and the distribution
    each was drawn from: proposals[k] is q without picks[:k], renormalised.

    Siblings for multi-step speculative sampling (recursive rejection sampling, Jeon et al. 2024):
    a rejected draft x has p(x) < q(x), so the residual gives it no mass and a second draw of it
    could never be accepted; drawing distinct siblings, each verified against the proposal it came
    from, stays lossless and wastes no node. One exponential race over q (Gumbel-top-k): its top-w
    are such a sequence of draws."""
    if q.dim() != 1:
        raise ValueError(f"sample_distinct() takes one [S] distribution, got shape {tuple(q.shape)}")
    w = min(width, int((q > 0).sum()))
    if w < 1:
        raise ValueError("cannot sample from a distribution with no positive mass")
    picks = race_scores(q, exponential_draws(q.shape[0], generator, q.device)).topk(w).indices  # [w]
    proposals = q.unsqueeze(0).repeat(w, 1)  # [w, S]
    for k in range(1, w):
        proposals[k:, picks[k - 1]] = 0.0
    return picks, proposals / proposals.sum(dim=-1, keepdim=True)


def race_scores(probs: torch.Tensor, race: torch.Tensor) -> torch.Tensor:
    """probs [V], race [V] Exp(1) draws -> scores [V] float64: p_i / E_i, -1 where p_i = 0.
    The highest score is the race's winner, the next ones its runners-up."""
    return torch.where(probs > 0, probs.double() / race, -1.0)


def _race_winner(probs: torch.Tensor, race: torch.Tensor) -> int:
    """probs [V], race [V] Exp(1) draws -> argmax(p_i / E_i) over tokens with mass."""
    token = int(race_scores(probs, race).argmax())
    if not probs[token] > 0:
        raise ValueError("cannot sample from a distribution with no positive mass")
    return token


_MASK64 = (1 << 64) - 1
RACE_CACHE_SIZE = 128  # races kept (0.4 MB each at 49k tokens): a few steps of drafts at low concurrency


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_race(seed: int, position: int, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[vocab] float64 Exp(1) draws fixed by (seed, position) alone: the noise of token position
    ``position`` (its index in prompt + output) of a seeded request. Read-only: the tensor is
    shared through a small cache, since drafting (every candidate row of a depth) and verifying
    (the accepted path) ask for the same positions again, step after step."""
    key = _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return _race_for_key(key, vocab, str(torch.device(device)))


@functools.lru_cache(maxsize=RACE_CACHE_SIZE)
def _race_for_key(key: int, vocab: int, device: str) -> torch.Tensor:
    """[vocab] float64 Exp(1) draws of a generator seeded with ``key`` (0.2 ms for 49k on the 2-core CPU)."""
    return exponential_draws(vocab, torch.Generator(device=device).manual_seed(key), device)


def race_top(probs: torch.Tensor, seed: int, position: int, width: int) -> list[int]:
    """probs [V] a draft's q -> the ``width`` likeliest winners of (seed, position)'s race under q:
    the best guesses of the token a seeded target draws there (fewer if q has fewer tokens)."""
    race = position_race(seed, position, probs.shape[-1], probs.device)
    return race_scores(probs, race).topk(min(width, int((probs > 0).sum()))).indices.tolist()


def race_top_among(q: torch.Tensor, support: torch.Tensor, vocab: int, seed: int, position: int,
                   width: int) -> torch.Tensor:
    """``race_top`` for a q [S] given over the token ids ``support`` [S] of a ``vocab``-token
    vocabulary (a draft head's reduced vocabulary; q is 0 elsewhere) -> the picks as indices into
    q [<= width] int64 (their tokens are ``support[i]``): the same tokens, without building q over
    the whole vocabulary (6x less work for an 8,192-token draft vocabulary)."""
    race = position_race(seed, position, vocab, q.device)[support]  # [S]
    return race_scores(q, race).topk(min(width, int((q > 0).sum()))).indices


def sample_at(probs: torch.Tensor, seed: int, position: int) -> int:
    """Draw the token at ``position`` from probs [V] with the (seed, position) race: the same token
    every time the same distribution is seen at that position, however it got there."""
    if probs.dim() != 1:
        raise ValueError(f"sample_at() takes one [V] distribution, got shape {tuple(probs.shape)}")
    return _race_winner(probs, position_race(seed, position, probs.shape[0], probs.device))


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> token ids [...] (int64): the most likely token (``argmax(-1)``; fp32 rows on
    CPU in the native kernel, ~10x faster: a verified tree's 11 rows took 0.39 ms)."""
    if logits.dim() == 2 and logits.dtype is torch.float32 and logits.device.type == "cpu" \
            and logits.shape[1] > 0 and logits.stride(1) == 1 and cpu_native.load():
        return cpu_native.argmax_rows(logits)
    return logits.argmax(dim=-1)


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                position: int | None = None) -> int:
    """Plain (non-speculative) next token from logits [V]: greedy when temperature == 0; with
    ``params.seed`` set, the (seed, position) race for the token at ``position``."""
    if params.greedy:
        return int(greedy(logits))
    if params.seed is None:
        return sample_unseeded(logits, params, generator)
    if position is None:
        raise ValueError("a seeded request samples by position: pass the position of the token drawn")
    return sample_at(logits_to_probs(logits, params.temperature, params.top_k, params.top_p), params.seed, position)


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
    return _multi_step(tree, target_probs.__getitem__, lambda i: sample(target_probs[i], generator), generator,
                       target_probs.device)


def verify_sampling_logits(tree: TokenTree, logits: torch.Tensor, params: SamplingParams,
                           generator: torch.Generator | None = None) -> VerifyResult:
    """``verify_sampling(tree, logits_to_probs(logits, ...), generator)`` for logits [n, V] of an
    unseeded request, the same draws in the same order, with a node's distribution formed only
    where a child is tried there (the rows the walk visits, not all n), and the next token drawn
    straight from its logits row (``sample_unseeded``) where no child was rejected: at a leaf, and
    for a sequence without a draft (plain decoding)."""
    if logits.dim() != 2 or logits.shape[0] != tree.size:
        raise ValueError(f"logits must be [{tree.size}, V] for this tree, got {tuple(logits.shape)}")
    t, k, top_p = params.temperature, params.top_k, params.top_p
    return _multi_step(tree, lambda i: logits_to_probs(logits[i], t, k, top_p),
                       lambda i: sample_unseeded(logits[i], params, generator), generator, logits.device)


def _multi_step(tree: TokenTree, probs_of, draw_at, generator: torch.Generator | None,
                device: torch.device | str) -> VerifyResult:
    """verify_sampling's walk; probs_of(i) -> the target's distribution [V] after node i (asked for
    only where a child is tried), draw_at(i) -> a token drawn from it (one draw, where no child was
    rejected)."""
    kids = tree.child_lists()
    node, nodes, residual = 0, [], None
    while kids[node]:
        p = probs_of(node)
        for child in kids[node]:
            token, q = tree.tokens[child], tree.draft_probs[child]
            if uniform(generator, device) * proposal_prob(q, token) < float(p[token]):
                node, residual = child, None
                break
            p = residual = _residual(p, q, token)
        else:  # no child accepted
            break
        nodes.append(node)
    next_token = draw_at(node) if residual is None else sample(residual, generator)
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
