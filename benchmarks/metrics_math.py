"""The arithmetic behind every benchmark figure, as pure functions (unit-tested on their own).

Definitions follow ARCHITECTURE.md section 3 and vLLM, so figures compare with theirs:
TPOT = (E2E - TTFT) / (output tokens - 1); acceptance rate = accepted / draft tokens; mean
accepted length = 1 + accepted / drafts; per-position acceptance = accepted at depth i / drafts.
"""
from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """q-th percentile (0..100) with linear interpolation between order statistics (numpy's
    default), so p50 of an even count is the mean of the middle two; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} must be within [0, 100]")
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def tpot_s(e2e_s: float, ttft_s: float, output_tokens: int) -> float | None:
    """Time per output token after the first; undefined (None) for fewer than two tokens."""
    if output_tokens < 2:
        return None
    return (e2e_s - ttft_s) / (output_tokens - 1)


def decode_tokens_per_s(requests: Sequence[tuple[float, float, int]]) -> float | None:
    """Tokens after the first / seconds after the first, summed over (e2e_s, ttft_s, output_tokens)
    requests of two or more tokens: the decode phase's speed, without prefill (TTFT), which
    speculation does not change. None when no request decoded past its first token."""
    ok = [(e2e - ttft, n - 1) for e2e, ttft, n in requests if n >= 2]
    secs = sum(t for t, _ in ok)
    return sum(n for _, n in ok) / secs if ok and secs > 0 else None


def speedup(value: float | None, baseline: float | None) -> float | None:
    """value / baseline for rates (tokens/s); None when either side is missing or zero."""
    if not value or not baseline:
        return None
    return value / baseline


def acceptance_rate(accepted: int, draft_tokens: int) -> float | None:
    return accepted / draft_tokens if draft_tokens else None


def mean_accepted_length(accepted: int, drafts: int) -> float | None:
    return 1.0 + accepted / drafts if drafts else None


def per_position_acceptance(accepted_per_pos: Sequence[int], drafts: int) -> list[float]:
    """Share of verification steps whose draft was accepted up to depth i (falls with i)."""
    return [a / drafts for a in accepted_per_pos] if drafts else []


def add_positions(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """Element-wise sum of per-position counts of different lengths."""
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
