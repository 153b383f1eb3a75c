"""Tests for actors.kv_allocator: unit tests per method and error, prefix cache, and a Hypothesis
state machine that checks the allocator against an independent model of block ownership."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors import kv_allocator
from actors.kv_allocator import KVBlockAllocator, OutOfBlocksError


def _committed(alloc: KVBlockAllocator, seq_id: int, tokens: list[int], extra: int = 0) -> int:
    """Allocate and commit all of `tokens` (as after a prefill); return the prefix hit."""
    hit = alloc.allocate(seq_id, tokens, extra)
    alloc.commit(seq_id, tokens, len(tokens))
    return hit


# ---- construction --------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, bad", [
    (dict(num_blocks=0, block_size=4), "0"),
    (dict(num_blocks=-3, block_size=4), "-3"),
    (dict(num_blocks=2.5, block_size=4), "2.5"),
    (dict(num_blocks=True, block_size=4), "True"),
    (dict(num_blocks=8, block_size=0), "0"),
    (dict(num_blocks=8, block_size="4"), "'4'"),
])
def test_init_rejects_bad_sizes(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        KVBlockAllocator(**kwargs)


def test_init_state():
    a = KVBlockAllocator(8, 4)
    assert (a.num_free_blocks, a.num_used_blocks, a.usage) == (8, 0, 0.0)
    assert (a.prefix_queries, a.prefix_hits, a.prefix_hit_rate, a.num_cached_blocks) == (0, 0, 0.0, 0)
    a.check_invariants()


# ---- allocate --------------------------------------------------------------------------------------
def test_allocate_covers_tokens_and_extra():
    a = KVBlockAllocator(8, 4)
    assert a.allocate(1, list(range(10))) == 0
    assert len(a.block_table(1)) == 3 and a.num_tokens(1) == 10 and a.num_committed(1) == 0
    assert a.allocate(2, [1, 2, 3, 4], extra_tokens=1) == 0
    assert len(a.block_table(2)) == 2 and a.num_tokens(2) == 5
    assert (a.num_used_blocks, a.num_free_blocks, a.usage) == (5, 3, 5 / 8)
    assert a.has_seq(1) and not a.has_seq(3)
    assert all(a.ref_count(b) == 1 for b in a.block_table(1) + a.block_table(2))
    a.check_invariants()


def test_allocate_errors_change_nothing():
    a = KVBlockAllocator(4, 2)
    a.allocate(1, [1, 2, 3])
    with pytest.raises(ValueError, match="seq_id 1 already"):
        a.allocate(1, [5])
    with pytest.raises(ValueError, match="empty"):
        a.allocate(2, [])
    with pytest.raises(ValueError, match="-1"):
        a.allocate(2, [1], extra_tokens=-1)
    assert not a.can_allocate([7] * 5)
    with pytest.raises(OutOfBlocksError, match="can_allocate"):
        a.allocate(2, [7] * 5)
    assert a.can_allocate([7] * 4)
    assert not a.has_seq(2) and a.num_free_blocks == 2 and a.block_table(1) == [0, 1]
    a.check_invariants()


def test_can_allocate_counts_in_use_hits_as_free_of_cost():
    a = KVBlockAllocator(4, 2)
    _committed(a, 1, [1, 2, 3, 4, 5])  # 3 blocks, first two cached and in use
    assert a.num_free_blocks == 1
    assert a.can_allocate([1, 2, 3, 4, 9])  # 2 shared blocks + 1 fresh
    assert not a.can_allocate([1, 2, 3, 4, 9, 9, 9])  # needs 2 fresh
    assert a.allocate(2, [1, 2, 3, 4, 9]) == 4
    assert a.block_table(2)[:2] == a.block_table(1)[:2]
    assert [a.ref_count(b) for b in a.block_table(1)] == [2, 2, 1]
    a.check_invariants()


def test_can_allocate_counts_free_cached_hits_as_costing_a_block():
    a = KVBlockAllocator(3, 2)
    _committed(a, 1, [1, 2, 3, 4, 5])
    a.free(1)
    assert a.num_free_blocks == 3 and a.num_cached_blocks == 2
    assert a.can_allocate([1, 2, 3, 4, 5, 6])  # 2 free cached hits + 1 fresh = 3
    assert not a.can_allocate([1, 2, 3, 4, 5, 6, 7])  # 2 free cached hits + 2 fresh = 4 > 3
    with pytest.raises(OutOfBlocksError):
        a.allocate(2, [1, 2, 3, 4, 5, 6, 7])
    assert a.allocate(2, [1, 2, 3, 4, 5, 6]) == 4
    assert a.num_free_blocks == 0
    a.check_invariants()


def test_hit_never_includes_last_token():
    a = KVBlockAllocator(16, 2)
    _committed(a, 1, [1, 2, 3, 4, 5, 6])
    assert a.allocate(2, [1, 2, 3, 4]) == 2  # whole blocks, capped below the last token
    assert a.allocate(3, [1, 2, 3, 4, 5]) == 4
    assert a.allocate(4, [1, 2, 3, 4, 5, 6]) == 4
    assert a.allocate(5, [1, 2, 3, 4, 5, 6, 7]) == 6
    assert a.allocate(6, [1]) == 0
    assert a.num_committed(5) == 6
    a.check_invariants()


# ---- append / truncate -------------------------------------------------------------------------------
def test_append_grows_and_checks():
    a = KVBlockAllocator(4, 4)
    a.allocate(1, [1, 2, 3])
    first = a.block_table(1)
    a.append(1, 4)  # still within block 0
    assert a.block_table(1) == first and a.num_tokens(1) == 4
    assert a.can_append(1, 16) and not a.can_append(1, 17)
    a.append(1, 9)
    assert a.block_table(1)[:1] == first and len(a.block_table(1)) == 3
    with pytest.raises(OutOfBlocksError, match="can_append"):
        a.append(1, 17)
    assert a.num_tokens(1) == 9 and len(a.block_table(1)) == 3
    assert a.can_append(1, 5)
    a.append(1, 5)  # never shrinks: a no-op
    assert a.num_tokens(1) == 9 and len(a.block_table(1)) == 3
    with pytest.raises(ValueError, match="-2"):
        a.can_append(1, -2)
    with pytest.raises(ValueError, match="-1"):
        a.append(1, -1)
    with pytest.raises(KeyError, match="7"):
        a.append(7, 3)
    with pytest.raises(KeyError, match="7"):
        a.can_append(7, 3)
    a.check_invariants()


def test_truncate_releases_speculative_blocks():
    a = KVBlockAllocator(8, 2)
    a.allocate(1, [1, 2, 3])
    a.commit(1, [1, 2, 3], 3)
    a.append(1, 9)  # 6 speculative slots
    assert len(a.block_table(1)) == 5 and a.num_free_blocks == 3
    a.truncate(1, 5)
    assert len(a.block_table(1)) == 3 and a.num_free_blocks == 5 and a.num_tokens(1) == 5
    a.truncate(1, 5)  # no-op
    with pytest.raises(ValueError, match="num_committed=3"):
        a.truncate(1, 2)
    with pytest.raises(ValueError, match="6"):
        a.truncate(1, 6)
    with pytest.raises(KeyError, match="4"):
        a.truncate(4, 0)
    a.truncate(1, 3)
    assert len(a.block_table(1)) == 2
    a.check_invariants()


def test_truncate_to_zero_then_append():
    a = KVBlockAllocator(4, 2)
    a.allocate(1, [1, 2, 3])
    a.truncate(1, 0)
    assert a.block_table(1) == [] and a.num_free_blocks == 4
    a.append(1, 3)
    assert len(a.block_table(1)) == 2
    a.check_invariants()


# ---- commit / prefix cache -------------------------------------------------------------------------
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
    assert _committed(a, 1, list(range(10))) == 0
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


def test_prefix_reused_after_free_from_free_list():
    a = KVBlockAllocator(6, 4)
    _committed(a, 1, list(range(10)))
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
    _committed(a, 1, tokens)
    table = a.block_table(1)
    a.free(1)
    assert a.allocate(1, tokens) == 6
    assert a.block_table(1)[:3] == table[:3]
    a.check_invariants()


def test_lru_eviction_least_recently_freed_first():
    a = KVBlockAllocator(4, 2)
    _committed(a, 1, [1, 2, 3])  # block 0 cached, block 1 partial
    _committed(a, 2, [5, 6, 7])
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
    _committed(a, 1, [1, 2, 3, 4, 5, 6])  # 3 cached blocks (the last is full)
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
    _committed(a, 1, [1, 2, 3, 4, 5])
    assert a.allocate(2, [7, 7, 3, 4, 5]) == 0  # same hash, different tokens
    assert a.allocate(3, [1, 2, 3, 4, 5]) == 2  # only block 0 could be registered under 42
    a.check_invariants()


def test_chain_is_verified_not_only_block_tokens(monkeypatch):
    # A hash that ignores the previous block: (5, 5) after (1, 1) and after (2, 2) collide.
    monkeypatch.setattr(kv_allocator, "block_hash", lambda prev, toks: hash(toks))
    a = KVBlockAllocator(16, 2)
    _committed(a, 1, [1, 1, 5, 5, 9])
    _committed(a, 2, [2, 2, 5, 5, 9])
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
    _committed(a, 1, [0, 1, 0, 1, 0, 0, 1, 1, 0])
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
    _committed(a, 1, [1, 2, 3, 4, 5])
    assert _committed(a, 2, [1, 2, 3, 4, 5, 6, 7]) == 4
    assert a.allocate(3, [1, 2, 3, 4, 5, 6, 7, 8]) == 6
    assert a.block_table(3)[:3] == a.block_table(2)[:3]
    assert a.allocate(4, [5, 6, 7]) == 0  # block (5, 6) is cached only after (1, 2), (3, 4)
    a.check_invariants()


def test_prefix_caching_disabled():
    a = KVBlockAllocator(8, 2, enable_prefix_caching=False)
    _committed(a, 1, [1, 2, 3, 4, 5])
    assert a.num_cached_blocks == 0
    assert a.allocate(2, [1, 2, 3, 4, 5]) == 0
    assert not set(a.block_table(1)) & set(a.block_table(2))
    assert a.prefix_queries == 10 and a.prefix_hit_rate == 0.0
    a.check_invariants()


# ---- fork ----------------------------------------------------------------------------------------
def test_fork_shares_full_blocks_and_copies_partial():
    a = KVBlockAllocator(8, 4)
    _committed(a, 1, list(range(6)))
    parent = a.block_table(1)
    assert a.can_fork(1)
    copies = a.fork(1, 2)
    child = a.block_table(2)
    assert child[0] == parent[0] and copies == [(parent[1], child[1])] and child[1] != parent[1]
    assert (a.ref_count(parent[0]), a.ref_count(parent[1]), a.ref_count(child[1])) == (2, 1, 1)
    assert (a.num_tokens(2), a.num_committed(2)) == (6, 6)
    a.append(2, 9)  # the child writes only into its own blocks
    a.commit(2, list(range(6)) + [7, 7, 7], 9)
    a.check_invariants()
    a.free(1)
    a.free(2)
    assert a.num_free_blocks == 8
    a.check_invariants()


def test_fork_child_commits_extend_the_chain():
    a = KVBlockAllocator(16, 2)
    _committed(a, 1, [1, 2, 3, 4, 5])
    a.fork(1, 2)
    a.append(2, 7)
    a.commit(2, [1, 2, 3, 4, 5, 6, 7], 7)  # the copied partial block (5, _) is now full
    assert a.allocate(3, [1, 2, 3, 4, 5, 6, 9]) == 6
    assert a.block_table(3)[:3] == a.block_table(2)[:3]
    assert a.allocate(4, [5, 6, 9]) == 0
    a.check_invariants()


def test_fork_block_aligned_copies_nothing():
    a = KVBlockAllocator(4, 2)
    _committed(a, 1, [1, 2, 3, 4])
    assert a.fork(1, 2) == []
    assert a.block_table(2) == a.block_table(1)
    assert all(a.ref_count(b) == 2 for b in a.block_table(1))
    a.append(2, 5)  # a fresh block: the shared ones are never written
    assert a.block_table(2)[2] not in a.block_table(1)
    a.check_invariants()


def test_fork_copies_speculative_slots_too():
    a = KVBlockAllocator(8, 2)
    _committed(a, 1, [1, 2, 3])
    a.append(1, 7)  # blocks: [full committed, partial committed, spec, spec]
    parent = a.block_table(1)
    copies = a.fork(1, 2)
    assert [src for src, _ in copies] == parent[1:]
    assert a.block_table(2) == parent[:1] + [dst for _, dst in copies]
    a.check_invariants()


def test_fork_errors():
    a = KVBlockAllocator(3, 2)
    a.allocate(1, [1, 2, 3])
    with pytest.raises(KeyError, match="5"):
        a.fork(5, 6)
    with pytest.raises(KeyError, match="5"):
        a.can_fork(5)
    a.allocate(2, [1])
    with pytest.raises(ValueError, match="2"):
        a.fork(1, 2)
    a.free(2)
    assert not a.can_fork(1)  # nothing committed: both blocks must be copied, 1 free
    with pytest.raises(OutOfBlocksError, match="can_fork"):
        a.fork(1, 3)
    assert not a.has_seq(3) and a.num_free_blocks == 1
    a.check_invariants()


# ---- free / queries ----------------------------------------------------------------------------------
def test_free_unknown_and_double_free():
    a = KVBlockAllocator(4, 2)
    with pytest.raises(KeyError, match="123"):
        a.free(123)
    a.allocate(1, [1])
    a.free(1)
    with pytest.raises(KeyError, match="1"):
        a.free(1)
    assert a.num_free_blocks == 4
    a.check_invariants()


def test_slots():
    a = KVBlockAllocator(8, 4)
    a.allocate(1, [0] * 3)
    a.allocate(2, [0] * 6)
    t = a.block_table(2)
    assert a.slot(2, 0) == t[0] * 4 and a.slot(2, 5) == t[1] * 4 + 1
    assert a.slots(2, 2, 6) == [t[0] * 4 + 2, t[0] * 4 + 3, t[1] * 4, t[1] * 4 + 1]
    assert a.slots(2, 3, 3) == []
    for bad in (-1, 6):
        with pytest.raises(IndexError, match=str(bad)):
            a.slot(2, bad)
    with pytest.raises(IndexError):
        a.slots(2, 4, 7)
    with pytest.raises(IndexError):
        a.slots(2, 3, 2)
    with pytest.raises(KeyError):
        a.slot(9, 0)
    with pytest.raises(KeyError):
        a.block_table(9)


def test_check_invariants_detects_corruption():
    a = KVBlockAllocator(4, 2)
    _committed(a, 1, [1, 2, 3])
    a._blocks[a.block_table(1)[0]].ref_count += 1
    with pytest.raises(AssertionError, match="ref_count"):
        a.check_invariants()
    b = KVBlockAllocator(4, 2)
    _committed(b, 1, [1, 2, 3, 4, 5])
    _committed(b, 2, [1, 2, 3, 4, 5])
    b._seqs[1].num_committed = 0  # seq 1 would now write into blocks it shares with seq 2
    with pytest.raises(AssertionError, match="written into"):
        b.check_invariants()


# ---- Hypothesis state machine ----------------------------------------------------------------------
def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


# Tiny vocabulary and a few shared prompt heads, so that prefix hits (and evictions) are frequent.
_HEADS = ((), (0, 1, 0, 1, 1, 0, 1, 1), (0, 1, 0, 1, 0, 0), (1, 1, 1, 1, 1, 1, 1, 1))
_tokens = st.builds(lambda head, tail: list(head) + tail, st.sampled_from(_HEADS),
                    st.lists(st.integers(0, 1), max_size=5)).filter(bool)
_MAX_SEQS = 5  # keeps the pool from being full most of the time


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/append/truncate/commit/fork/free/preempt. The model tracks each table,
    the tokens whose KV each committed full block holds (`content`, the whole prefix through that
    block), and derives ref counts and free counts on its own."""

    allocator_cls = KVBlockAllocator

    @initialize(num_blocks=st.integers(8, 32), block_size=st.integers(2, 4),
                caching=st.sampled_from([True, True, True, False]))
    def setup(self, num_blocks, block_size, caching):
        self.a = self.allocator_cls(num_blocks, block_size, enable_prefix_caching=caching)
        self.nb, self.bs, self.caching = num_blocks, block_size, caching
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}  # known tokens of each sequence
        self.ntok: dict[int, int] = {}
        self.ncommit: dict[int, int] = {}
        self.content: dict[int, tuple[int, ...]] = {}
        self.next_id = 0

    # -- model helpers
    def _used(self) -> set[int]:
        return {b for t in self.tables.values() for b in t}

    def _model_free(self) -> int:
        return self.nb - len(self._used())

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _check_fresh(self, blocks: list[int], used_before: set[int]) -> None:
        assert len(set(blocks)) == len(blocks) and not set(blocks) & used_before
        for b in blocks:
            self.content.pop(b, None)  # handed out for writing: old KV is gone

    def _allocate(self, sid: int, tokens: list[int], extra: int) -> None:
        if not self.a.can_allocate(tokens, extra):
            free_before = self.a.num_free_blocks
            with pytest.raises(OutOfBlocksError):
                self.a.allocate(sid, tokens, extra)
            assert not self.a.has_seq(sid) and self.a.num_free_blocks == free_before
            return
        used = self._used()
        hit = self.a.allocate(sid, tokens, extra)
        table = self.a.block_table(sid)
        total = len(tokens) + extra
        assert len(table) == _ceil_div(total, self.bs)
        assert hit % self.bs == 0 and hit <= (len(tokens) - 1) // self.bs * self.bs
        assert self.caching or hit == 0
        for i in range(hit // self.bs):  # every hit block holds KV of exactly this prefix
            assert self.content.get(table[i]) == tuple(tokens[:(i + 1) * self.bs])
        self._check_fresh(table[hit // self.bs:], used)
        self.tables[sid], self.tokens[sid] = table, list(tokens)
        self.ntok[sid], self.ncommit[sid] = total, hit

    def _forget(self, sid: int) -> None:
        for d in (self.tables, self.tokens, self.ntok, self.ncommit):
            del d[sid]

    def _pick(self, data) -> int:
        return data.draw(st.sampled_from(sorted(self.tables)), label="seq")

    # -- rules
    @precondition(lambda self: len(self.tables) < _MAX_SEQS)
    @rule(tokens=_tokens, extra=st.integers(0, 3))
    def allocate(self, tokens, extra):
        self._allocate(self._new_id(), tokens, extra)

    @precondition(lambda self: len(self.tables) < _MAX_SEQS)
    @rule(tokens=_tokens, over=st.integers(-1, 2))
    def allocate_to_fill(self, tokens, over):
        """Ask for about as many blocks as are free plus what a prefix hit could save: exercises
        can_allocate at the boundary, where free-but-cached hits must be paid for."""
        blocks = self._model_free() + (len(tokens) - 1) // self.bs + over
        self._allocate(self._new_id(), tokens, max(0, blocks * self.bs - len(tokens)))

    @precondition(lambda self: len(self.tables) < _MAX_SEQS)
    @rule(tokens=_tokens)
    def allocate_and_prefill(self, tokens):
        sid = self._new_id()
        self._allocate(sid, tokens, 0)
        if sid in self.tables:
            self.a.commit(sid, tokens, len(tokens))
            self._record_commit(sid, tokens, len(tokens))

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), grow=st.integers(-2, 6))
    def append(self, data, grow):
        sid = self._pick(data)
        n = max(0, self.ntok[sid] + grow)  # grow <= 0: a no-op
        expected = _ceil_div(n, self.bs) - len(self.tables[sid]) <= self._model_free()
        assert self.a.can_append(sid, n) == expected
        if not expected:
            with pytest.raises(OutOfBlocksError):
                self.a.append(sid, n)
            return
        used, old = self._used(), self.tables[sid]
        self.a.append(sid, n)
        table = self.a.block_table(sid)
        assert table[:len(old)] == old
        self._check_fresh(table[len(old):], used)
        self.tables[sid], self.ntok[sid] = table, max(n, self.ntok[sid])

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def truncate(self, data):
        sid = self._pick(data)
        n = data.draw(st.integers(self.ncommit[sid], self.ntok[sid]), label="n")
        self.a.truncate(sid, n)
        self.tables[sid] = self.tables[sid][:_ceil_div(n, self.bs)]
        self.ntok[sid], self.tokens[sid] = n, self.tokens[sid][:n]

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def commit(self, data):
        sid = self._pick(data)
        n = data.draw(st.integers(self.ncommit[sid], self.ntok[sid]), label="n")
        toks = self.tokens[sid]
        if len(toks) < n:  # generated tokens become known when committed
            toks += data.draw(st.lists(st.integers(0, 1), min_size=n - len(toks),
                                       max_size=n - len(toks)), label="generated")
        self.a.commit(sid, toks, n)
        self._record_commit(sid, toks, n)

    def _record_commit(self, sid: int, toks: list[int], n: int) -> None:
        for i in range(self.ncommit[sid] // self.bs, n // self.bs):
            self.content[self.tables[sid][i]] = tuple(toks[:(i + 1) * self.bs])
        self.ncommit[sid] = n

    @precondition(lambda self: 0 < len(self.tables) < _MAX_SEQS)
    @rule(data=st.data())
    def fork(self, data):
        pid, cid = self._pick(data), self._new_id()
        n_shared = self.ncommit[pid] // self.bs
        expected = len(self.tables[pid]) - n_shared <= self._model_free()
        assert self.a.can_fork(pid) == expected
        if not expected:
            with pytest.raises(OutOfBlocksError):
                self.a.fork(pid, cid)
            return
        used, parent = self._used(), self.tables[pid]
        copies = self.a.fork(pid, cid)
        assert [src for src, _ in copies] == parent[n_shared:]
        dsts = [dst for _, dst in copies]
        self._check_fresh(dsts, used)
        assert self.a.block_table(cid) == parent[:n_shared] + dsts
        self.tables[cid], self.tokens[cid] = parent[:n_shared] + dsts, list(self.tokens[pid])
        self.ntok[cid], self.ncommit[cid] = self.ntok[pid], self.ncommit[pid]

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free(self, data):
        sid = self._pick(data)
        self.a.free(sid)
        self._forget(sid)

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def preempt(self, data):
        sid = self._pick(data)
        tokens = self.tokens[sid]
        self.a.free(sid)
        self._forget(sid)
        if tokens:
            self._allocate(sid, tokens, 0)

    @rule(sid=st.integers(-3, 0))
    def free_unknown(self, sid):
        with pytest.raises(KeyError, match=str(sid)):
            self.a.free(sid)

    # -- checks
    @invariant()
    def consistent(self):
        if not hasattr(self, "a"):
            return
        self.a.check_invariants()
        refs = [0] * self.nb
        for sid, table in self.tables.items():
            assert self.a.block_table(sid) == table
            assert (self.a.num_tokens(sid), self.a.num_committed(sid)) == (self.ntok[sid],
                                                                          self.ncommit[sid])
            for b in table:
                refs[b] += 1
        assert [self.a.ref_count(b) for b in range(self.nb)] == refs
        assert self.a.num_free_blocks == refs.count(0)

    def teardown(self):
        if not hasattr(self, "a"):
            return
        for sid in list(self.tables):
            self.a.free(sid)
        self.a.check_invariants()
        assert self.a.num_free_blocks == self.nb and self.a.num_used_blocks == 0


class _WeakHashAllocator(KVBlockAllocator):
    def _hash(self, prev_hash, toks):
        return sum(toks) % 3  # ignores the chain and collides all the time


class WeakHashMachine(AllocatorMachine):
    allocator_cls = _WeakHashAllocator


_machine_settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = _machine_settings
TestWeakHashMachine = WeakHashMachine.TestCase
TestWeakHashMachine.settings = settings(_machine_settings, max_examples=100)
