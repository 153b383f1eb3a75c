"""Swap preemption: a preempted sequence's KV blocks wait in the host tier instead of being dropped.

Preemption by recompute frees a sequence's blocks and later prefills its whole context again. With
a host tier (actors/kv_tiers.py) the blocks holding its committed KV can be copied out instead
(``swap_out``: one EVICT per block into a host slot held for the sequence, outside the prefix-cache
LRU, so nothing evicts, spills or drops it while the sequence waits) and copied back into fresh
device blocks when it is rescheduled (``swap_in``: one LOAD per block); the sequence resumes at the
same ``num_committed`` with its prefix-cache chain state (hash, chain id) intact, so the blocks it
commits later register exactly as they would have. The moves join the step's ordered copy plan,
executed before the forward like the write-back moves (actors/kv_host_pool.py).

Which one (``SwapPolicy``, config ``kv_offload.preemption``): ``recompute`` always; ``swap`` when
the host tier has room for the blocks; ``auto`` when it has room and, from measured costs, copying
the blocks out and back in is cheaper than prefilling the tokens again:
``blocks x (out + in seconds per block) < tokens x prefill seconds per token``. Copy seconds come
from the host pool's counters (bytes and seconds per direction); prefill seconds per token from
the engine's prefill-only steps (``observe_prefill``). A cost not measured yet counts as favouring
swap, whose first copies then measure it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from actors.kv_allocator import KVBlockAllocator, OutOfBlocksError
from actors.kv_block import SeqTable

PREEMPTION_MODES = ("auto", "swap", "recompute")
SWAP, RECOMPUTE = "swap", "recompute"


@dataclass(slots=True)
class SwappedSeq:
    seq: SeqTable  # the allocator's record: no blocks, num_tokens = num_committed, chain state kept
    slots: list[int]  # held host slots of its blocks 0 .. len(slots) - 1 (its committed KV), in order


def blocks_to_swap(alloc: KVBlockAllocator, seq_id: int) -> int:
    """Blocks holding seq_id's committed KV (the last one possibly partial)."""
    return alloc._blocks_for(alloc.num_committed(seq_id))


def can_swap_out(alloc: KVBlockAllocator, seq_id: int) -> bool:
    n = blocks_to_swap(alloc, seq_id)
    return alloc.tiers is not None and n > 0 and alloc.tiers.host.can_hold(n)


def swap_out(alloc: KVBlockAllocator, seq_id: int) -> int:
    """Preempt seq_id by swap: plan its committed blocks' copies to held host slots, then release
    its device blocks (tail first, as ``free`` does). Returns the blocks swapped out."""
    if not can_swap_out(alloc, seq_id):
        raise OutOfBlocksError(f"swap out seq {seq_id!r}: the host tier cannot hold its "
                               f"{blocks_to_swap(alloc, seq_id)} blocks: ask can_swap_out first")
    s = alloc._seqs.pop(seq_id)
    n = alloc._blocks_for(s.num_committed)
    slots = [alloc.tiers.swap_out(bid) for bid in s.blocks[:n]]  # copies planned before any reuse
    for bid in reversed(s.blocks):
        alloc._release(bid)
    s.blocks, s.num_tokens = [], s.num_committed
    alloc.swapped[seq_id] = SwappedSeq(s, slots)
    return n


def can_swap_in(alloc: KVBlockAllocator, seq_id: int, num_tokens: int) -> bool:
    """Whether seq_id (swapped out) fits back with a table for ``num_tokens`` positions."""
    s = alloc.swapped[seq_id].seq
    return alloc._blocks_for(max(num_tokens, s.num_committed)) <= alloc.num_free_blocks


def swap_in(alloc: KVBlockAllocator, seq_id: int, num_tokens: int) -> int:
    """Give seq_id its table back for ``num_tokens`` positions: fresh device blocks, the held ones
    loaded (each LOAD planned before its slot is given back). Returns its num_committed."""
    if not can_swap_in(alloc, seq_id, num_tokens):
        raise OutOfBlocksError(f"swap in seq {seq_id!r} to {num_tokens} tokens: {alloc.num_free_blocks} "
                               "free blocks are too few: ask can_swap_in first")
    w = alloc.swapped.pop(seq_id)
    s = w.seq
    total = max(num_tokens, s.num_committed)
    for slot in w.slots:
        bid = alloc._take_fresh()  # may write a cached block back first: planned before the LOAD
        alloc.tiers.swap_in(slot, bid)
        s.blocks.append(bid)
    s.blocks += [alloc._take_fresh() for _ in range(alloc._blocks_for(total) - len(s.blocks))]
    s.num_tokens = total
    alloc._seqs[seq_id] = s
    return s.num_committed


class SwapPolicy:
    """How a preempted sequence gives its blocks back: ``mode`` auto | swap | recompute, with running
    estimates of copy seconds per block (read from ``copy_stats()``: direction -> (bytes, seconds),
    the host pool's counters; ``block_bytes`` per block) and prefill seconds per token."""

    def __init__(self, mode: str, block_bytes: int = 0,
                 copy_stats: Callable[[], dict[str, tuple[int, float]]] | None = None, smoothing: float = 0.2):
        if mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption mode {mode!r} is not one of {', '.join(PREEMPTION_MODES)}")
        self.mode, self.block_bytes, self.copy_stats = mode, block_bytes, copy_stats
        self.smoothing = smoothing
        self.prefill_s_per_token: float | None = None  # exponential moving average

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        """A step that prefilled ``num_tokens`` tokens (and decoded none) took ``seconds``."""
        if num_tokens <= 0 or seconds <= 0:
            return
        x, prev = seconds / num_tokens, self.prefill_s_per_token
        self.prefill_s_per_token = x if prev is None else prev + self.smoothing * (x - prev)

    def copy_s_per_block(self) -> float | None:
        """Seconds to copy one block out and back in (None: nothing copied yet). A direction not
        measured yet is taken to cost what the other does."""
        stats = self.copy_stats() if self.copy_stats is not None else {}
        rates = [s / b for b, s in (stats.get("device_to_host", (0, 0.0)), stats.get("host_to_device", (0, 0.0))) if b]
        if not rates or not self.block_bytes:
            return None
        out, back = (rates * 2)[:2]
        return (out + back) * self.block_bytes

    def swap_is_cheaper(self, num_blocks: int, num_tokens: int) -> bool:
        copy, prefill = self.copy_s_per_block(), self.prefill_s_per_token
        if copy is None or prefill is None:
            return True  # unmeasured: swap, and measure
        return num_blocks * copy < num_tokens * prefill

    def choose(self, alloc: KVBlockAllocator, seq_id: int) -> str:
        """SWAP or RECOMPUTE for running seq_id about to be preempted."""
        if self.mode == RECOMPUTE or not can_swap_out(alloc, seq_id):
            return RECOMPUTE
        if self.mode == SWAP:
            return SWAP
        cheaper = self.swap_is_cheaper(blocks_to_swap(alloc, seq_id), alloc.num_committed(seq_id))
        return SWAP if cheaper else RECOMPUTE


def preempt(alloc: KVBlockAllocator, seq_id: int, policy: SwapPolicy | None) -> bool:
    """Preempt running seq_id: swap it out if ``policy`` chooses to, else free it (recompute).
    Returns whether it was swapped."""
    if policy is not None and policy.choose(alloc, seq_id) == SWAP:
        swap_out(alloc, seq_id)
        return True
    alloc.free(seq_id)
    return False
