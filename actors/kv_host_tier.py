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
the copies in the order they were decided keeps every block's bytes intact. With a disk tier
(actors/kv_disk_tier.py, actors/kv_tiers.py) two more kinds join the plan: SPILL (a host entry the
host LRU pushes out goes to disk) and DISK_LOAD (a disk hit goes straight to a device block).

Swap preemption (actors/kv_swap.py) also keeps blocks here: a preempted sequence's blocks go out
with EVICT moves into slots *held* for it, outside the LRU (never evicted, spilled or dropped while
the sequence waits), and come back with LOAD moves when it is rescheduled. Held slots count against
the tier's capacity like entries do.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

EVICT = "evict"  # device block -> host slot (copy-out, before the device block is reused)
LOAD = "load"  # host slot -> device block (copy-in, before the block's K/V are read)
SPILL = "spill"  # host slot -> disk slot (the host tier's LRU overflow, before the slot is reused)
DISK_LOAD = "disk_load"  # disk slot -> device block (a disk hit, before the block's K/V are read)


@dataclass(slots=True, frozen=True)
class BlockCopy:
    kind: str  # EVICT | LOAD | SPILL | DISK_LOAD
    device_block: int  # -1 for SPILL
    host_slot: int  # -1 for DISK_LOAD
    disk_slot: int = -1  # SPILL and DISK_LOAD only

    def ends(self) -> tuple[int, int]:
        """(source, destination) of the move, each an index into its own tier."""
        if self.kind == EVICT:
            return self.device_block, self.host_slot
        if self.kind == LOAD:
            return self.host_slot, self.device_block
        if self.kind == SPILL:
            return self.host_slot, self.disk_slot
        return self.disk_slot, self.device_block


@dataclass(slots=True)
class HostEntry:
    tier: ClassVar[str] = "host"
    slot: int
    hash: int
    token_ids: tuple[int, ...]
    chain_id: int
    parent_chain_id: int


class HostTier:
    """``num_slots`` host blocks, an LRU of cached entries keyed by chained hash. The disk tier
    (actors/kv_disk_tier.py) keeps the same books over its file's slots."""

    label = "host"
    entry_cls: ClassVar[type] = HostEntry

    def __init__(self, num_slots: int):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"{self.label} tier num_slots must be an int >= 1, got {num_slots!r}")
        self.num_slots = num_slots
        self._free_slots: list[int] = list(range(num_slots - 1, -1, -1))
        self._entries: OrderedDict[int, HostEntry] = OrderedDict()  # hash -> entry, LRU first
        self._pinned: set[int] = set()  # hashes being loaded by the allocate in progress
        self._held: set[int] = set()  # slots of swapped-out sequences' blocks (not cache entries)
        self.num_evicted = 0  # blocks written here (device -> host)
        self.num_loaded = 0  # blocks read back (host -> device)
        self.num_dropped = 0  # entries pushed out of the host tier (LRU) or superseded

    @property
    def num_blocks(self) -> int:
        return len(self._entries)

    @property
    def is_full(self) -> bool:
        return not self._free_slots

    @property
    def num_held(self) -> int:
        return len(self._held)

    def can_hold(self, n: int) -> bool:
        """Whether n slots can be held now: free ones, plus cache entries the LRU may push out."""
        return n <= len(self._free_slots) + sum(h not in self._pinned for h in self._entries)

    def hold(self) -> int:
        """Take a free slot for a swapped-out block (the caller made room first)."""
        slot = self._free_slots.pop()
        self._held.add(slot)
        return slot

    def unhold(self, slot: int) -> None:
        """Give a held slot back (its block was loaded back, or its sequence ended while swapped)."""
        self._held.remove(slot)
        self._free_slots.append(slot)

    def get(self, h: int) -> HostEntry | None:
        return self._entries.get(h)

    def put(self, h: int, token_ids: tuple[int, ...], chain_id: int, parent_chain_id: int) -> int | None:
        """Keep a block evicted from the tier above; returns its slot, or None when every slot
        holds a block being loaded right now (then the block is simply dropped)."""
        if h in self._entries:  # exclusive tiers make this unreachable; refresh defensively
            self.drop(h)
        if not self._free_slots and not self.drop_lru():
            return None
        slot = self._free_slots.pop()
        self._entries[h] = self.entry_cls(slot, h, token_ids, chain_id, parent_chain_id)
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

    def pop_lru(self) -> HostEntry | None:
        """Remove and return the least recently used entry not pinned (None if every entry is).
        Its slot is free at once: the copy that saves it elsewhere is planned before any copy that
        refills the slot."""
        h = next((h for h in self._entries if h not in self._pinned), None)
        if h is None:
            return None
        e = self._entries.pop(h)
        self._free_slots.append(e.slot)
        return e

    def drop_lru(self) -> bool:
        if self.pop_lru() is None:
            return False
        self.num_dropped += 1
        return True

    def check_invariants(self) -> None:
        used = [e.slot for e in self._entries.values()] + sorted(self._held)
        slots = used + self._free_slots
        if sorted(slots) != list(range(self.num_slots)):
            raise AssertionError(f"{self.label} tier: slots leaked or doubled (used {sorted(used)}, "
                                 f"free {sorted(self._free_slots)}, {self.num_slots} slots)")
        for h, e in self._entries.items():
            if e.hash != h:
                raise AssertionError(f"{self.label} tier: entry under {h} has hash {e.hash}")
        if not self._pinned <= self._entries.keys():
            raise AssertionError(f"{self.label} tier: pinned hashes {self._pinned - self._entries.keys()} not held")
