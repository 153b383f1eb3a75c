"""Seconds as a function of a size, learned from measurements: what the adaptive speculation policy
(actors/spec_policy.py) knows a forward of n tokens or a draft round over b sequences costs, and the
fallback guard (cluster/spec_guard.py) a plain step. An EWMA per size, made non-decreasing in the
size and interpolated; pure arithmetic on floats."""
from __future__ import annotations

import math


def monotone_fit(values: list[float], weights: list[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators). Time
    does not go down when a forward carries more tokens, so a dip between two measured sizes is
    noise; left in, it would make the tokens past the dip look free."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    return [b[0] for b in blocks for _ in range(b[2])]


def size_bucket(n: int) -> int:
    """Sizes measured apart: exact up to 32, one bucket per power of two above."""
    return n if n <= 32 else 32 + math.ceil(math.log2(n / 32))


class CostTable:
    """Seconds as a function of a size (tokens in a forward, sequences in a draft round): an EWMA
    per size (exact up to 32, power-of-two buckets above), made non-decreasing in the size
    (``monotone_fit``, sizes weighted by their observations) and linearly interpolated between
    measured sizes; below the smallest, proportional to the size; above the largest, the slope of
    the last two points, capped at proportional growth (with one point: proportional). Unmeasured
    sizes thus never look cheaper than proportional scaling suggests: speculation has to be
    measured to pay before it is chosen."""

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self.buckets: dict[int, tuple[float, float]] = {}  # key -> (mean size, mean seconds)
        self.counts: dict[int, int] = {}  # key -> observations (the fit's weight, capped at 1/alpha)
        self._fitted: list[tuple[float, float]] | None = None

    def observe(self, n: int, seconds: float) -> None:
        if n <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        k = size_bucket(n)
        if k in self.buckets:
            m_n, m_s = self.buckets[k]
            self.buckets[k] = (m_n + self.alpha * (n - m_n), m_s + self.alpha * (seconds - m_s))
        else:
            self.buckets[k] = (float(n), float(seconds))
        self.counts[k] = self.counts.get(k, 0) + 1
        self._fitted = None

    def points(self) -> list[tuple[float, float]]:
        """(size, seconds) of the measured sizes, ascending and non-decreasing in seconds."""
        if self._fitted is None:
            keys = sorted(self.buckets, key=lambda k: self.buckets[k][0])
            fit = monotone_fit([self.buckets[k][1] for k in keys],
                               [min(self.counts[k], 1 / self.alpha) for k in keys])
            self._fitted = [(self.buckets[k][0], s) for k, s in zip(keys, fit)]
        return self._fitted

    @property
    def measured(self) -> bool:
        return bool(self.buckets)

    def __call__(self, n: int) -> float:
        if not self.buckets:
            return 0.0
        pts = self.points()
        if n <= pts[0][0]:
            return pts[0][1] * n / pts[0][0]
        for (n0, s0), (n1, s1) in zip(pts, pts[1:]):
            if n <= n1:
                return s0 + (s1 - s0) * (n - n0) / max(n1 - n0, 1e-9)
        n_last, s_last = pts[-1]
        slope = s_last / n_last
        if len(pts) > 1:
            n_prev, s_prev = pts[-2]
            slope = min(slope, max(0.0, (s_last - s_prev) / max(n_last - n_prev, 1e-9)))
        return s_last + slope * (n - n_last)
