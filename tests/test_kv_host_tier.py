"""Host KV tier: the allocator's write-back / load-back decisions and the copies that carry them out."""
from __future__ import annotations

import pytest
import torch

from actors.kv_allocator import KVBlockAllocator
from actors.kv_host_pool import HostKVPool, _runs
from actors.kv_host_tier import EVICT, LOAD, BlockCopy, HostTier
from actors.model.attention import allocate_kv_cache

A = [5, 6, 7, 8, 9]  # two full blocks of 2 and a last token
B = [1, 2, 3, 4, 1, 2, 3, 4]


def _fill_and_evict(a: KVBlockAllocator) -> list[BlockCopy]:
    """A's two blocks cached, then B takes every device block: A's blocks leave the device."""
    a.allocate(1, A)
    a.commit(1, A, len(A))
    a.free(1)
    a.allocate(2, B)  # takes every block: A's two cached blocks are written back
    out = a.take_copies()
    a.commit(2, B, len(B))
    a.free(2)
    return out


def test_evicted_prefix_is_written_back_and_loaded_on_a_hit():
    a = KVBlockAllocator(4, 2, num_host_blocks=4)
    evicts = _fill_and_evict(a)
    assert [c.kind for c in evicts] == [EVICT, EVICT]
    assert a.num_cached_blocks == 4 and a.host.num_blocks == 2  # B on the device, A on the host
    assert a.allocate(3, A) == 4 and a.host_hit_tokens(3) == 4
    copies = a.take_copies()
    loads = [c for c in copies if c.kind == LOAD]
    assert [c.device_block for c in loads] == a.block_table(3)[:2]
    assert a.prefix_hits == 4 and a.host_hits == 4
    a.check_invariants()
    a.free(3)
    a.check_invariants()


def test_without_host_tier_the_prefix_is_lost():
    a = KVBlockAllocator(4, 2)
    assert _fill_and_evict(a) == []
    assert a.allocate(3, A) == 0


def test_host_lru_drops_oldest_and_capacity_holds():
    a = KVBlockAllocator(4, 2, num_host_blocks=1)
    _fill_and_evict(a)
    assert a.host.num_blocks == 1  # A's tail went first, then its head replaced it (LRU)
    assert a.allocate(3, A) == 2  # the head block only
    a.check_invariants()


def test_recomputed_block_supersedes_host_copy():
    """A device registration of a hash the host holds drops the host copy (tiers are exclusive)."""
    a = KVBlockAllocator(4, 2, num_host_blocks=4)
    _fill_and_evict(a)
    assert a.host.num_blocks == 2
    a.allocate(3, A[:1], extra_tokens=3)  # one prompt token: no lookup; A's blocks generated anew
    a.take_copies()
    a.commit(3, A[:4], 4)
    held = {e.token_ids for e in a.host._entries.values()}
    assert held and not held & {(5, 6), (7, 8)}  # the device copies took over A's hashes
    a.check_invariants()
    a.free(3)
    assert a.allocate(4, A) == 4 and a.host_hit_tokens(4) == 0  # now served by the device
    a.check_invariants()


def test_bad_sizes_name_the_value():
    with pytest.raises(ValueError, match="num_host_blocks.*-1"):
        KVBlockAllocator(4, 2, num_host_blocks=-1)
    with pytest.raises(ValueError, match="num_slots.*0"):
        HostTier(0)


def test_runs_split_on_repeated_slots():
    cs = [BlockCopy(EVICT, 1, 0), BlockCopy(EVICT, 2, 0), BlockCopy(LOAD, 2, 0), BlockCopy(LOAD, 3, 1)]
    assert _runs(cs) == [(EVICT, [1], [0]), (EVICT, [2], [0]), (LOAD, [0, 1], [2, 3])]  # (kind, sources, destinations)


def test_pool_copies_round_trip_every_layer():
    dev = allocate_kv_cache(2, 4, 2, 1, 3)
    for layer, (k, v) in enumerate(dev):
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
    before = [(k.clone(), v.clone()) for k, v in dev]
    pool = HostKVPool(dev, 2)
    pool.execute(dev, [BlockCopy(EVICT, 3, 1), BlockCopy(EVICT, 0, 0)])
    for k, v in dev:
        k[0].zero_()
        v[3].zero_()
    pool.execute(dev, [BlockCopy(LOAD, 0, 0), BlockCopy(LOAD, 3, 1)])
    for (k, v), (k0, v0) in zip(dev, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert pool.bytes_out == pool.bytes_in == 2 * pool.block_bytes
    assert pool.block_bytes == 2 * 2 * (2 * 1 * 3) * 4  # layers x K/V x block elements x fp32
