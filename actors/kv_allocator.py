"""Paged KV block allocator: block tables, ref counts and a chained-hash prefix cache.

Ask-then-do (nano-vllm style): every operation that needs free blocks has a `can_*` twin, and the
operation checks the same condition before it changes anything (raising OutOfBlocksError), so a
caller never has to roll back.

Positions of a sequence (its block table covers exactly `num_tokens` positions):

    [0, num_committed)            final KV: the prefix-cache hit after `allocate`, then `commit`
    [num_committed, num_tokens)   being written: prompt tail during prefill, speculative slots

A block lying wholly inside the committed prefix may be shared (prefix hits); a block that
holds any position >= num_committed belongs to exactly one sequence, so a write never lands in a
shared block. `truncate` never goes below num_committed, which keeps that true without copy-on-write
after the fact.

Prefix cache: when a full block becomes committed it gets hash = block_hash(prev_hash, tokens) and
is registered hash -> block id, storing its token ids, a unique `chain_id` and its parent's chain id.
A lookup takes a block only if its token ids equal the queried ones and its parent chain id is the
chain id of the block matched just before: a hit is verified against the whole token prefix, not
only against the hash, so a hash collision cannot give a false hit. Free blocks keep their cache
entry until reused. The free list is an OrderedDict: uncached blocks first, then cached ones, least
recently freed first (LRU eviction; a sequence frees its tail first); a hit on a free cached block
removes it in O(1).

Lower tiers (optional, ``num_host_blocks`` > 0, and below it ``num_disk_blocks``; actors/kv_tiers.py):
a cached block that LRU reuse takes from the free list is written back to the host tier instead of
being dropped (the host tier's own LRU overflow goes to disk), and a lookup that misses on the device
continues there (verified the same way); lower-tier hits are loaded into fresh device blocks. The
allocator only decides: each move is a ``BlockCopy`` collected until ``take_copies()``, which the
tensor owner executes, in order, before the step's forward. Swap preemption (actors/kv_swap.py)
moves a preempted sequence's table to host slots held for it (``swapped``) and back.

Stats: `prefix_queries` and `prefix_hits` count TOKENS (prompt tokens asked by `allocate`, tokens
served from the cache); `host_hits` and `disk_hits` count the tokens of `prefix_hits` that came from
the host tier and from disk.
"""
from __future__ import annotations

from collections import OrderedDict

from actors.kv_block import BROKEN_CHAIN, ROOT_CHAIN, Block, SeqTable, block_hash
from actors.kv_disk_tier import DiskTier
from actors.kv_host_tier import BlockCopy, HostEntry, HostTier
from actors.kv_invariants import check_allocator, check_count as _check_count, expect as _expect
from actors.kv_tiers import LowerTiers

class OutOfBlocksError(RuntimeError):
    """Not enough free KV blocks: ask with the matching `can_*` first, or preempt a sequence."""


class KVBlockAllocator:
    """Fixed-size KV blocks, one block table per sequence (int seq_id), prefix cache, LRU reuse."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_host_blocks: int = 0, num_disk_blocks: int = 0):
        self.num_blocks = _check_count("num_blocks", num_blocks, 1)
        n_host = _check_count("num_host_blocks", num_host_blocks, 0)
        n_disk = _check_count("num_disk_blocks", num_disk_blocks, 0)
        if n_disk and not n_host:
            raise ValueError(f"num_disk_blocks={n_disk} needs a host tier (num_host_blocks >= 1): the disk "
                             "tier holds what the host tier overflows")
        self.tiers: LowerTiers | None = LowerTiers(n_host, n_disk) if n_host else None
        self.host_hits = 0
        self.disk_hits = 0
        self.block_size = _check_count("block_size", block_size, 1)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # hash -> block id
        self._seqs: dict[int, SeqTable] = {}
        self.swapped: dict = {}  # seq_id -> actors.kv_swap.SwappedSeq: preempted, its blocks in held host slots
        self._next_chain_id = ROOT_CHAIN + 1
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def host(self) -> HostTier | None:
        return self.tiers.host if self.tiers is not None else None

    @property
    def disk(self) -> DiskTier | None:
        return self.tiers.disk if self.tiers is not None else None

    def host_hit_tokens(self, seq_id: int) -> int:
        """Tokens of seq_id's prefix hit (at allocate) that were loaded from the host tier."""
        return self._seq(seq_id).host_hit_tokens

    def disk_hit_tokens(self, seq_id: int) -> int:
        """Tokens of seq_id's prefix hit (at allocate) that were loaded from the disk tier."""
        return self._seq(seq_id).disk_hit_tokens

    def take_copies(self) -> list[BlockCopy]:
        """The tier moves decided since the last call, in the order they must be executed."""
        return self.tiers.take_copies() if self.tiers is not None else []

    def has_seq(self, seq_id: int) -> bool:
        """Whether seq_id has a block table (a swapped-out sequence has none until swapped in)."""
        return seq_id in self._seqs

    def is_swapped(self, seq_id: int) -> bool:
        return seq_id in self.swapped

    def ref_count(self, block: int) -> int:
        return self._blocks[block].ref_count

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).blocks)

    def num_tokens(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    def num_committed(self, seq_id: int) -> int:
        return self._seq(seq_id).num_committed

    def slot(self, seq_id: int, position: int) -> int:
        s = self._seq(seq_id)
        if not 0 <= position < s.num_tokens:
            raise IndexError(f"position {position} outside seq {seq_id}'s [0, {s.num_tokens})")
        return s.blocks[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        s, bs = self._seq(seq_id), self.block_size
        if not 0 <= start <= end <= s.num_tokens:
            raise IndexError(f"range [{start}, {end}) outside seq {seq_id}'s [0, {s.num_tokens})")
        return [s.blocks[p // bs] * bs + p % bs for p in range(start, end)]

    # ---- allocate ------------------------------------------------------------------------------
    def can_allocate(self, token_ids: list[int], extra_tokens: int = 0, use_cache: bool = True) -> bool:
        total = self._check_request(token_ids, extra_tokens)
        hits, _, _ = self._lookup(token_ids, use_cache)
        return self._allocate_cost(total, hits) <= len(self._free)

    def allocate(self, seq_id: int, token_ids: list[int], extra_tokens: int = 0, use_cache: bool = True) -> int:
        """Create seq_id's table for len(token_ids) + extra_tokens positions; return cached tokens
        (none without ``use_cache``: every position computed, its full blocks still registered)."""
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} already has a block table; free it first")
        total = self._check_request(token_ids, extra_tokens)
        hits, prev_hash, prev_chain_id = self._lookup(token_ids, use_cache)
        cost = self._allocate_cost(total, hits)
        if cost > len(self._free):
            raise OutOfBlocksError(f"allocate seq {seq_id!r} needs {cost} free blocks, "
                                   f"{len(self._free)} free: ask can_allocate first")
        blocks = self._take_hits(hits)
        blocks += [self._take_fresh() for _ in range(self._blocks_for(total) - len(hits))]
        hit_tokens = len(hits) * self.block_size
        host_tokens, disk_tokens = (sum(b.tier == t for b in hits) * self.block_size for t in ("host", "disk"))
        self._seqs[seq_id] = SeqTable(blocks, total, hit_tokens, prev_hash, prev_chain_id, host_tokens, disk_tokens)
        self.prefix_queries += len(token_ids)
        self.prefix_hits += hit_tokens
        self.host_hits += host_tokens
        self.disk_hits += disk_tokens
        return hit_tokens

    def _take_hits(self, hits: list[Block | HostEntry]) -> list[int]:
        """Reference the device hits, then load each lower-tier hit into a fresh device block (in
        order). Those are pinned first so evictions made room for them cannot push them out."""
        for b in hits:
            if isinstance(b, HostEntry):
                self.tiers.pin(b)
            else:
                if b.ref_count == 0:
                    del self._free[b.id]
                b.ref_count += 1
        out = []
        for b in hits:
            if isinstance(b, Block):
                out.append(b.id)
                continue
            bid = self._take_fresh()
            e = self.tiers.load(b, bid)
            self._set_cached(self._blocks[bid], e.hash, e.token_ids, e.parent_chain_id, e.chain_id)
            out.append(bid)
        return out

    # ---- grow / shrink -------------------------------------------------------------------------
    def can_append(self, seq_id: int, num_tokens: int) -> bool:
        s = self._seq(seq_id)
        num_tokens = _check_count("num_tokens", num_tokens, 0)
        return self._blocks_for(num_tokens) - len(s.blocks) <= len(self._free)

    def append(self, seq_id: int, num_tokens: int) -> None:
        """Grow seq_id's table to cover num_tokens positions (e.g. speculative tree slots).
        Never shrinks: asking for no more than it already covers is a no-op (see truncate)."""
        s = self._seq(seq_id)
        num_tokens = _check_count("num_tokens", num_tokens, 0)
        if num_tokens <= s.num_tokens:
            return
        need = self._blocks_for(num_tokens) - len(s.blocks)
        if need > len(self._free):
            raise OutOfBlocksError(f"append seq {seq_id!r} to {num_tokens} tokens needs {need} "
                                   f"free blocks, {len(self._free)} free: ask can_append first")
        s.blocks += [self._take_fresh() for _ in range(need)]
        s.num_tokens = num_tokens

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Release the blocks beyond those covering num_tokens positions (rejected speculation)."""
        s = self._seq(seq_id)
        num_tokens = _check_count("num_tokens", num_tokens, 0)
        if not s.num_committed <= num_tokens <= s.num_tokens:
            raise ValueError(f"truncate seq {seq_id!r} to {num_tokens}: must lie in "
                             f"[num_committed={s.num_committed}, num_tokens={s.num_tokens}]")
        keep = self._blocks_for(num_tokens)
        for bid in reversed(s.blocks[keep:]):
            self._release(bid)
        del s.blocks[keep:]
        s.num_tokens = num_tokens

    # ---- commit (prefix cache registration) ----------------------------------------------------
    def commit(self, seq_id: int, token_ids: list[int], num_committed: int) -> None:
        """Positions [0, num_committed) hold final KV of token_ids[:num_committed]; full blocks
        among them that are not yet hashed are hashed and registered in the prefix cache."""
        s = self._seq(seq_id)
        num_committed = _check_count("num_committed", num_committed, 0)
        if not s.num_committed <= num_committed <= min(s.num_tokens, len(token_ids)):
            raise ValueError(
                f"commit seq {seq_id!r}: num_committed={num_committed} must lie in [{s.num_committed}"
                f", min(num_tokens={s.num_tokens}, len(token_ids)={len(token_ids)})]")
        bs = self.block_size
        if self.enable_prefix_caching:
            for i in range(s.num_committed // bs, num_committed // bs):
                self._register(s, self._blocks[s.blocks[i]], tuple(token_ids[i * bs:(i + 1) * bs]))
        s.num_committed = num_committed

    def _register(self, s: SeqTable, block: Block, toks: tuple[int, ...]) -> None:
        h = self._hash(s.prev_hash, toks)
        s.prev_hash = h
        if s.prev_chain_id == BROKEN_CHAIN:
            return
        other_id = self._cached.get(h)
        if other_id is None:
            self._set_cached(block, h, toks, s.prev_chain_id, self._lower_chain_id(h, toks, s.prev_chain_id))
        elif not self._matches(self._blocks[other_id], toks, s.prev_chain_id):
            s.prev_chain_id = BROKEN_CHAIN  # collision: a different prefix owns this hash
            return
        elif self._blocks[other_id].ref_count == 0:
            # Same content sits free in the cache: retire it, `block` takes its place and chain id
            # (so blocks registered after it stay reachable).
            other = self._blocks[other_id]
            chain_id = other.chain_id
            del self._cached[h]
            other.clear()
            self._free.move_to_end(other_id, last=False)
            self._set_cached(block, h, toks, s.prev_chain_id, chain_id)
        else:
            block = self._blocks[other_id]  # in-use duplicate: keep it, our copy stays uncached
        s.prev_chain_id = block.chain_id

    def _lower_chain_id(self, h: int, toks: tuple[int, ...], parent_chain_id: int) -> int:
        """A new device entry supersedes a host or disk copy of the same hash (tiers are exclusive);
        when that copy holds the same prefix, its chain id carries over so its children in the lower
        tiers stay reachable."""
        e = self.tiers.supersede(h) if self.tiers is not None else None
        if e is None:
            return self._new_chain_id()
        same = e.token_ids == toks and e.parent_chain_id == parent_chain_id
        return e.chain_id if same else self._new_chain_id()

    # ---- free ----------------------------------------------------------------------------------
    def free(self, seq_id: int) -> None:
        """Drop seq_id's table (finish, abort, preempt, error), or its swapped-out blocks; cached
        blocks stay reusable."""
        s = self._seqs.pop(seq_id, None)
        if s is None and seq_id in self.swapped:  # ended while swapped out: its host slots go back
            return self.tiers.release_held(self.swapped.pop(seq_id).slots)
        if s is None:
            raise KeyError(f"unknown seq_id {seq_id!r}: no block table (never allocated or "
                           "already freed)")
        for bid in reversed(s.blocks):  # tail first, so a prefix's head is evicted last
            self._release(bid)

    # ---- invariants (tests) --------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the allocator's bookkeeping is inconsistent (both tiers)."""
        check_allocator(self)

    # ---- internals -----------------------------------------------------------------------------
    def _seq(self, seq_id: int) -> SeqTable:
        s = self._seqs.get(seq_id)
        if s is None:
            raise KeyError(f"unknown seq_id {seq_id!r}: no block table")
        return s

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _check_request(self, token_ids: list[int], extra_tokens: int) -> int:
        if len(token_ids) == 0:
            raise ValueError("token_ids is empty: a sequence needs at least one prompt token")
        return len(token_ids) + _check_count("extra_tokens", extra_tokens, 0)

    def _allocate_cost(self, total: int, hits: list[Block | HostEntry]) -> int:
        """Free blocks taken: fresh ones (host hits load into fresh ones) plus device hit blocks that
        currently sit in the free list."""
        dev = [b for b in hits if isinstance(b, Block)]
        return self._blocks_for(total) - len(dev) + sum(b.ref_count == 0 for b in dev)

    def _lookup(self, token_ids: list[int], use_cache: bool = True) -> tuple[list[Block | HostEntry], int | None, int]:
        """Longest verified cached prefix of whole blocks (device, else host tier), never including
        the last token (none without ``use_cache``)."""
        hits: list[Block | HostEntry] = []
        prev_hash, prev_chain_id = None, ROOT_CHAIN
        if not (self.enable_prefix_caching and use_cache):
            return hits, prev_hash, prev_chain_id
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            toks = tuple(token_ids[i * bs:(i + 1) * bs])
            h = self._hash(prev_hash, toks)
            bid = self._cached.get(h)
            hit = self._blocks[bid] if bid is not None else (self.tiers.get(h) if self.tiers else None)
            if hit is None or not self._matches(hit, toks, prev_chain_id):
                break
            hits.append(hit)
            prev_hash, prev_chain_id = h, hit.chain_id
        return hits, prev_hash, prev_chain_id

    @staticmethod
    def _matches(block: Block | HostEntry, toks: tuple[int, ...], parent_chain_id: int) -> bool:
        return block.token_ids == toks and block.parent_chain_id == parent_chain_id

    def _hash(self, prev_hash: int | None, toks: tuple[int, ...]) -> int:
        return block_hash(prev_hash, toks)  # module-level so tests can force collisions

    def _new_chain_id(self) -> int:
        self._next_chain_id += 1
        return self._next_chain_id - 1

    def _set_cached(self, b: Block, h: int, toks: tuple[int, ...], parent: int, chain: int) -> None:
        b.hash, b.token_ids, b.parent_chain_id, b.chain_id = h, toks, parent, chain
        self._cached[h] = b.id

    def _take_fresh(self) -> int:
        """Pop the first free block (uncached, else least recently freed), evicting its hash."""
        bid, _ = self._free.popitem(last=False)
        b = self._blocks[bid]
        if b.hash is not None:
            if self.tiers is not None:  # write back before the block is reused
                self.tiers.write_back(bid, b.hash, b.token_ids, b.chain_id, b.parent_chain_id)
            del self._cached[b.hash]
            b.clear()
        b.ref_count = 1
        return bid

    def _release(self, bid: int) -> None:
        b = self._blocks[bid]
        _expect(b.ref_count > 0, f"block {bid}: release with ref_count {b.ref_count}")
        b.ref_count -= 1
        if b.ref_count == 0:
            self._free[bid] = None
            if b.hash is None:
                self._free.move_to_end(bid, last=False)  # nothing cached: reuse it first

