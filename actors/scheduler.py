"""Continuous batching: which sequences run this step, with how many tokens and draft slots.

Policy per step (under a token budget and ``max_num_seqs``):
1. running decode sequences first (oldest first): the root token plus the draft-node slots the
   speculation policy asks for; when KV blocks run out, speculation for that sequence is dropped,
   then the newest running sequence is preempted (recompute) until the step fits;
2. running sequences still in (chunked) prefill continue;
3. waiting sequences are admitted while the budget, ``max_num_seqs`` and free blocks allow.
Never crashes for lack of memory: it schedules less.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from actors.kv_allocator import KVBlockAllocator
from actors.sequence import Sequence, SeqStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_query: int  # tokens computed this step: a prefill chunk, or 1 (the root of the token tree)
    num_spec: int = 0  # draft-node slots reserved after the root (0 = plain decoding)

    @property
    def is_decode(self) -> bool:
        return self.num_query == 1 and self.seq.num_uncomputed == 1


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_query + s.num_spec for s in self.scheduled)


class BatchScheduler:
    def __init__(self, allocator: KVBlockAllocator, max_num_seqs: int, max_num_batched_tokens: int):
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # ---- queue management -------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence (finished, aborted or failed) and free its KV blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if self.allocator.has_seq(seq.seq_id):
            self.allocator.free(seq.seq_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ---- the step plan ------------------------------------------------------------------
    def schedule(self, spec_budget: Callable[[Sequence], int]) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        budget = self._schedule_running(out, budget, spec_budget)
        self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, spec_budget) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.in_prefill:
                want, spec = min(seq.num_uncomputed, budget), 0
            else:
                want, spec = 1, max(0, min(spec_budget(seq), budget - 1))
            fitted = self._reserve(seq, want, spec, out)
            if fitted is None:  # seq itself was preempted
                continue
            out.scheduled.append(ScheduledSeq(seq, want, fitted))
            budget -= want + fitted
            i += 1
        return budget

    def _reserve(self, seq: Sequence, want: int, spec: int, out: SchedulerOutput) -> int | None:
        """Reserve KV slots for ``want`` tokens + ``spec`` draft nodes; shrink speculation, then
        preempt the newest running sequences. Returns the spec slots granted, None if ``seq``
        itself had to be preempted."""
        alloc = self.allocator
        while True:
            for s in (spec, 0) if spec else (0,):
                need = max(seq.num_computed + want + s, alloc.num_tokens(seq.seq_id))
                if alloc.can_append(seq.seq_id, need):
                    alloc.append(seq.seq_id, need)
                    return s
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return None

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.allocator.free(seq.seq_id)
        seq.reset_for_recompute()
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        alloc = self.allocator
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if out.preempted and seq in out.preempted:
                break  # do not re-admit in the same step what was just preempted
            if not alloc.can_allocate(seq.token_ids):
                break
            self.waiting.popleft()
            seq.num_computed = alloc.allocate(seq.seq_id, seq.token_ids)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            want = min(seq.num_uncomputed, budget)
            out.scheduled.append(ScheduledSeq(seq, want, 0))
            budget -= want
