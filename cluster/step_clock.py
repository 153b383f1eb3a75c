"""Host seconds per phase of the engine's steps (issue 26: what the host spends per step around
the device's work), summed since the engine started. Always on: a clock read per phase.

Phases: ``schedule`` (the scheduler and the KV plan), ``draft`` (proposing), ``plan`` (the
forward's chunks), ``forward`` (enqueueing the target forward; on CPU also running it), ``wait``
(the host blocked reading the step's results back: on CUDA the device's remaining work),
``verify`` (acceptance, commit, KV moves), ``bookkeeping`` (what drafting learns and the metrics),
``emit`` (detokenizing and the outputs). ``benchmarks.host_profile`` reports them per step."""
from __future__ import annotations

from time import perf_counter

PHASES = ("schedule", "draft", "plan", "forward", "wait", "verify", "bookkeeping", "emit")


class StepClock:
    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.steps = 0  # steps that ran a forward
        self._t = 0.0

    def start(self) -> None:
        self._t = perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the last start/lap to ``phase`` and start the next lap."""
        t = perf_counter()
        self.seconds[phase] += t - self._t
        self._t = t

    def snapshot(self) -> dict:
        return {"steps": self.steps, **self.seconds}
