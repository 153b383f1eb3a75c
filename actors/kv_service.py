"""The KV side of one step, batched: plan (reserve / preempt / admit) and settle (commit, release,
free) for all sequences at once, so a remote allocator costs one call each way per step.

``KVService`` wraps a ``KVBlockAllocator``; it runs in-process or as the replica's global
allocator actor (one block table serves all TP ranks). The policy lives in ``plan_step``:
1. running sequences in priority order: a decode root + its draft slots, else a prefill chunk;
   when blocks run out, that sequence's speculation is dropped first, then the lowest-priority
   running sequence is preempted (recompute) until the step fits;
2. waiting sequences are admitted (prefix-cache hits counted) while the token budget,
   ``max_num_seqs`` and free blocks allow — but not in a step that had to preempt.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from actors.kv_allocator import KVBlockAllocator
from actors.kv_host_tier import BlockCopy


class KVServiceLost(RuntimeError):
    """The KV service's state is gone (its actor died) and a fresh, empty one took its place: every
    running sequence must recompute from its committed tokens (the engine re-queues them)."""


@dataclass(slots=True)
class KVEntry:
    seq_id: int
    num_computed: int
    num_tokens: int
    spec: int = 0  # draft-node slots wanted (decode only)
    token_ids: list[int] | None = None  # waiting sequences: the tokens to allocate

    @property
    def is_decode(self) -> bool:
        return self.num_tokens - self.num_computed == 1


@dataclass(slots=True)
class Grant:
    seq_id: int
    num_query: int  # tokens computed this step
    num_spec: int  # draft slots reserved after the root
    num_computed: int  # after a prefix-cache hit (admitted sequences)
    num_host_cached: int = 0  # of that hit, tokens loaded from the host tier
    num_disk_cached: int = 0  # ... and from the disk tier


@dataclass(slots=True)
class KVPlan:
    granted: list[Grant] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    block_tables: dict[int, list[int]] = field(default_factory=dict)
    copies: list[BlockCopy] = field(default_factory=list)  # tier moves to run before the forward


@dataclass(slots=True)
class Settle:
    """After a step: ``free`` a finished sequence, else commit its computed positions and keep
    blocks for ``num_tokens`` positions only (rejected draft slots are released)."""

    seq_id: int
    free: bool = False
    token_ids: list[int] | None = None
    num_committed: int = 0
    num_tokens: int = 0


def plan_step(alloc: KVBlockAllocator, running: list[KVEntry], waiting: list[KVEntry],
              max_num_seqs: int, token_budget: int) -> KVPlan:
    plan = KVPlan()
    live = list(running)
    i = 0
    while i < len(live) and token_budget > 0:
        e = live[i]
        want = 1 if e.is_decode else min(e.num_tokens - e.num_computed, token_budget)
        spec = max(0, min(e.spec, token_budget - want)) if e.is_decode else 0
        granted = _reserve(alloc, live, i, want, spec, plan)
        if granted is None:
            continue  # e itself was preempted; live[i] is now the next entry
        plan.granted.append(Grant(e.seq_id, want, granted, e.num_computed))
        token_budget -= want + granted
        i += 1
    if not plan.preempted:
        _admit(alloc, waiting, len(live), max_num_seqs, token_budget, plan)
    plan.block_tables = {g.seq_id: alloc.block_table(g.seq_id) for g in plan.granted}
    plan.copies = alloc.take_copies()
    return plan


def _reserve(alloc: KVBlockAllocator, live: list[KVEntry], i: int, want: int, spec: int,
             plan: KVPlan) -> int | None:
    e = live[i]
    while True:
        for s in (spec, 0) if spec else (0,):
            need = max(e.num_computed + want + s, alloc.num_tokens(e.seq_id))
            if alloc.can_append(e.seq_id, need):
                alloc.append(e.seq_id, need)
                return s
        victim = live.pop()  # lowest priority
        alloc.free(victim.seq_id)
        plan.preempted.append(victim.seq_id)
        if victim is e:
            return None


def _admit(alloc: KVBlockAllocator, waiting: list[KVEntry], num_running: int, max_num_seqs: int,
           token_budget: int, plan: KVPlan) -> None:
    for e in waiting:
        if token_budget <= 0 or num_running >= max_num_seqs or not alloc.can_allocate(e.token_ids):
            return
        cached = alloc.allocate(e.seq_id, e.token_ids)
        want = min(e.num_tokens - cached, token_budget)
        plan.granted.append(Grant(e.seq_id, want, 0, cached, alloc.host_hit_tokens(e.seq_id),
                                  alloc.disk_hit_tokens(e.seq_id)))
        token_budget -= want
        num_running += 1


class KVService:
    """The allocator behind a batched, per-step API (in-process or a Ray actor)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_host_blocks: int = 0, block_bytes: int = 0, num_disk_blocks: int = 0):
        """num_host_blocks > 0: a host KV tier, num_disk_blocks > 0: a disk tier below it;
        block_bytes: bytes one block moves (for stats)."""
        self.allocator = KVBlockAllocator(num_blocks, block_size, enable_prefix_caching, num_host_blocks,
                                          num_disk_blocks)
        self.block_bytes = block_bytes

    def plan(self, running: list[KVEntry], waiting: list[KVEntry], max_num_seqs: int,
             token_budget: int) -> KVPlan:
        return plan_step(self.allocator, running, waiting, max_num_seqs, token_budget)

    def settle(self, ops: list[Settle]) -> None:
        alloc = self.allocator
        for op in ops:
            if op.free:
                if alloc.has_seq(op.seq_id):
                    alloc.free(op.seq_id)
                continue
            alloc.commit(op.seq_id, op.token_ids, op.num_committed)
            alloc.truncate(op.seq_id, min(op.num_tokens, alloc.num_tokens(op.seq_id)))

    def reset(self) -> None:
        """Drop every sequence's blocks (the KV cache they indexed is gone, e.g. a verifier restart)."""
        a = self.allocator
        self.allocator = KVBlockAllocator(a.num_blocks, a.block_size, a.enable_prefix_caching,
                                          a.host.num_slots if a.host is not None else 0,
                                          a.disk.num_slots if a.disk is not None else 0)

    def stats(self) -> dict:
        a = self.allocator
        return {"num_blocks": a.num_blocks, "num_free_blocks": a.num_free_blocks, "usage": a.usage,
                "num_cached_blocks": a.num_cached_blocks, "prefix_queries": a.prefix_queries,
                "prefix_hits": a.prefix_hits, "prefix_hit_rate": a.prefix_hit_rate,
                **_host_stats(a, self.block_bytes)}


def _host_stats(a: KVBlockAllocator, block_bytes: int) -> dict:
    """Lower tier figures (hits in tokens, moves in blocks and bytes), ``host_*`` and with a disk
    tier ``disk_*``; empty without tiers. Counts of decided moves: the engine executes every move
    of a plan before its forward (``disk_blocks_evicted``: spilled host -> disk)."""
    out = {}
    for name, t, hits in (("host", a.host, a.host_hits), ("disk", a.disk, a.disk_hits)):
        if t is not None:
            out.update({f"{name}_num_blocks": t.num_slots, f"{name}_cached_blocks": t.num_blocks,
                        f"{name}_hits": hits, f"{name}_blocks_evicted": t.num_evicted,
                        f"{name}_blocks_loaded": t.num_loaded, f"{name}_bytes_out": t.num_evicted * block_bytes,
                        f"{name}_bytes_in": t.num_loaded * block_bytes})
    return out
