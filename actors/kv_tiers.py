"""The KV tiers below the device pool as the allocator sees them: host memory, then optionally disk.

Write-back chain: a cached device block about to be reused goes to the host tier (EVICT); when the
host tier is full and a disk tier exists, the host's least recently used entry moves to disk first
(SPILL, planned before the EVICT that refills its slot); when the disk is full, its own LRU entry is
dropped (nothing to copy: the SPILL simply overwrites that slot). Without a disk tier the host's LRU
entry is dropped, as before.

Lookup: a miss on the device continues in the host tier, then on disk. A hit leaves its tier for a
fresh device block (LOAD from host, DISK_LOAD from disk: disk hits skip the host tier, which keeps
it for blocks evicted recently). Tiers are exclusive: a hash lives on the device, in the host tier
or on disk, never in two. Every decision appends a ``BlockCopy`` to one ordered plan.

Swap (actors/kv_swap.py): a preempted sequence's blocks go to host slots held for it (EVICT into a
held slot; room is made like for a write-back: the host LRU spills or drops) and come back into
fresh device blocks (LOAD, planned before the slot is given back, so a later move may refill it).
"""
from __future__ import annotations

from actors.kv_disk_tier import DiskTier
from actors.kv_host_tier import DISK_LOAD, EVICT, LOAD, SPILL, BlockCopy, HostEntry, HostTier


class LowerTiers:
    """A host tier of ``num_host_blocks`` and an optional disk tier of ``num_disk_blocks`` (0 = none)."""

    def __init__(self, num_host_blocks: int, num_disk_blocks: int = 0):
        self.host = HostTier(num_host_blocks)
        self.disk: DiskTier | None = DiskTier(num_disk_blocks) if num_disk_blocks else None
        self.copies: list[BlockCopy] = []  # decided moves, not yet executed, in order
        self.num_swapped_out = 0  # blocks swapped out to held host slots (device -> host)
        self.num_swapped_in = 0  # ... and back (host -> device)

    def get(self, h: int) -> HostEntry | None:
        """The entry holding hash h in the host tier, else on disk (unverified: the caller matches
        its token ids and parent chain id)."""
        e = self.host.get(h)
        if e is None and self.disk is not None:
            e = self.disk.get(h)
        return e

    def write_back(self, device_block: int, h: int, token_ids: tuple[int, ...], chain_id: int,
                   parent_chain_id: int) -> None:
        """Keep cached ``device_block`` (about to be reused) in the host tier, spilling the host's LRU
        entry to disk when the host tier is full."""
        self._spill_lru()
        slot = self.host.put(h, token_ids, chain_id, parent_chain_id)
        if slot is not None:
            self.copies.append(BlockCopy(EVICT, device_block, slot))

    def _spill_lru(self) -> None:
        """With a disk tier and a full host tier: move the host's LRU entry to disk (SPILL)."""
        if self.disk is not None and self.host.is_full:
            victim = self.host.pop_lru()
            if victim is not None:
                slot = self.disk.put(victim.hash, victim.token_ids, victim.chain_id, victim.parent_chain_id)
                if slot is not None:
                    self.copies.append(BlockCopy(SPILL, -1, victim.slot, slot))

    # ---- swap preemption ---------------------------------------------------------------------
    def swap_out(self, device_block: int) -> int:
        """Copy a preempted sequence's ``device_block`` into a host slot held for it; returns the
        slot. Ask ``host.can_hold`` first: room comes from free slots, else the host LRU's entry
        (spilled to disk, or dropped without a disk tier)."""
        self._spill_lru()
        if self.host.is_full:
            self.host.drop_lru()
        slot = self.host.hold()
        self.copies.append(BlockCopy(EVICT, device_block, slot))
        self.num_swapped_out += 1
        return slot

    def swap_in(self, slot: int, device_block: int) -> None:
        """Copy held ``slot`` back into ``device_block``; the slot is free once that LOAD has run."""
        self.copies.append(BlockCopy(LOAD, device_block, slot))
        self.host.unhold(slot)
        self.num_swapped_in += 1

    def release_held(self, slots: list[int]) -> None:
        """A swapped-out sequence ended (abort, error): give its slots back, nothing to copy."""
        for slot in slots:
            self.host.unhold(slot)

    def pin(self, e: HostEntry) -> None:
        """Keep hit e in its tier until ``load`` (room made for other hits must not push it out)."""
        self._tier(e).pin(e.hash)

    def load(self, e: HostEntry, device_block: int) -> HostEntry:
        """Move hit e into ``device_block`` (the copy is planned before e's slot is freed)."""
        if e.tier == "disk":
            self.copies.append(BlockCopy(DISK_LOAD, device_block, -1, e.slot))
        else:
            self.copies.append(BlockCopy(LOAD, device_block, e.slot))
        return self._tier(e).take(e.hash)

    def supersede(self, h: int) -> HostEntry | None:
        """A device block now registers hash h: drop the lower-tier copy (tiers are exclusive) and
        return it, so the caller can carry its chain id over."""
        e = self.get(h)
        if e is not None:
            self._tier(e).drop(h)
        return e

    def take_copies(self) -> list[BlockCopy]:
        copies, self.copies = self.copies, []
        return copies

    def check_invariants(self) -> None:
        self.host.check_invariants()
        if self.disk is not None:
            self.disk.check_invariants()
            both = [h for h in self.host._entries if self.disk.get(h) is not None]
            if both:
                raise AssertionError(f"hashes {both[:3]} held in the host tier and on disk")

    def _tier(self, e: HostEntry) -> HostTier:
        return self.disk if e.tier == "disk" else self.host
