"""Continuous batching: which sequences run this step, with how many tokens and draft slots.

The scheduler owns sequence state (waiting / running queues). KV decisions go to a KV service in
one batched call per step (``plan``) and come back in one (``settle``): in-process that is a
``KVService``, on a cluster the replica's global allocator actor. The policy itself is
``actors.kv_service.plan_step``: running sequences first (speculation shrinks, then the newest
running sequence is preempted by recompute when blocks run out — never an out-of-memory crash),
then waiting sequences under the token budget and ``max_num_seqs``. A preempted sequence is
swapped out (its KV waits in the host tier and comes back when it is admitted again) or recomputed,
as the KV service's swap policy chooses (actors/kv_swap.py).
"""
from __future__ import annotations

import itertools

from collections import deque
from dataclasses import dataclass, field
from actors.kv_service import KVEntry, Settle
from actors.sequence import Sequence, SeqStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_query: int  # tokens computed this step: a prefill chunk, or 1 (the root of the token tree)
    num_spec: int = 0  # draft-node slots reserved after the root (0 = plain decoding)
    is_decode: bool = False  # the root of a token tree (vs a prefill chunk)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # to recompute (their KV is gone)
    swapped: list[Sequence] = field(default_factory=list)  # preempted too, their KV in the host tier
    copies: list = field(default_factory=list)  # KV tier moves (actors.kv_host_tier.BlockCopy), run first

    @property
    def num_tokens(self) -> int:
        return sum(s.num_query + s.num_spec for s in self.scheduled)


class BatchScheduler:
    def __init__(self, kv, max_num_seqs: int, max_num_batched_tokens: int, block_size: int):
        """kv: a KVService, or a client with the same ``plan``/``settle`` methods (Ray actor)."""
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_size = block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.block_tables: dict[int, list[int]] = {}  # of the sequences scheduled this step
        self.preemptions = {"swap": 0, "recompute": 0}  # by mode, since the start

    @property
    def num_preemptions(self) -> int:
        return sum(self.preemptions.values())

    # ---- queue management -------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence (finished, aborted or failed) and free its KV blocks."""
        self._forget(seq)
        self.kv.settle([Settle(seq.seq_id, free=True)])

    def _forget(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_tables.pop(seq.seq_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def prefill_backlog(self) -> int:
        """Prompt tokens that could be prefilled now: the rest of prompts mid-prefill, and what the
        waiting sequences there is room to admit have not computed (all of it, unless swapped out)."""
        room = max(0, self.max_num_seqs - len(self.running))
        mid = sum(s.num_uncomputed for s in self.running if s.in_prefill)
        return mid + sum(s.num_uncomputed for s in itertools.islice(self.waiting, room))

    def drafts_would_shrink_prefill(self, tokens_per_decode: int) -> bool:
        """Whether this step's token budget is too small for the prefill backlog and
        ``tokens_per_decode`` tokens (root + full draft) for every decoding sequence."""
        backlog = self.prefill_backlog()
        decoding = sum(1 for s in self.running if not s.in_prefill)
        return backlog > 0 and backlog + decoding * tokens_per_decode > self.max_num_batched_tokens

    # ---- the step plan ------------------------------------------------------------------
    def schedule(self, spec_budgets: dict[int, int]) -> SchedulerOutput:
        """spec_budgets: seq_id -> draft-node slots to reserve for a decoding sequence (absent: 0)."""
        running = [KVEntry(s.seq_id, s.num_computed, s.num_tokens,
                           spec_budgets.get(s.seq_id, 0) if s.num_uncomputed == 1 else 0) for s in self.running]
        room = max(0, self.max_num_seqs - len(self.running))
        waiting = [KVEntry(s.seq_id, 0, s.num_tokens, 0, s.token_ids, use_cache=not s.computes_every_prompt_row)
                   for s in list(self.waiting)[:room]]
        plan = self.kv.plan(running, waiting, self.max_num_seqs, self.max_num_batched_tokens)
        by_id = {s.seq_id: s for s in self.running}
        by_id.update((s.seq_id, s) for s in self.waiting)
        out = SchedulerOutput()
        self._preempt([by_id[sid] for sid in plan.preempted], set(plan.swapped), out)
        for g in plan.granted:
            seq = by_id[g.seq_id]
            if seq.status is SeqStatus.WAITING:
                self._resume(seq, g)
            decode = seq.num_uncomputed == 1 and g.num_query == 1
            out.scheduled.append(ScheduledSeq(seq, g.num_query, g.num_spec, decode))
        self.block_tables = plan.block_tables
        out.copies = plan.copies
        return out

    def _preempt(self, seqs: list[Sequence], swapped: set[int], out: SchedulerOutput) -> None:
        """``seqs`` leave the running list for the front of the waiting queue, in plan order."""
        for seq in seqs:
            self.running.remove(seq)
            if seq.seq_id in swapped:
                seq.preempt_by_swap()
                self.preemptions["swap"] += 1
                out.swapped.append(seq)
            else:
                seq.reset_for_recompute()
                self.preemptions["recompute"] += 1
                out.preempted.append(seq)
            self.waiting.appendleft(seq)

    def _resume(self, seq: Sequence, g) -> None:
        """Waiting ``seq`` was granted (``g``, an actors.kv_service.Grant): admitted, or swapped in
        (then it keeps what its first admission hit in the prefix cache)."""
        self.waiting.remove(seq)
        seq.num_computed = g.num_computed
        if not g.swapped_in:
            seq.num_cached_tokens = min(g.num_computed, seq.num_prompt_tokens)
            seq.num_host_cached_tokens = min(g.num_host_cached, seq.num_cached_tokens)
            seq.num_disk_cached_tokens = min(g.num_disk_cached, seq.num_cached_tokens - seq.num_host_cached_tokens)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def slot(self, seq: Sequence, position: int) -> int:
        table, bs = self.block_tables[seq.seq_id], self.block_size
        return table[position // bs] * bs + position % bs

    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        return [self.slot(seq, p) for p in range(start, end)]

    def settle(self, seqs: list[Sequence]) -> None:
        """After a step: finished sequences leave and free their blocks; the others commit their
        computed positions and release spare draft slots. One KV call for the whole batch."""
        ops = []
        for seq in seqs:
            if seq.is_finished:
                self._forget(seq)
                ops.append(Settle(seq.seq_id, free=True))
            else:
                ops.append(Settle(seq.seq_id, token_ids=seq.token_ids,
                                  num_committed=min(seq.num_computed, seq.num_tokens), num_tokens=seq.num_tokens))
        if ops:
            self.kv.settle(ops)

    def requeue_all(self) -> list[Sequence]:
        """The KV cache was lost (verifier restart): every running sequence goes back to waiting
        and recomputes from its committed tokens (nothing lost, nothing duplicated); so do the waiting
        ones swapped out (the host tier is reset too)."""
        moved = list(self.running)
        for seq in reversed(moved):
            self.running.remove(seq)
            seq.reset_for_recompute()
            self.waiting.appendleft(seq)
        for seq in self.waiting:
            seq.num_computed = 0
        self.block_tables = {}
        self.kv.reset()
        return moved
