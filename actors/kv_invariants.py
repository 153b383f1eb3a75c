"""Consistency checks of a KVBlockAllocator's bookkeeping, device pool and host tier (tests call
``allocator.check_invariants()``). Kept apart so the allocator module stays about its decisions."""
from __future__ import annotations

import operator


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def check_count(name: str, value: object, minimum: int) -> int:
    """Return value as an int (numpy ints welcome) or raise a ValueError naming it."""
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return n


def check_allocator(a) -> None:
    """Ref counts equal the tables holding each block, the free list holds exactly the unheld
    blocks, cache entries and blocks agree, the lower tiers are consistent and exclusive of the device
    and of each other, swapped-out sequences hold exactly the held host slots."""
    refs = [0] * a.num_blocks
    for seq_id, s in a._seqs.items():
        _check_seq(a, seq_id, s)
        for bid in s.blocks:
            refs[bid] += 1
    for b in a._blocks:
        expect(b.ref_count == refs[b.id], f"block {b.id}: ref_count {b.ref_count}, held by {refs[b.id]} tables")
        expect((b.ref_count == 0) == (b.id in a._free), f"block {b.id}: ref_count "
               f"{b.ref_count} but {'in' if b.id in a._free else 'not in'} free list")
        if b.hash is None:
            expect(b.token_ids is None, f"block {b.id}: unhashed but has token ids")
        else:
            expect(a._cached.get(b.hash) == b.id, f"block {b.id}: hash not registered")
            expect(b.token_ids is not None and len(b.token_ids) == a.block_size,
                   f"block {b.id}: cached without a full block of token ids")
    for h, bid in a._cached.items():
        expect(a._blocks[bid].hash == h, f"cache entry {h} -> block {bid} is stale")
    expect(len(a._free) == refs.count(0), "free list size != blocks with no holder")
    if a.tiers is not None:
        a.tiers.check_invariants()
        both = [h for h in a._cached if a.tiers.get(h) is not None]
        expect(not both, f"hashes {both[:3]} cached on the device and in a lower tier")
    _check_swapped(a)


def _check_swapped(a) -> None:
    """Swapped-out sequences have no table, hold exactly the host tier's held slots, one per block
    of their committed KV."""
    expect(not a.swapped or a.tiers is not None, "swapped-out sequences without a host tier")
    expect(not a.swapped.keys() & a._seqs.keys(), f"seqs {sorted(a.swapped.keys() & a._seqs.keys())} "
           "both swapped out and holding a block table")
    held = sorted(x for w in a.swapped.values() for x in w.slots)
    if a.tiers is not None:
        expect(held == sorted(a.tiers.host._held), f"swapped slots {held} != host tier's held slots "
               f"{sorted(a.tiers.host._held)}")
    for seq_id, w in a.swapped.items():
        expect(len(w.slots) == a._blocks_for(w.seq.num_committed) and not w.seq.blocks,
               f"swapped seq {seq_id}: {len(w.slots)} slots for {w.seq.num_committed} committed tokens")


def _check_seq(a, seq_id: int, s) -> None:
    expect(len(s.blocks) == a._blocks_for(s.num_tokens), f"seq {seq_id}: {len(s.blocks)} blocks for {s.num_tokens} tokens")
    expect(len(set(s.blocks)) == len(s.blocks), f"seq {seq_id}: a block appears twice")
    expect(0 <= s.num_committed <= s.num_tokens, f"seq {seq_id}: bad num_committed")
    for i in range(s.num_committed // a.block_size, len(s.blocks)):
        b = a._blocks[s.blocks[i]]
        expect(b.ref_count == 1, f"seq {seq_id}: block {b.id} (index {i}) is written into "
                                 f"but has ref_count {b.ref_count}")
        expect(b.hash is None, f"seq {seq_id}: block {b.id} is written into but hashed")
