"""Disk KV tier: bookkeeping of prefix-cache blocks kept in a file's slots (no I/O here).

The host tier's LRU overflow lands here (write-back, a SPILL copy) instead of being dropped; a
prefix lookup that misses on the device and in host memory finds it here and loads it straight
into a fresh device block (DISK_LOAD). Entries keep what host entries keep (chained hash, token
ids, chain ids), so a disk hit is verified against the token prefix exactly like the others. When
every slot is taken the least recently used entry is dropped. The file and the copies live in
``actors.kv_disk_pool``; the chain device -> host -> disk is wired in ``actors.kv_tiers``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from actors.kv_host_tier import HostEntry, HostTier


@dataclass(slots=True)
class DiskEntry(HostEntry):
    tier: ClassVar[str] = "disk"


class DiskTier(HostTier):
    """``num_slots`` disk blocks, an LRU of cached entries keyed by chained hash."""

    label = "disk"
    entry_cls: ClassVar[type] = DiskEntry
