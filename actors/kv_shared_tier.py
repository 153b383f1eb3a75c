"""Shared KV tier: prefix-cache blocks that every replica of an application can fetch.

One ``SharedKVTier`` per application, run as a named Ray actor (``tier_actor``); replicas look it
up by name. Each entry holds a *payload*: in Ray the ObjectRef of one block's K/V in the object
store, in-process any object (tests). A replica publishes by putting its blocks in the object store
and passing their refs; the actor puts each block it stores again itself (``_own``), so that it
owns the copy it keeps: the block outlives its publisher and is freed when the entry goes (Ray
2.56 removed ``ray.put(_owner=...)``, which would have saved that copy).

Addressing and verification, as the allocator does it (actors/kv_allocator.py): blocks are keyed
by the chained block hash, which this tier computes itself from the token ids it is given (so no
replica's hash seed matters); an entry keeps its block's token ids, a chain id unique to the token
prefix it ends and its parent's chain id. A lookup walks the prefix from block 0 and takes an entry
only if its token ids equal the queried block's and its parent chain id is the chain id matched just
before: a hit is verified against the whole token prefix, never the hash alone, so a hash
collision cannot serve another prefix's K/V. Every call names a ``layout`` (the model and the
cache's dtype and block shape): each layout has a root chain of its own, so blocks of another model
sharing the tier's name are never served, whatever their tokens.

Capacity: ``capacity_bytes`` of payloads (the publisher states each block's size), LRU. A walk
touches its entries tail first, so a prefix's head is the most recently used and evicted last (an
evicted head makes its chain unreachable until it is published again).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from actors.kv_block import ROOT_CHAIN, block_hash


@dataclass(slots=True)
class SharedEntry:
    token_ids: tuple[int, ...]
    chain_id: int
    parent_chain_id: int
    payload: Any  # ObjectRef of the block's K/V (Ray), or the K/V itself (in-process)
    nbytes: int


class SharedKVTier:
    """Blocks of ``block_size`` tokens up to ``capacity_bytes`` of payload, LRU."""

    def __init__(self, capacity_bytes: int, block_size: int):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"shared KV tier capacity_bytes={capacity_bytes!r} must be an int >= 0 "
                             "(kv_tier.capacity_gb)")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"shared KV tier block_size={block_size!r} must be an int >= 1")
        self.capacity_bytes = capacity_bytes
        self.block_size = block_size
        self._entries: OrderedDict[int, SharedEntry] = OrderedDict()  # hash -> entry, LRU first
        self._next_chain_id = ROOT_CHAIN + 1
        self._roots: dict[str, int] = {}  # layout -> chain id of its empty prefix
        self.bytes_held = 0
        self.stats_ = {"put_blocks": 0, "put_bytes": 0, "put_rejected": 0, "evicted_blocks": 0,
                       "lookups": 0, "lookup_hits": 0, "hit_blocks": 0, "hit_bytes": 0}

    # ---- publish -------------------------------------------------------------------------------
    def put(self, layout: str, token_ids: list[int], start_block: int, payloads: list, nbytes: list[int]) -> int:
        """Store blocks ``start_block .. start_block + len(payloads) - 1`` of ``token_ids`` (whose
        length covers them). Blocks before ``start_block`` must be held here already (verified), or
        nothing is stored: a block is only reachable through its prefix. A block already held for
        the same prefix is kept as it is. Returns the blocks newly stored."""
        if len(payloads) != len(nbytes):
            raise ValueError(f"put: {len(payloads)} payloads but {len(nbytes)} sizes")
        end = start_block + len(payloads)
        if start_block < 0 or end * self.block_size > len(token_ids):
            raise ValueError(f"put: blocks [{start_block}, {end}) of {self.block_size} tokens need "
                             f"{end * self.block_size} token ids, got {len(token_ids)}")
        walked, prev_hash, prev_chain = self._walk(layout, token_ids, start_block)
        if len(walked) < start_block:  # the prefix is not here (never published, or evicted)
            self.stats_["put_rejected"] += len(payloads)
            self._touch(walked)
            return 0
        self._touch(walked)  # the prefix first: making room for its new blocks must not evict it
        stored = 0
        for i, (payload, size) in enumerate(zip(payloads, nbytes), start=start_block):
            toks = self._block(token_ids, i)
            h = self._hash(prev_hash, toks)
            e = self._entries.get(h)
            if e is None:
                if size > self.capacity_bytes:
                    self.stats_["put_rejected"] += end - i
                    break
                e = SharedEntry(toks, self._new_chain_id(), prev_chain, self._own(payload), int(size))
                self._insert(h, e)
                stored += 1
            elif not self._matches(e, toks, prev_chain):
                self.stats_["put_rejected"] += end - i  # collision: another prefix owns this hash
                break
            walked.append((h, e))
            prev_hash, prev_chain = h, e.chain_id
        self._touch(walked)
        return stored

    # ---- fetch ---------------------------------------------------------------------------------
    def lookup(self, layout: str, token_ids: list[int], start_block: int, max_blocks: int | None = None) -> list:
        """Payloads of the longest verified run of blocks from ``start_block`` (at most
        ``max_blocks``, and never the block holding the last token: its logits must be computed),
        every block of ``token_ids`` before it verified too; [] on a miss."""
        limit = (len(token_ids) - 1) // self.block_size
        if max_blocks is not None:
            limit = min(limit, start_block + max_blocks)
        self.stats_["lookups"] += 1
        walked, _, _ = self._walk(layout, token_ids, limit)
        self._touch(walked)
        hits = [e for _, e in walked[start_block:]] if len(walked) > start_block else []
        if hits:
            self.stats_["lookup_hits"] += 1
            self.stats_["hit_blocks"] += len(hits)
            self.stats_["hit_bytes"] += sum(e.nbytes for e in hits)
        return [e.payload for e in hits]

    def stats(self) -> dict:
        return {"capacity_bytes": self.capacity_bytes, "bytes": self.bytes_held, "blocks": len(self._entries),
                **self.stats_}

    def clear(self) -> None:
        """Drop every entry (their payloads are freed once no replica holds them)."""
        self._entries.clear()
        self.bytes_held = 0

    # ---- internals -----------------------------------------------------------------------------
    def _walk(self, layout: str, token_ids: list[int], num_blocks: int) -> tuple[list, int | None, int]:
        """Verified entries of blocks 0.. (at most ``num_blocks``) of ``layout`` as (hash, entry), and
        the hash and chain id after the last one."""
        walked: list[tuple[int, SharedEntry]] = []
        if layout not in self._roots:
            self._roots[layout] = self._new_chain_id()
        prev_hash, prev_chain = hash(("layout", layout)), self._roots[layout]
        for i in range(num_blocks):
            toks = self._block(token_ids, i)
            h = self._hash(prev_hash, toks)
            e = self._entries.get(h)
            if e is None or not self._matches(e, toks, prev_chain):
                break
            walked.append((h, e))
            prev_hash, prev_chain = h, e.chain_id
        return walked, prev_hash, prev_chain

    def _touch(self, walked: list[tuple[int, SharedEntry]]) -> None:
        """Most recently used, tail first: the head of a prefix ends up the last to be evicted."""
        for h, _ in reversed(walked):
            if h in self._entries:
                self._entries.move_to_end(h)

    def _insert(self, h: int, e: SharedEntry) -> None:
        while self._entries and self.bytes_held + e.nbytes > self.capacity_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes_held -= old.nbytes
            self.stats_["evicted_blocks"] += 1
        self._entries[h] = e
        self.bytes_held += e.nbytes
        self.stats_["put_blocks"] += 1
        self.stats_["put_bytes"] += e.nbytes

    def _block(self, token_ids: list[int], i: int) -> tuple[int, ...]:
        return tuple(int(t) for t in token_ids[i * self.block_size:(i + 1) * self.block_size])

    @staticmethod
    def _matches(e: SharedEntry, toks: tuple[int, ...], parent_chain_id: int) -> bool:
        return e.token_ids == toks and e.parent_chain_id == parent_chain_id

    def _hash(self, prev_hash: int | None, toks: tuple[int, ...]) -> int:
        return block_hash(prev_hash, toks)  # a method so tests can force collisions

    def _own(self, payload):
        """The payload to keep for a newly stored block (in-process: as given)."""
        return payload

    def _new_chain_id(self) -> int:
        self._next_chain_id += 1
        return self._next_chain_id - 1

    def check_invariants(self) -> None:
        assert self.bytes_held == sum(e.nbytes for e in self._entries.values()), "bytes_held out of sync"
        assert self.bytes_held <= self.capacity_bytes, f"{self.bytes_held} bytes held over {self.capacity_bytes}"


TIER_NAMESPACE = "specray"


def tier_actor(name: str, capacity_bytes: int, block_size: int):
    """The named shared-tier actor (created if absent, else the running one): owned by the calling
    process, so it lives as long as that process (the application's tier host, or a test)."""
    import ray

    cls = ray.remote(num_cpus=0, max_restarts=0)(_TierActor)
    return cls.options(name=name, namespace=TIER_NAMESPACE, get_if_exists=True).remote(capacity_bytes, block_size)


class _TierActor(SharedKVTier):
    """The tier in a Ray actor: payloads arrive as ObjectRefs owned by the publisher; the blocks it
    stores are fetched and put again, owned by this actor."""

    def _own(self, payload):
        import ray

        return ray.put(ray.get(payload))
