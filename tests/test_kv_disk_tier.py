"""Disk KV tier: the allocator's spill / disk-load decisions, the file that holds the blocks, its
directory lock, and the copies through all tiers."""
from __future__ import annotations

import os

import pytest
import torch

from actors.kv_allocator import KVBlockAllocator
from actors.kv_disk_pool import BLOCKS_FILE, DiskKVPool, DiskTierSpec, lock_dir
from actors.kv_disk_tier import DiskTier
from actors.kv_host_pool import HostKVPool, _runs
from actors.kv_host_tier import DISK_LOAD, EVICT, LOAD, SPILL, BlockCopy
from actors.model.attention import allocate_kv_cache
from tests.test_kv_host_tier import A, B, _fill_and_evict


def test_host_overflow_spills_to_disk_before_its_slot_is_reused():
    a = KVBlockAllocator(4, 2, num_host_blocks=1, num_disk_blocks=4)
    copies = _fill_and_evict(a)
    # A's tail is evicted first (LRU, a sequence frees its tail first), then its head pushes it on to disk
    assert [c.kind for c in copies] == [EVICT, SPILL, EVICT]
    assert copies[1].host_slot == copies[0].host_slot == copies[2].host_slot
    assert a.host.num_blocks == 1 and a.disk.num_blocks == 1
    a.check_invariants()


def test_prefix_split_across_host_and_disk_is_loaded_back_and_verified():
    a = KVBlockAllocator(4, 2, num_host_blocks=1, num_disk_blocks=4)
    _fill_and_evict(a)
    assert a.allocate(3, A) == 4
    assert (a.host_hit_tokens(3), a.disk_hit_tokens(3)) == (2, 2)
    copies = a.take_copies()
    loads = {c.kind: c.device_block for c in copies if c.kind in (LOAD, DISK_LOAD)}
    assert [loads[LOAD], loads[DISK_LOAD]] == a.block_table(3)[:2]
    assert a.prefix_hits == 4 and (a.host_hits, a.disk_hits) == (2, 2)
    a.check_invariants()
    a.free(3)
    a.check_invariants()


def test_disk_lru_drops_oldest_and_capacity_holds():
    a = KVBlockAllocator(4, 2, num_host_blocks=1, num_disk_blocks=1)
    _fill_and_evict(a)
    a.allocate(3, [9, 9, 9, 9, 9, 9, 9, 9])  # B's cached blocks leave the device, pushing A's out
    a.take_copies()
    assert a.disk.num_blocks == 1 and a.disk.num_dropped > 0
    a.check_invariants()


def test_disk_hit_on_other_tokens_is_refused():
    """A disk entry under the queried hash but holding other tokens is no hit (verified, not trusted)."""
    a = KVBlockAllocator(4, 2, num_host_blocks=1, num_disk_blocks=4)
    _fill_and_evict(a)
    e = next(iter(a.disk._entries.values()))
    e.token_ids = (0, 0)
    assert a.allocate(3, A) == 2 and a.disk_hit_tokens(3) == 0


def test_recomputed_block_supersedes_disk_copy():
    a = KVBlockAllocator(4, 2, num_host_blocks=1, num_disk_blocks=4)
    _fill_and_evict(a)
    a.allocate(3, A[:1], extra_tokens=3)  # one prompt token: no lookup; A's blocks generated anew
    a.take_copies()
    a.commit(3, A[:4], 4)
    held = {e.token_ids for t in (a.host, a.disk) for e in t._entries.values()}
    assert not held & {(5, 6), (7, 8)}  # the device copies took over A's hashes
    a.check_invariants()


def test_disk_without_host_tier_is_refused():
    with pytest.raises(ValueError, match=r"num_disk_blocks=3 needs a host tier"):
        KVBlockAllocator(4, 2, num_disk_blocks=3)
    with pytest.raises(ValueError, match="num_disk_blocks.*-1"):
        KVBlockAllocator(4, 2, num_host_blocks=1, num_disk_blocks=-1)
    with pytest.raises(ValueError, match="disk tier num_slots.*0"):
        DiskTier(0)


def test_runs_batch_spills_and_disk_loads_by_distinct_ends():
    cs = [BlockCopy(SPILL, -1, 0, 3), BlockCopy(SPILL, -1, 1, 4), BlockCopy(EVICT, 2, 0),
          BlockCopy(DISK_LOAD, 5, -1, 3), BlockCopy(DISK_LOAD, 6, -1, 3)]
    assert _runs(cs) == [(SPILL, [0, 1], [3, 4]), (EVICT, [2], [0]), (DISK_LOAD, [3], [5]), (DISK_LOAD, [3], [6])]


def _random_caches(layers: int = 2, blocks: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    dev = allocate_kv_cache(layers, blocks, 2, 1, 3)
    for k, v in dev:
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
    return dev


def test_blocks_round_trip_device_host_disk_device(tmp_path):
    dev = _random_caches()
    before = [(k.clone(), v.clone()) for k, v in dev]
    pool = HostKVPool(dev, 1, DiskTierSpec(str(tmp_path), 3))
    assert os.path.getsize(tmp_path / BLOCKS_FILE) == 3 * pool.block_bytes  # preallocated
    # blocks 3 and 0 go out through the one host slot, each spilled before the slot is refilled
    pool.execute(dev, [BlockCopy(EVICT, 3, 0), BlockCopy(SPILL, -1, 0, 2), BlockCopy(EVICT, 0, 0),
                       BlockCopy(SPILL, -1, 0, 1)])
    for k, v in dev:
        k[0].zero_()
        v[3].zero_()
    pool.execute(dev, [BlockCopy(DISK_LOAD, 0, -1, 1), BlockCopy(DISK_LOAD, 3, -1, 2)])
    for (k, v), (k0, v0) in zip(dev, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert pool.moved["host_to_disk"][0] == pool.moved["disk_to_device"][0] == 2 * pool.block_bytes
    assert pool.moved["disk_to_device"][1] > 0
    pool.close()
    assert not (tmp_path / BLOCKS_FILE).exists()


def test_disk_pool_locks_its_directory_until_closed(tmp_path):
    like = _random_caches()
    first = DiskKVPool(DiskTierSpec(str(tmp_path), 2), like)
    in_use = rf"KV disk dir '{tmp_path}' is in use by another engine \(pid {os.getpid()}\)"
    with pytest.raises(ValueError, match=in_use):
        DiskKVPool(DiskTierSpec(str(tmp_path), 2), like)
    first.close()
    first.close()  # idempotent
    DiskKVPool(DiskTierSpec(str(tmp_path), 2), like).close()


def test_dropped_disk_pool_releases_its_directory(tmp_path):
    DiskKVPool(DiskTierSpec(str(tmp_path), 2), _random_caches())  # garbage at once
    os.close(lock_dir(str(tmp_path)))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_disk_dir_is_refused(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ValueError, match=rf"KV disk dir '{tmp_path}' is not writable"):
            DiskKVPool(DiskTierSpec(str(tmp_path), 2), _random_caches())
    finally:
        tmp_path.chmod(0o700)


def test_serve_args_carry_the_disk_tier(tmp_path):
    from deployments.serve_config import ServeArgs

    args = ServeArgs(engine={"kv_offload": {"host_gb": 1, "disk_dir": str(tmp_path), "disk_gb": 4}})
    assert args.engine.kv_offload.disk_enabled and args.engine.kv_offload.disk_dir == str(tmp_path)


def test_each_serve_replica_gets_a_disk_dir_of_its_own(tmp_path):
    from deployments.engine_factory import replica_engine_config
    from deployments.serve_config import ServeArgs

    args = ServeArgs(engine={"kv_offload": {"host_gb": 1, "disk_dir": str(tmp_path), "disk_gb": 4}}, num_cpus=2)
    a, b = (replica_engine_config(args, r).kv_offload for r in ("r1", "r2"))
    assert (a.disk_dir, b.disk_dir) == (str(tmp_path / "replica-r1"), str(tmp_path / "replica-r2"))
    assert a.disk_gb == 4 and replica_engine_config(args, "r1").num_threads == 2
    assert replica_engine_config(ServeArgs(), "r1") == ServeArgs().engine.model_copy(update={"num_threads": 1})


def test_tiers_need_the_in_process_kv_service_and_verifier(tmp_path):
    from cluster.config import EngineConfig
    from cluster.runtime import kv_tiers_for

    cfg = EngineConfig(kv_offload={"host_blocks": 4, "disk_dir": str(tmp_path / "kv"), "disk_blocks": 8})
    assert kv_tiers_for(cfg, None, torch.float32, False, False) == (4, DiskTierSpec(str(tmp_path / "kv"), 8))
    with pytest.raises(ValueError, match="disk_dir needs the in-process verifier"):
        kv_tiers_for(cfg, None, torch.float32, True, False)
    with pytest.raises(ValueError, match="needs the in-process KV service"):
        kv_tiers_for(cfg, None, torch.float32, False, True)
    assert not (tmp_path / "kv").exists()  # refused before the directory was touched
