"""The shared KV tier on its own: put / lookup, verification against token ids, LRU by bytes,
layouts kept apart, bad sizes named; and as a Ray actor with payloads in the object store."""
from __future__ import annotations

import numpy as np
import pytest

from actors.kv_shared_tier import SharedKVTier

BS = 4
L = "model|float32|shape"


def _ids(n: int, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 250, size=n)]


def _put(tier, ids, start, n, nbytes=10, layout=L):
    return tier.put(layout, ids, start, [f"b{i}" for i in range(start, start + n)], [nbytes] * n)


def test_put_then_lookup_the_verified_run():
    tier = SharedKVTier(1000, BS)
    ids = _ids(21)
    assert _put(tier, ids, 0, 5) == 5
    assert tier.lookup(L, ids, 0) == ["b0", "b1", "b2", "b3", "b4"]  # never the last token's block
    assert tier.lookup(L, ids, 2) == ["b2", "b3", "b4"]
    assert tier.lookup(L, ids, 1, max_blocks=2) == ["b1", "b2"]
    assert tier.lookup(L, ids[:12] + [7, 7, 7, 7, 7], 0) == ["b0", "b1", "b2"]  # diverges at block 3
    assert tier.lookup(L, ids[:20], 0) == ["b0", "b1", "b2", "b3"]  # 20 tokens: block 4 holds the last
    assert tier.lookup("other-model", ids, 0) == []  # another layout never sees these blocks
    assert _put(tier, ids, 0, 5) == 0  # held already: kept as it is
    s = tier.stats()
    assert s["blocks"] == 5 and s["bytes"] == 50 and s["hit_blocks"] == 17
    tier.check_invariants()


def test_put_needs_its_prefix_held():
    tier = SharedKVTier(1000, BS)
    ids = _ids(21)
    assert _put(tier, ids, 2, 2) == 0  # blocks 0-1 were never published: unreachable, not stored
    assert tier.stats()["put_rejected"] == 2
    assert _put(tier, ids, 0, 2) == 2 and _put(tier, ids, 2, 2) == 2
    assert tier.lookup(L, ids, 0) == ["b0", "b1", "b2", "b3"]


def test_hit_verified_against_token_ids_not_the_hash(monkeypatch):
    """Every hash collides: a lookup of other tokens must miss, and a put of them is refused."""
    tier = SharedKVTier(1000, BS)
    monkeypatch.setattr(tier, "_hash", lambda prev, toks: 42)
    a, b = _ids(9, seed=1), _ids(9, seed=2)
    assert _put(tier, a, 0, 1) == 1
    assert tier.lookup(L, b, 0) == []  # same hash, other tokens
    assert tier.lookup(L, a, 0) == ["b0"]
    assert _put(tier, b, 0, 1) == 0 and tier.stats()["put_rejected"] == 1


def test_hit_verified_against_the_whole_prefix(monkeypatch):
    """A hash that ignores the chain: block 1 of another prefix has the same tokens and hash, but
    its parent is another block, so it is neither served nor overwritten."""
    tier = SharedKVTier(1000, BS)
    monkeypatch.setattr(tier, "_hash", lambda prev, toks: hash(toks))
    a = _ids(9, seed=1)
    c = _ids(4, seed=2) + a[4:]  # another block 0, the same block 1
    assert _put(tier, a, 0, 2) == 2
    assert _put(tier, c, 0, 2) == 1  # block 0 stored; block 1's hash belongs to a's chain
    assert tier.lookup(L, c, 0) == ["b0"]
    assert tier.lookup(L, a, 0) == ["b0", "b1"]


def test_lru_by_bytes_evicts_tails_first():
    tier = SharedKVTier(60, BS)
    a, b = _ids(17, seed=3), _ids(17, seed=4)
    assert _put(tier, a, 0, 4) == 4  # 40 bytes
    assert _put(tier, b, 0, 2) == 2  # 60: full
    assert tier.lookup(L, a, 0) == ["b0", "b1", "b2", "b3"]  # a is now the most recent...
    assert _put(tier, b, 2, 2) == 2  # ...but b's prefix is touched first: a's two tail blocks go
    tier.check_invariants()
    s = tier.stats()
    assert s["bytes"] == 60 and s["evicted_blocks"] == 2
    assert tier.lookup(L, a, 0) == ["b0", "b1"]
    assert tier.lookup(L, b, 0) == ["b0", "b1", "b2", "b3"]
    small = SharedKVTier(15, BS)
    assert _put(small, a, 0, 2, nbytes=20) == 0 and small.stats()["blocks"] == 0  # larger than the tier


def test_lru_keeps_a_prefix_head_longest():
    tier = SharedKVTier(40, BS)
    a, b = _ids(17, seed=5), _ids(9, seed=6)
    _put(tier, a, 0, 4)  # full; a walk touches tails first, so a's block 3 is the LRU entry
    _put(tier, b, 0, 1)
    assert tier.lookup(L, a, 0) == ["b0", "b1", "b2"]  # the tail went, the head stayed reachable


@pytest.mark.parametrize("bad", [-1, -2**30, 1.5, True, "1"])
def test_bad_capacity_named(bad):
    with pytest.raises(ValueError, match="capacity_bytes=" + repr(bad).replace("(", r"\(").replace("+", r"\+")):
        SharedKVTier(bad, BS)


def test_bad_put_named():
    tier = SharedKVTier(100, BS)
    with pytest.raises(ValueError, match="need 12 token ids, got 8"):
        _put(tier, _ids(8), 1, 2)
    with pytest.raises(ValueError, match="2 payloads but 1 sizes"):
        tier.put(L, _ids(8), 0, ["x", "y"], [1])


@pytest.mark.ray
def test_tier_actor_holds_blocks_in_the_object_store(ray_cluster):
    """The actor keeps copies of the published blocks it owns: they outlive the publisher's refs."""
    import ray

    from actors.kv_shared_tier import tier_actor

    actor = tier_actor("specray-test-tier", 10_000, BS)
    try:
        assert tier_actor("specray-test-tier", 1, BS)._actor_id == actor._actor_id  # by name: the same one
        ids = _ids(13, seed=7)
        blocks = [np.full((2, 8), i, dtype=np.uint8) for i in range(3)]
        refs = [ray.put(b) for b in blocks]
        assert ray.get(actor.put.remote(L, ids, 0, refs, [16] * 3)) == 3
        del refs
        got = ray.get(ray.get(actor.lookup.remote(L, ids, 1), timeout=30), timeout=30)
        assert [g.tolist() for g in got] == [blocks[1].tolist(), blocks[2].tolist()]
        stats = ray.get(actor.stats.remote())
        assert stats["blocks"] == 3 and stats["bytes"] == 48 and stats["hit_blocks"] == 2
    finally:
        ray.kill(actor)
