"""Tests for actors.kv_allocator: unit tests per method and error (the prefix cache:
tests/test_kv_prefix_cache.py; the Hypothesis state machine: tests/test_kv_allocator_stateful.py)."""
from __future__ import annotations

import pytest

from actors.kv_allocator import KVBlockAllocator, OutOfBlocksError
from tests.kv_helpers import committed


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
    committed(a, 1, [1, 2, 3, 4, 5])  # 3 blocks, first two cached and in use
    assert a.num_free_blocks == 1
    assert a.can_allocate([1, 2, 3, 4, 9])  # 2 shared blocks + 1 fresh
    assert not a.can_allocate([1, 2, 3, 4, 9, 9, 9])  # needs 2 fresh
    assert a.allocate(2, [1, 2, 3, 4, 9]) == 4
    assert a.block_table(2)[:2] == a.block_table(1)[:2]
    assert [a.ref_count(b) for b in a.block_table(1)] == [2, 2, 1]
    a.check_invariants()


def test_can_allocate_counts_free_cached_hits_as_costing_a_block():
    a = KVBlockAllocator(3, 2)
    committed(a, 1, [1, 2, 3, 4, 5])
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
    committed(a, 1, [1, 2, 3, 4, 5, 6])
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
    committed(a, 1, [1, 2, 3])
    a._blocks[a.block_table(1)[0]].ref_count += 1
    with pytest.raises(AssertionError, match="ref_count"):
        a.check_invariants()
    b = KVBlockAllocator(4, 2)
    committed(b, 1, [1, 2, 3, 4, 5])
    committed(b, 2, [1, 2, 3, 4, 5])
    b._seqs[1].num_committed = 0  # seq 1 would now write into blocks it shares with seq 2
    with pytest.raises(AssertionError, match="written into"):
        b.check_invariants()
