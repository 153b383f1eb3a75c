"""The KV side of one step, batched: plan (reserve / preempt / admit) and settle (commit, release,
free) for all sequences at once, so a remote allocator costs one call each way per step.

``KVService`` wraps a ``KVBlockAllocator``; it runs in-process or as the replica's global
allocator actor (one block table serves all TP ranks). The policy lives in ``plan_step``:
1. running sequences in priority order: a decode root + its draft slots, else a prefill chunk;
   when blocks run out, that sequence's speculation is dropped first, then the lowest-priority
   running sequence is preempted until the step fits: swapped out to the host tier or freed to be
   recomputed, as the service's ``swap`` policy chooses (actors/kv_swap.py; None: recompute);
2. waiting sequences are admitted (prefix-cache hits counted; a swapped-out one is swapped back
   in) while the token budget, ``max_num_seqs`` and free blocks allow — but not in a step that had
   to preempt.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from actors.kv_allocator import KVBlockAllocator
from actors.kv_host_tier import BlockCopy
from actors.kv_swap import SwapPolicy, can_swap_in, preempt, swap_in


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
    use_cache: bool = True  # waiting sequences: may start from a prefix-cache hit (not when every prompt row is wanted)

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
    swapped_in: bool = False  # a swapped-out sequence resumed: num_computed is its committed KV


@dataclass(slots=True)
class KVPlan:
    granted: list[Grant] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)  # of the preempted, those swapped out (the rest recompute)
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
              max_num_seqs: int, token_budget: int, swap: SwapPolicy | None = None) -> KVPlan:
    plan = KVPlan()
    live = list(running)
    i = 0
    while i < len(live) and token_budget > 0:
        e = live[i]
        want = 1 if e.is_decode else min(e.num_tokens - e.num_computed, token_budget)
        spec = max(0, min(e.spec, token_budget - want)) if e.is_decode else 0
        granted = _reserve(alloc, live, i, (want, spec), plan, swap)
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


def _reserve(alloc: KVBlockAllocator, live: list[KVEntry], i: int, ask: tuple[int, int], plan: KVPlan,
             swap: SwapPolicy | None) -> int | None:
    """Grow live[i]'s table for ``ask`` = (tokens, draft slots), dropping the slots, then preempting
    from the end of ``live``, until it fits; returns the draft slots granted (None: live[i] preempted)."""
    e, (want, spec) = live[i], ask
    while True:
        for s in (spec, 0) if spec else (0,):
            need = max(e.num_computed + want + s, alloc.num_tokens(e.seq_id))
            if alloc.can_append(e.seq_id, need):
                alloc.append(e.seq_id, need)
                return s
        victim = live.pop()  # lowest priority
        if preempt(alloc, victim.seq_id, swap):
            plan.swapped.append(victim.seq_id)
        plan.preempted.append(victim.seq_id)
        if victim is e:
            return None


def _admit(alloc: KVBlockAllocator, waiting: list[KVEntry], num_running: int, max_num_seqs: int,
           token_budget: int, plan: KVPlan) -> None:
    for e in waiting:
        if token_budget <= 0 or num_running >= max_num_seqs:
            return
        if alloc.is_swapped(e.seq_id):
            if not can_swap_in(alloc, e.seq_id, e.num_tokens):
                return
            computed = swap_in(alloc, e.seq_id, e.num_tokens)
            grant = Grant(e.seq_id, min(e.num_tokens - computed, token_budget), 0, computed, swapped_in=True)
        elif alloc.can_allocate(e.token_ids, use_cache=e.use_cache):
            cached = alloc.allocate(e.seq_id, e.token_ids, use_cache=e.use_cache)
            grant = Grant(e.seq_id, min(e.num_tokens - cached, token_budget), 0, cached,
                          alloc.host_hit_tokens(e.seq_id), alloc.disk_hit_tokens(e.seq_id))
        else:
            return
        plan.granted.append(grant)
        token_budget -= grant.num_query
        num_running += 1


class KVService:
    """The allocator behind a batched, per-step API (in-process or a Ray actor). ``swap``: how
    preemption gives blocks back (actors.kv_swap.SwapPolicy; None = recompute), set by the engine."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_host_blocks: int = 0, block_bytes: int = 0, num_disk_blocks: int = 0):
        """num_host_blocks > 0: a host KV tier, num_disk_blocks > 0: a disk tier below it;
        block_bytes: bytes one block moves (for stats)."""
        self.allocator = KVBlockAllocator(num_blocks, block_size, enable_prefix_caching, num_host_blocks,
                                          num_disk_blocks)
        self.block_bytes = block_bytes
        self.swap: SwapPolicy | None = None

    def plan(self, running: list[KVEntry], waiting: list[KVEntry], max_num_seqs: int,
             token_budget: int) -> KVPlan:
        return plan_step(self.allocator, running, waiting, max_num_seqs, token_budget, self.swap)

    def settle(self, ops: list[Settle]) -> None:
        alloc = self.allocator
        for op in ops:
            if op.free:
                if alloc.has_seq(op.seq_id) or alloc.is_swapped(op.seq_id):
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
    of a plan before its forward (``disk_blocks_evicted``: spilled host -> disk). Host bytes count
    swap preemption's moves too (``host_blocks_swapped_out/in``; ``host_swapped_blocks``: held now)."""
    out = {}
    for name, t, hits in (("host", a.host, a.host_hits), ("disk", a.disk, a.disk_hits)):
        if t is not None:
            out.update({f"{name}_num_blocks": t.num_slots, f"{name}_cached_blocks": t.num_blocks,
                        f"{name}_hits": hits, f"{name}_blocks_evicted": t.num_evicted,
                        f"{name}_blocks_loaded": t.num_loaded, f"{name}_bytes_out": t.num_evicted * block_bytes,
                        f"{name}_bytes_in": t.num_loaded * block_bytes})
    if a.tiers is not None:
        swap_out, swap_in = a.tiers.num_swapped_out, a.tiers.num_swapped_in
        out.update({"host_swapped_blocks": a.host.num_held, "host_blocks_swapped_out": swap_out,
                    "host_blocks_swapped_in": swap_in, "host_bytes_out": out["host_bytes_out"] + swap_out * block_bytes,
                    "host_bytes_in": out["host_bytes_in"] + swap_in * block_bytes})
    return out
