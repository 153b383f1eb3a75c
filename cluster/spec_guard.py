"""The measured gain of speculation, and the fallback guard that turns speculation off when it
does not pay (the operator's playbook, phase 6, inside the engine).

Measuring. Every verification step is summarised as a ``StepYield``. A *speculative decode step*
is a step without prefill chunks in which at least one sequence verified draft tokens; a *plain
decode step* one without prefill chunks nor drafts. ``SpecGuard`` keeps the seconds of plain
decode steps by their number of sequences B (an EWMA per size, ``actors.cost_table.CostTable``),
and for each speculative decode step of B sequences that produced T tokens in S seconds
(drafting + forward + verification) estimates what plain decoding would have needed for the same
tokens:

    plain-equivalent seconds = T x t_plain(B) / B        (B sequences, one token each per plain step)

The **estimated speedup** of a set of speculative steps is the sum of their plain-equivalent seconds
over the sum of their seconds: 2.0 means they produced their tokens in half the time plain
decoding would have taken; below 1.0 speculation costs time. t_plain(B) is interpolated between
measured sizes only: outside the measured range the step is not estimated (scaling a forward's
time proportionally below the smallest size would make speculation look slower than it is, above
the largest faster), and the guard asks for one plain step (a *baseline probe*) at the end of the
window, as it does when no plain decode step was seen for ``BASELINE_MAX_AGE_WINDOWS`` windows.

Guarding. Speculative decode steps in which the engine chose the drafts (not only requests that fix
their own K) are grouped into windows of ``window_steps``. A window is judged when at least
``MIN_SPEC_SHARE`` of its decoding sequence-steps drafted (the adaptive policy's exploration alone,
1 step in 32, is the policy keeping speculation off, not speculation failing) and some of its
steps were estimated: it fails when its estimated speedup is below ``min_speedup``. ``windows``
consecutive failing windows trip the guard: speculation is off (``allows_speculation`` False) for
``cooldown_s``, then the guard probes: speculation is on again and the first judged window decides,
failing trips it again at once, passing recovers. Trips and recoveries are logged; the engine's
metrics read ``tripped``, ``num_trips`` and ``last_speedup`` at scrape time.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from actors.cost_table import CostTable

log = logging.getLogger("specray.engine")

MIN_SPEC_SHARE = 0.1  # judge a window only when at least this share of its decoding sequence-steps drafted
BASELINE_MAX_AGE_WINDOWS = 16  # a baseline probe when no plain decode step was seen for this many windows


class FallbackGuardConfig(BaseModel):
    """When speculation's measured gain stays below ``min_speedup`` for ``windows`` consecutive
    windows of ``window_steps`` speculative decode steps, speculation is off for ``cooldown_s``
    seconds, then probed again. Windows count steps, not seconds, so that each verdict rests on
    the same amount of evidence at any traffic."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    window_steps: int = Field(64, ge=1, le=100_000)
    windows: int = Field(3, ge=1, le=1000)
    min_speedup: float = Field(1.0, gt=0.0, le=10.0)
    cooldown_s: float = Field(60.0, ge=0.0)


@dataclass(slots=True)
class StepYield:
    """What one verification step's decoding sequences produced."""

    drafted_seqs: int = 0  # decoding sequences that verified at least one draft token
    drafted_tokens: int = 0  # tokens those produced (accepted drafts + 1 each)
    plain_seqs: int = 0  # decoding sequences without drafts (one token each)
    chosen: bool = False  # some drafted sequence's depth was the engine's choice (not a request's fixed K)
    decode_only: bool = False  # no prefill chunk in the step
    seconds: float = 0.0  # drafting + target forward + verification
    plain_equiv_s: float | None = None  # speculative decode steps with a baseline: see the module doc

    @property
    def decode_seqs(self) -> int:
        return self.drafted_seqs + self.plain_seqs

    @property
    def speculative(self) -> bool:
        return self.decode_only and self.drafted_seqs > 0

    @classmethod
    def make_dummy(cls) -> StepYield:
        return cls(drafted_seqs=2, drafted_tokens=5, plain_seqs=1, chosen=True, decode_only=True, seconds=0.02)


@dataclass(slots=True)
class _Window:
    steps: int = 0  # guarded speculative decode steps
    seq_steps: int = 0  # decoding sequence-steps of every decode-only step
    drafted_seq_steps: int = 0
    seconds: float = 0.0  # of the estimated steps
    plain_s: float = 0.0
    unestimated: int = 0


class SpecGuard:
    """The estimate of each step's plain-decoding cost, and the on / off / probing state machine."""

    def __init__(self, config: FallbackGuardConfig | None = None, clock: Callable[[], float] = time.monotonic):
        self.config = config or FallbackGuardConfig()
        self.clock = clock
        self.baseline = CostTable()  # seconds of a plain decode step by its number of sequences
        self.state = "on"  # on | off | probing
        self.off_until = 0.0
        self.failed = 0  # consecutive failing windows
        self.num_trips = 0
        self.last_speedup: float | None = None  # of the last judged window
        self.window = _Window()
        self.windows_since_plain = 0
        self._probe = False

    # ---- what the draft planner asks, once per step -------------------------------------------
    def allows_speculation(self) -> bool:
        """False while tripped; a cool-down that ended turns into probing here."""
        if self.state == "off" and self.clock() >= self.off_until:
            self.state, self.window = "probing", _Window()  # the probe window starts now
            log.info("speculation guard: cool-down over, probing speculation again")
        return self.state != "off"

    def take_probe(self) -> bool:
        """True once when the next step should decode without drafts to measure the baseline."""
        probe, self._probe = self._probe, False
        return probe

    @property
    def tripped(self) -> bool:
        return self.state == "off"

    # ---- what the engine reports, once per verification step ----------------------------------
    def plain_seconds(self, num_seqs: int) -> float | None:
        """Estimated seconds of a plain decode step of ``num_seqs`` sequences, None outside the
        measured sizes."""
        pts = self.baseline.points() if self.baseline.measured else []
        if not pts or not pts[0][0] - 1e-9 <= num_seqs <= pts[-1][0] + 1e-9:
            return None
        return self.baseline(num_seqs)

    def observe(self, y: StepYield) -> StepYield:
        """Account one step; sets ``y.plain_equiv_s`` for a speculative decode step with a baseline."""
        if not y.decode_only or y.decode_seqs == 0:
            return y
        if not y.drafted_seqs:
            self.baseline.observe(y.plain_seqs, y.seconds)
            self.windows_since_plain = 0
        else:
            t = self.plain_seconds(y.decode_seqs)
            y.plain_equiv_s = None if t is None else (y.drafted_tokens + y.plain_seqs) * t / y.decode_seqs
        if self.config.enabled:
            self._account(y)
        return y

    def _account(self, y: StepYield) -> None:
        w = self.window
        w.seq_steps += y.decode_seqs
        w.drafted_seq_steps += y.drafted_seqs
        if not (y.speculative and y.chosen):
            return
        w.steps += 1
        if y.plain_equiv_s is None:
            w.unestimated += 1
        else:
            w.seconds += y.seconds
            w.plain_s += y.plain_equiv_s
        if w.steps >= self.config.window_steps:
            self._close_window()

    def _close_window(self) -> None:
        w, self.window = self.window, _Window()
        self.windows_since_plain += 1
        if w.unestimated or self.windows_since_plain >= BASELINE_MAX_AGE_WINDOWS:
            self._probe = True
        if w.seconds <= 0 or w.drafted_seq_steps < MIN_SPEC_SHARE * w.seq_steps:
            return  # nothing to judge: no estimate, or speculation mostly off already
        self.last_speedup = w.plain_s / w.seconds
        self.judge(self.last_speedup)

    def judge(self, speedup: float) -> None:
        """One window's verdict (public for tests and operators' tools)."""
        c = self.config
        if speedup >= c.min_speedup:
            if self.state == "probing":
                log.warning("speculation guard recovered: estimated speedup %.2f >= %.2f in the probe window; "
                            "speculation stays on", speedup, c.min_speedup)
            self.state, self.failed = "on", 0
            return
        self.failed += 1
        if self.state == "probing":
            self.trip(f"estimated speedup {speedup:.2f} < {c.min_speedup:.2f} in the probe window")
        elif self.failed >= c.windows:
            self.trip(f"estimated speedup {speedup:.2f} < {c.min_speedup:.2f} in {c.windows} consecutive "
                      f"windows of {c.window_steps} speculative steps")

    def trip(self, reason: str = "by hand") -> None:
        """Speculation off for the cool-down."""
        self.state, self.off_until, self.failed = "off", self.clock() + self.config.cooldown_s, 0
        self.num_trips += 1
        log.warning("speculation guard tripped (%s): decoding without speculation for %.0f s", reason,
                    self.config.cooldown_s)
