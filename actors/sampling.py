"""Sampling as pure functions: the reference oracle of every optimised path.

No model, no engine state: logits or probabilities in, tokens out. Speculative verification, which
draws with these, is actors/spec_verify.py. Two sources of randomness:

- unseeded requests: the ``generator`` passed in, drawn in a fixed order (multi-step speculative
  sampling, the highest acceptance for sampled drafts);
- seeded requests: a race fixed by (seed, position) (``position_race``). The token at position j is
  argmax(p_j / E_j) with E_j ~ Exp(1) drawn from (seed, j) alone, whether it came from plain
  decoding or from verifying a draft, so the output of a seeded request does not depend on the
  proposer, the draft depth, the batch or the load: it is the output plain decoding gives for that
  seed (drafter-invariant speculative decoding, Daliri et al. 2024). Still lossless: E_j is
  independent of everything that chose the prefix before position j.
"""
from __future__ import annotations

import functools

import torch

from actors.sampling_params import SamplingParams
from kernels import cpu_native

_TOP_P_PREFIX = 1024  # top-p first tries this many most-probable tokens before a full sort


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                    min_p: float = 0.0) -> torch.Tensor:
    """logits [..., V] -> probs [..., V]: temperature, then top-k (0 = off) and min-p (0.0 = off),
    then top-p (1.0 = off): vLLM's order.

    Apply the same settings to the target and the draft. top-k keeps every token tied with the k-th
    largest logit; min-p keeps the tokens whose probability is at least min_p times the most
    probable one's (a ratio renormalising does not change: min-p and top-k commute); top-p then keeps
    the smallest most-probable set whose mass, renormalised after them, reaches top_p. The most
    probable token always stays. Float32 at least (float64 stays float64).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to sample (got {temperature}); use greedy() for temperature 0")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, 0 = off (got {top_k})")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], 1.0 = off (got {top_p})")
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], 0.0 = off (got {min_p})")
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    if 0 < top_k < logits.shape[-1]:
        pivot = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < pivot, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if top_p < 1.0:
        sorted_probs, order = _top_p_candidates(probs, top_k, top_p)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the most probable token has mass_before 0: always kept
        drop = torch.ones_like(probs, dtype=torch.bool).scatter(-1, order, drop_sorted)  # outside: dropped
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def params_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probs [..., V] under ``params``' temperature, top-k, top-p and min-p
    (``logits_to_probs``): what every sampled path (target and drafts) draws from."""
    return logits_to_probs(logits, params.temperature, params.top_k, params.top_p, params.min_p)


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
    """One token from logits [V] under ``params``' temperature, top-k, top-p and min-p, drawn from
    ``generator``: ``sample(params_probs(logits, params), generator)`` in distribution, one uniform
    draw. Where only the temperature shapes it (no top-k, top-p or min-p) and the row is fp32 on the CPU,
    the native kernel inverts the CDF in two passes over the logits, making no buffer: ~25 us for
    49,152 logits where the torch path took ~0.3 ms (four vocabulary-sized buffers, cold after the
    forward). Rows with a NaN or +inf logit, or no mass, take the torch path."""
    if native_row(logits, params):
        token = cpu_native.sample_logits(logits, params.temperature, uniform(generator, "cpu"))
        if token >= 0:
            return token
    return sample(params_probs(logits, params), generator)


def native_row(logits: torch.Tensor, params: SamplingParams) -> bool:
    """Whether the native CPU kernels can draw from (and read) softmax(logits / temperature) of this
    row [V] under ``params``: a contiguous fp32 CPU row, only the temperature shaping it (no top-k,
    top-p or min-p), and the kernels built."""
    return (logits.dim() == 1 and logits.dtype is torch.float32 and logits.device.type == "cpu"
            and logits.stride(0) == 1 and logits.shape[0] > 0 and not 0 < params.top_k < logits.shape[0]
            and params.top_p >= 1.0 and params.min_p == 0.0 and cpu_native.load())


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
    return sample_at(params_probs(logits, params), params.seed, position)
