"""actors.kv_allocator's prefix cache: commit hashes full blocks, hits between live and freed
sequences, LRU eviction, hash collisions never give false hits, disabled caching."""
from __future__ import annotations

import pytest

from actors import kv_allocator
from actors.kv_allocator import KVBlockAllocator
from tests.kv_helpers import committed


def test_commit_hashes_only_full_committed_blocks():
    a = KVBlockAllocator(8, 4)
    a.allocate(1, [1, 2, 3, 4, 5, 6], extra_tokens=4)
    a.commit(1, [1, 2, 3], 3)  # partial block: nothing
    assert a.num_cached_blocks == 0
    a.commit(1, [1, 2, 3, 4, 5, 6], 6)  # block 0 full, block 1 partial
    b0, b1, b2 = a.block_table(1)
    assert a.num_cached_blocks == 1
    assert a._blocks[b0].hash is not None and a._blocks[b0].token_ids == (1, 2, 3, 4)
    assert a._blocks[b1].hash is None and a._blocks[b2].hash is None
    a.commit(1, [1, 2, 3, 4, 5, 6, 7, 8, 9], 9)  # now block 1 is full too
    assert a._blocks[b1].token_ids == (5, 6, 7, 8)
    assert a._blocks[b1].hash == kv_allocator.block_hash(a._blocks[b0].hash, (5, 6, 7, 8))
    assert a._blocks[b0].hash == kv_allocator.block_hash(None, (1, 2, 3, 4))
    assert a._blocks[b2].hash is None
    a.check_invariants()


def test_commit_errors():
    a = KVBlockAllocator(8, 2)
    a.allocate(1, [1, 2, 3])
    a.commit(1, [1, 2, 3], 2)
    with pytest.raises(ValueError, match="num_committed=1"):
        a.commit(1, [1, 2, 3], 1)  # backwards
    with pytest.raises(ValueError, match="num_tokens=3"):
        a.commit(1, [1, 2, 3, 4], 4)  # beyond the table
    with pytest.raises(ValueError, match=r"len\(token_ids\)=2"):
        a.commit(1, [1, 2], 3)
    with pytest.raises(KeyError, match="9"):
        a.commit(9, [1], 1)
    assert a.num_committed(1) == 2
    a.check_invariants()


def test_prefix_shared_between_live_sequences():
    a = KVBlockAllocator(16, 4)
    assert committed(a, 1, list(range(10))) == 0
    assert a.allocate(2, list(range(9)) + [99, 98]) == 8
    t1, t2 = a.block_table(1), a.block_table(2)
    assert t2[:2] == t1[:2] and t2[2] != t1[2]
    assert [a.ref_count(b) for b in t1] == [2, 2, 1]
    assert (a.prefix_queries, a.prefix_hits) == (21, 8)  # counted in tokens
    assert a.prefix_hit_rate == pytest.approx(8 / 21)
    a.free(1)
    assert [a.ref_count(b) for b in t2] == [1, 1, 1]
    a.free(2)
    assert a.num_free_blocks == 16
    a.check_invariants()


def test_without_use_cache_every_position_is_fresh_and_the_cache_stays_whole():
    """A sequence that wants every prompt row (prompt logprobs) takes no hit; committing its copy of
    a cached prefix keeps the cached blocks (an in-use duplicate stays uncached), and a later
    sequence still hits them."""
    a = KVBlockAllocator(16, 4)
    committed(a, 1, list(range(10)))
    t1 = a.block_table(1)
    assert a.can_allocate(list(range(10)), use_cache=False)
    assert a.allocate(2, list(range(10)), use_cache=False) == 0
    t2 = a.block_table(2)
    assert not set(t2) & set(t1) and a.prefix_hits == 0
    a.commit(2, list(range(10)), 10)
    assert a.num_cached_blocks == 2 and a.allocate(3, list(range(10))) == 8 and a.block_table(3)[:2] == t1[:2]
    a.check_invariants()


def test_prefix_reused_after_free_from_free_list():
    a = KVBlockAllocator(6, 4)
    committed(a, 1, list(range(10)))
    t1 = a.block_table(1)
    a.free(1)
    assert a.num_free_blocks == 6 and a.num_cached_blocks == 2
    assert a.allocate(2, list(range(12))) == 8
    t2 = a.block_table(2)
    assert t2[:2] == t1[:2]  # free-but-cached blocks taken back out of the free list
    assert a.num_free_blocks == 3 and all(a.ref_count(b) == 1 for b in t2)
    a.allocate(3, [50] * 12)  # takes the remaining free blocks, none of seq 2's
    assert a.num_free_blocks == 0 and not set(a.block_table(3)) & set(t2)
    a.check_invariants()


def test_preempt_then_reallocate_hits_own_blocks():
    a = KVBlockAllocator(8, 2)
    tokens = [3, 1, 4, 1, 5, 9, 2]
    committed(a, 1, tokens)
    table = a.block_table(1)
    a.free(1)
    assert a.allocate(1, tokens) == 6
    assert a.block_table(1)[:3] == table[:3]
    a.check_invariants()


def test_lru_eviction_least_recently_freed_first():
    a = KVBlockAllocator(4, 2)
    committed(a, 1, [1, 2, 3])  # block 0 cached, block 1 partial
    committed(a, 2, [5, 6, 7])
    a0, b0 = a.block_table(1)[0], a.block_table(2)[0]
    a.free(1)
    a.free(2)
    assert a.num_cached_blocks == 2
    a.allocate(3, [8] * 5)  # 3 fresh blocks: both uncached ones first, then the LRU cached a0
    assert a0 in a.block_table(3) and b0 not in a.block_table(3)
    assert a.num_cached_blocks == 1
    a.free(3)
    assert a.allocate(4, [5, 6, 7]) == 2 and a.block_table(4)[0] == b0
    assert a.allocate(5, [1, 2, 3]) == 0  # a0's entry was evicted
    a.check_invariants()


def test_lru_prefix_head_outlives_its_tail():
    a = KVBlockAllocator(4, 2)
    committed(a, 1, [1, 2, 3, 4, 5, 6])  # 3 cached blocks (the last is full)
    head = a.block_table(1)[0]
    a.free(1)
    a.allocate(2, [9] * 5)  # 3 fresh: the uncached block, then the tail blocks of seq 1
    assert head not in a.block_table(2)
    a.free(2)
    assert a.allocate(3, [1, 2, 9]) == 2 and a.block_table(3)[0] == head
    a.check_invariants()


def test_forced_hash_collision_gives_no_false_hit(monkeypatch):
    monkeypatch.setattr(kv_allocator, "block_hash", lambda prev, toks: 42)
    a = KVBlockAllocator(8, 2)
    committed(a, 1, [1, 2, 3, 4, 5])
    assert a.allocate(2, [7, 7, 3, 4, 5]) == 0  # same hash, different tokens
    assert a.allocate(3, [1, 2, 3, 4, 5]) == 2  # only block 0 could be registered under 42
    a.check_invariants()


def test_chain_is_verified_not_only_block_tokens(monkeypatch):
    # A hash that ignores the previous block: (5, 5) after (1, 1) and after (2, 2) collide.
    monkeypatch.setattr(kv_allocator, "block_hash", lambda prev, toks: hash(toks))
    a = KVBlockAllocator(16, 2)
    committed(a, 1, [1, 1, 5, 5, 9])
    committed(a, 2, [2, 2, 5, 5, 9])
    # Block (5, 5) of seq 1 holds KV computed after (1, 1): it must not serve a (2, 2) prefix.
    assert a.allocate(3, [2, 2, 5, 5, 9]) == 2
    assert a.block_table(3)[0] == a.block_table(2)[0]
    assert a.allocate(4, [1, 1, 5, 5, 9]) == 4
    assert a.block_table(4)[:2] == a.block_table(1)[:2]
    a.check_invariants()


def test_collision_stops_registering_the_rest_of_that_sequence(monkeypatch):
    monkeypatch.setattr(kv_allocator, "block_hash", lambda prev, toks: sum(toks) % 3)
    a = KVBlockAllocator(8, 3)
    # Block (1, 0, 0) collides with (0, 1, 0); block (1, 1, 0) must not be registered as if it
    # followed (0, 1, 0) directly.
    committed(a, 1, [0, 1, 0, 1, 0, 0, 1, 1, 0])
    assert a.allocate(2, [0, 1, 0, 1, 1, 0, 1, 1]) == 3
    a.check_invariants()


def test_duplicate_of_free_cached_block_takes_its_place():
    a = KVBlockAllocator(8, 2)
    a.allocate(1, [1, 2, 3, 4, 5])
    a.allocate(2, [1, 2, 3, 4, 5])  # computed twice: nothing cached yet
    a.commit(1, [1, 2, 3, 4, 5], 5)
    a.free(1)  # seq 1's blocks sit free in the cache
    a.commit(2, [1, 2, 3, 4, 5], 5)  # duplicates of free cached blocks: seq 2's take over
    assert a.num_cached_blocks == 2
    free_before = a.num_free_blocks
    assert a.allocate(3, [1, 2, 3, 4, 5]) == 4
    assert a.block_table(3)[:2] == a.block_table(2)[:2] and a.num_free_blocks == free_before - 1
    a.check_invariants()


def test_duplicate_of_in_use_block_continues_the_chain():
    a = KVBlockAllocator(8, 2)
    a.allocate(1, [1, 2, 3, 4, 5])
    a.allocate(2, [1, 2, 3, 4, 5], extra_tokens=2)
    a.commit(1, [1, 2, 3, 4, 5], 5)
    a.commit(2, [1, 2, 3, 4, 5, 6, 7], 7)  # blocks 0-1 duplicate seq 1's, block 2 is new
    assert a.num_cached_blocks == 3
    assert a.allocate(3, [1, 2, 3, 4, 5, 6, 7]) == 6
    t1, t2, t3 = a.block_table(1), a.block_table(2), a.block_table(3)
    assert t3[:3] == t1[:2] + t2[2:3]
    a.check_invariants()


def test_commit_after_hit_extends_the_chain():
    a = KVBlockAllocator(16, 2)
    committed(a, 1, [1, 2, 3, 4, 5])
    assert committed(a, 2, [1, 2, 3, 4, 5, 6, 7]) == 4
    assert a.allocate(3, [1, 2, 3, 4, 5, 6, 7, 8]) == 6
    assert a.block_table(3)[:3] == a.block_table(2)[:3]
    assert a.allocate(4, [5, 6, 7]) == 0  # block (5, 6) is cached only after (1, 2), (3, 4)
    a.check_invariants()


def test_prefix_caching_disabled():
    a = KVBlockAllocator(8, 2, enable_prefix_caching=False)
    committed(a, 1, [1, 2, 3, 4, 5])
    assert a.num_cached_blocks == 0
    assert a.allocate(2, [1, 2, 3, 4, 5]) == 0
    assert not set(a.block_table(1)) & set(a.block_table(2))
    assert a.prefix_queries == 10 and a.prefix_hit_rate == 0.0
    a.check_invariants()
