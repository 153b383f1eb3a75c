"""Host KV tier: bookkeeping of prefix-cache blocks kept in host memory (no tensors here).

The device pool's allocator writes a cached, unreferenced block back here when it reuses the block
(LRU eviction), and loads it back into a fresh device block when a prompt's prefix lookup misses
on the device but finds the block here. An entry keeps what a device cache entry keeps: the chained
hash, the block's token ids and its chain ids (its own and its parent's), so a host hit is verified
against the token prefix exactly like a device hit. The tiers are exclusive: a hash lives on the
device or here, never in both.

Each move is a ``BlockCopy`` the allocator returns in its plan; whoever owns the tensors (the
verifier, ``actors.kv_host_pool``) executes them in order before the step's forward. Order matters:
a host slot freed by a load may be refilled by a later eviction in the same plan, and executing
the copies in the order they were decided keeps every block's bytes intact.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

EVICT = "evict"  # device block -> host slot (copy-out, before the device block is reused)
LOAD = "load"  # host slot -> device block (copy-in, before the block's K/V are read)


@dataclass(slots=True, frozen=True)
class BlockCopy:
    kind: str  # EVICT | LOAD
    device_block: int
    host_slot: int


@dataclass(slots=True)
class HostEntry:
    slot: int
    hash: int
    token_ids: tuple[int, ...]
    chain_id: int
    parent_chain_id: int


class HostTier:
    """``num_slots`` host blocks, an LRU of cached entries keyed by chained hash."""

    def __init__(self, num_slots: int):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"host tier num_slots must be an int >= 1, got {num_slots!r}")
        self.num_slots = num_slots
        self._free_slots: list[int] = list(range(num_slots - 1, -1, -1))
        self._entries: OrderedDict[int, HostEntry] = OrderedDict()  # hash -> entry, LRU first
        self._pinned: set[int] = set()  # hashes being loaded by the allocate in progress
        self.num_evicted = 0  # blocks written here (device -> host)
        self.num_loaded = 0  # blocks read back (host -> device)
        self.num_dropped = 0  # entries pushed out of the host tier (LRU) or superseded

    @property
    def num_blocks(self) -> int:
        return len(self._entries)

    def get(self, h: int) -> HostEntry | None:
        return self._entries.get(h)

    def put(self, h: int, token_ids: tuple[int, ...], chain_id: int, parent_chain_id: int) -> int | None:
        """Keep a block evicted from the device; returns its host slot, or None when every slot
        holds a block being loaded right now (then the block is simply dropped)."""
        if h in self._entries:  # exclusive tiers make this unreachable; refresh defensively
            self.drop(h)
        if not self._free_slots and not self._drop_lru():
            return None
        slot = self._free_slots.pop()
        self._entries[h] = HostEntry(slot, h, token_ids, chain_id, parent_chain_id)
        self.num_evicted += 1
        return slot

    def pin(self, h: int) -> None:
        """Keep entry h from LRU eviction until ``take`` (an allocate is about to load it)."""
        self._pinned.add(h)

    def take(self, h: int) -> HostEntry:
        """Remove entry h (it moves to the device); its slot is free once its LOAD has run, which
        the ordered copy list guarantees."""
        e = self._entries.pop(h)
        self._pinned.discard(h)
        self._free_slots.append(e.slot)
        self.num_loaded += 1
        return e

    def drop(self, h: int) -> None:
        e = self._entries.pop(h, None)
        if e is not None:
            self._pinned.discard(h)
            self._free_slots.append(e.slot)
            self.num_dropped += 1

    def _drop_lru(self) -> bool:
        for h in self._entries:
            if h not in self._pinned:
                self.drop(h)
                return True
        return False

    def check_invariants(self) -> None:
        used = [e.slot for e in self._entries.values()]
        slots = used + self._free_slots
        if sorted(slots) != list(range(self.num_slots)):
            raise AssertionError(f"host tier: slots leaked or doubled (used {sorted(used)}, "
                                 f"free {sorted(self._free_slots)}, {self.num_slots} slots)")
        for h, e in self._entries.items():
            if e.hash != h:
                raise AssertionError(f"host tier: entry under {h} has hash {e.hash}")
        if not self._pinned <= self._entries.keys():
            raise AssertionError(f"host tier: pinned hashes {self._pinned - self._entries.keys()} not held")
