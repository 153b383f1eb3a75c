"""Draft/verify overlap: several micro-batches in flight within one engine step.

The scheduled batch is split into micro-batches A, B, ... Every micro-batch's draft is sent to the
drafter workers at once (a worker drafts A, then B); the driver waits for A's trees, verifies A
(one target forward) while the workers draft B, then waits for B's trees and verifies B:

    one micro-batch (no overlap):  D(A+B) + V(A+B)
    two micro-batches:             D(A) + max(V(A), D(B)) + V(B)

B's draft time hides behind A's verification. The price is a second target forward per step: on a
memory-bound device a forward reads all weights however few tokens it carries, so V(A) + V(B) can
approach 2 V(A+B) at small batch. ``run_in_flight`` is the generic core (any submit/verify
callables); ``OverlapStepper`` runs a whole engine step that way over an ``LLMEngine`` and a
``RemoteProposer`` (with ``num_micro_batches=1`` it is the engine's own step, timed the same way).

Across steps the same idea goes further (draft A for step t+1 while verifying B of step t); that
needs the scheduler to plan micro-batches separately and belongs in the engine's step loop.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.drafter import DraftRequest
from actors.tree import TokenTree

log = logging.getLogger("specray.overlap")


@dataclass(slots=True)
class MicroBatchTiming:
    draft_wait_s: float  # driver blocked waiting for this micro-batch's trees (exposed draft time)
    verify_s: float  # target forward + verification of this micro-batch
    draft_compute_s: float  # the workers' own drafting time for it (0 when nothing was drafted)

    @property
    def hidden_s(self) -> float:
        """Drafting time that ran while the driver was busy elsewhere."""
        return max(0.0, self.draft_compute_s - self.draft_wait_s)


@dataclass(slots=True)
class StepTiming:
    step_s: float
    micro: list[MicroBatchTiming] = field(default_factory=list)

    @property
    def draft_compute_s(self) -> float:
        return sum(m.draft_compute_s for m in self.micro)

    @property
    def draft_wait_s(self) -> float:
        return sum(m.draft_wait_s for m in self.micro)

    @property
    def verify_s(self) -> float:
        return sum(m.verify_s for m in self.micro)


def run_in_flight(micro_batches: list, submit: Callable[[Any], Any], verify: Callable[[Any, Any], None]
                  ) -> StepTiming:
    """submit(mb) -> a pending draft (``.result()`` -> trees, ``.compute_s``) or None (nothing to draft);
    verify(mb, trees or None) runs the target on mb. All drafts are submitted first, then each
    micro-batch waits for its own trees and is verified while the later ones are still drafting.
    A draft that fails gives verify ``None`` (that micro-batch decodes without speculation)."""
    t0 = time.perf_counter()
    pending = [submit(mb) for mb in micro_batches]
    timing = StepTiming(0.0)
    for mb, p in zip(micro_batches, pending):
        t1 = time.perf_counter()
        trees = None
        if p is not None:
            try:
                trees = p.result()
            except Exception as e:
                log.warning("draft of a micro-batch failed, verifying it without speculation: %s", e)
        t2 = time.perf_counter()
        verify(mb, trees)
        t3 = time.perf_counter()
        timing.micro.append(MicroBatchTiming(t2 - t1, t3 - t2, (getattr(p, "compute_s", None) or 0.0)))
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
    """Engine steps with the batch split into micro-batches whose drafts overlap verification.

    Drives an LLMEngine's own pieces (scheduler, forward planning, verification, emission); the
    engine's ``proposer`` must offer ``propose_async`` (RemoteProposer), and it also gets the
    engine's releases. Output equals ``engine.step()``'s token for token under greedy decoding."""

    def __init__(self, engine, num_micro_batches: int = 2):
        proposer = engine.proposer
        if not hasattr(proposer, "propose_async"):
            raise ValueError(f"proposer {getattr(proposer, 'name', proposer)!r} has no propose_async; "
                             "overlap needs drafters that run in other processes (RemoteProposer)")
        split_micro_batches([], num_micro_batches)  # validates n
        self.engine, self.proposer, self.num_micro_batches = engine, proposer, num_micro_batches
        self.timings: list[StepTiming] = []

    def step(self) -> list:
        eng = self.engine
        sched = eng.scheduler.schedule(eng._spec_budget)
        for seq in sched.preempted:
            eng._release_draft(seq)
        if not sched.scheduled:
            return []
        prev = {s.seq.seq_id: s.seq.num_output_tokens for s in sched.scheduled}
        parts = [(part, draft_requests(eng, part))
                 for part in split_micro_batches(sched.scheduled, self.num_micro_batches)]
        self.timings.append(run_in_flight(parts, self._submit, self._verify))
        return [eng._emit(s.seq, prev[s.seq.seq_id]) for s in sched.scheduled
                if s.seq.num_output_tokens > prev[s.seq.seq_id] or s.seq.is_finished]

    def _submit(self, micro_batch):
        _, reqs = micro_batch
        return self.proposer.propose_async(reqs) if reqs else None

    def _verify(self, micro_batch, trees_list: list[TokenTree] | None) -> None:
        eng = self.engine
        part, reqs = micro_batch
        trees = accept_trees(reqs, trees_list) if trees_list is not None else {}
        if reqs and trees_list is None:
            eng.num_proposer_failures += 1
        chunks, rows, spans = eng._plan_forward(part, trees)
        try:
            logits = eng.verifier.forward_logits(chunks, rows)
        except Exception as e:  # nothing lost: every request of the part gets a clear error
            log.exception("target forward failed")
            for s in part:
                eng._finish_now(s.seq, "error", f"target forward failed: {e}")
            return
        eng._apply(part, trees, spans, logits)

    def generate(self, prompts: list, params, concurrency: int | None = None, chat: bool = False) -> list:
        """engine.generate with overlapped steps: results in input order."""
        ids = [f"ovl-{id(self)}-{i}" for i in range(len(prompts))]
        limit = concurrency or len(prompts)
        final, nxt = {}, 0
        while len(final) < len(prompts):
            while nxt < len(prompts) and nxt - len(final) < limit:
                self.engine.add_request(ids[nxt], prompts[nxt], params, chat=chat)
                nxt += 1
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]


def draft_requests(engine, scheduled) -> list[DraftRequest]:
    """The DraftRequests the engine would send for these scheduled sequences (decode ones with a
    speculation budget), mirroring LLMEngine._propose."""
    reqs = []
    for s in scheduled:
        exp = engine._expansion_for(s.seq, s.num_spec) if s.is_decode and s.num_spec else []
        if exp:
            seq = s.seq
            reqs.append(DraftRequest(seq.seq_id, seq.token_ids, exp, s.num_spec, seq.params, seq.generator,
                                     engine.allocator.block_table(seq.seq_id)))
    return reqs


def accept_trees(reqs: list[DraftRequest], trees: list[TokenTree]) -> dict[int, TokenTree]:
    """seq_id -> tree, keeping only well-formed trees (right root, within the reserved slots)."""
    if len(trees) != len(reqs):
        raise ValueError(f"{len(trees)} trees for {len(reqs)} draft requests")
    return {r.seq_id: t for r, t in zip(reqs, trees) if t.tokens[0] == r.token_ids[-1] and t.size - 1 <= r.max_nodes}
