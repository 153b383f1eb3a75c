"""Draft/verify overlap: several micro-batches in flight within one engine step.

The scheduled batch is split into micro-batches A, B, ... Every micro-batch's draft is sent to the
drafter workers at once (a worker drafts A, then B); the driver waits for A's trees, verifies A
(one target forward) while the workers draft B, then waits for B's trees and verifies B:

    one micro-batch (no overlap):  D(A+B) + V(A+B)
    two micro-batches:             D(A) + max(V(A), D(B)) + V(B)

B's draft time hides behind A's verification. The price is a second target forward per step: on a
memory-bound device a forward reads all weights however few tokens it carries, so V(A) + V(B) can
approach 2 V(A+B) at small batch. ``run_in_flight`` is the generic core (any submit/verify
callables); ``OverlapStepper`` runs the verification of an ``LLMEngine`` step that way with a
proposer that drafts in other processes (``supports_async``: RemoteProposer), through the engine's
public pieces: its ``DraftPlanner`` (requests, accept, failed) and ``verify_part`` (with
``num_micro_batches=1`` it is the engine's own step, timed the same way); scheduling, the adaptive
policy's depth choice and emission are the engine's own.

On the 2-core CPU it has not paid (benchmarks/ARCHIVE.md: 0.83x with a draft model in a drafter actor, both
models memory-bound on one memory bus); it is off by default and can pay where draft and target
sit on separate devices.

Across steps the same idea goes further (draft A for step t+1 while verifying B of step t); that
needs the scheduler to plan micro-batches separately and belongs in the engine's step loop.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class MicroBatchTiming:
    draft_wait_s: float  # driver blocked waiting for this micro-batch's trees (exposed draft time)
    verify_s: float  # target forward + verification of this micro-batch
    draft_compute_s: float  # the workers' own drafting time for it (0 when nothing was drafted)


@dataclass(slots=True)
class StepTiming:
    step_s: float
    micro: list[MicroBatchTiming] = field(default_factory=list)
    completed: bool = True  # False: a verify stopped the step (the later micro-batches did not run)

    @property
    def draft_compute_s(self) -> float:
        return sum(m.draft_compute_s for m in self.micro)

    @property
    def draft_wait_s(self) -> float:
        return sum(m.draft_wait_s for m in self.micro)

    @property
    def verify_s(self) -> float:
        return sum(m.verify_s for m in self.micro)


def run_in_flight(micro_batches: list, submit: Callable[[Any], Any],
                  verify: Callable[[Any, Any, Exception | None, float], bool]) -> StepTiming:
    """submit(mb) -> a pending draft (``.result()`` -> trees, ``.compute_s``) or None (nothing to draft);
    verify(mb, trees or None, the draft's exception or None, seconds waited for the trees) runs the
    target on mb and returns False to stop the step. All drafts are submitted first, then each
    micro-batch waits for its own trees and is verified while the later ones are still drafting.
    A draft that fails gives verify no trees (that micro-batch decodes without speculation)."""
    t0 = time.perf_counter()
    pending = [submit(mb) for mb in micro_batches]
    timing = StepTiming(0.0)
    for mb, p in zip(micro_batches, pending):
        t1 = time.perf_counter()
        trees = error = None
        if p is not None:
            try:
                trees = p.result()
            except Exception as e:
                error = e
        t2 = time.perf_counter()
        go_on = verify(mb, trees, error, t2 - t1)
        t3 = time.perf_counter()
        timing.micro.append(MicroBatchTiming(t2 - t1, t3 - t2, (getattr(p, "compute_s", None) or 0.0)))
        if go_on is False:
            timing.completed = False
            break
    timing.step_s = time.perf_counter() - t0
    return timing


def split_micro_batches(items: list, n: int) -> list[list]:
    """Contiguous, near-equal parts; never an empty part (fewer parts when there are fewer items)."""
    if n < 1:
        raise ValueError(f"num_micro_batches must be >= 1 (got {n})")
    n = min(n, len(items)) or 1
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out


class OverlapStepper:
    """The verification half of an engine step, split into micro-batches whose drafts overlap the
    verification of earlier ones. The engine's proposer must draft in other processes
    (``supports_async``). ``engine.step()`` uses it when ``draft_overlap_micro_batches > 1`` (or after
    ``engine.set_draft_overlap(n)``); output equals the plain step's token for token. ``timings``
    keeps the last ``MAX_TIMINGS`` steps."""

    MAX_TIMINGS = 4096

    def __init__(self, engine, num_micro_batches: int = 2):
        proposer = engine.proposer
        if proposer is None or not proposer.supports_async:
            raise ValueError(f"proposer {getattr(proposer, 'name', proposer)!r} has no propose_async; "
                             "overlap needs drafters that run in other processes (RemoteProposer)")
        split_micro_batches([], num_micro_batches)  # validates n
        self.engine, self.num_micro_batches = engine, num_micro_batches
        self.timings: deque[StepTiming] = deque(maxlen=self.MAX_TIMINGS)

    def verify_in_flight(self, scheduled) -> bool:
        """``LLMEngine.step``'s draft-and-verify: False when the verifier restarted (the step stops)."""
        drafting = self.engine.drafting
        parts = [(part, drafting.requests(part)) for part in split_micro_batches(scheduled, self.num_micro_batches)]
        timing = run_in_flight(parts, self._submit, self._verify)
        self.timings.append(timing)
        return timing.completed

    def _submit(self, micro_batch):
        _, reqs = micro_batch
        return self.engine.proposer.propose_async(reqs) if reqs else None

    def _verify(self, micro_batch, trees_list, error: Exception | None, wait_s: float) -> bool:
        drafting = self.engine.drafting
        part, reqs = micro_batch
        trees = {}
        try:
            if error is not None:
                raise error
            if trees_list is not None:
                trees = drafting.accept(reqs, trees_list)
        except Exception as e:  # this micro-batch decodes without the proposer's drafts
            drafting.failed(e)
        draft_s = wait_s if trees else None
        return self.engine.verify_part(part, {**trees, **drafting.forced_trees(part)}, draft_s)
