"""Two in-process engines sharing one KV tier (tiny model): the second computes no prefill for the
prefixes the first published, reports them as shared cached tokens, and answers exactly as an engine
without the tier; a slow tier counts as a miss; a dead tier actor is looked up again; bad tier
settings are named."""
from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from actors.kv_shared_tier import TIER_NAMESPACE, SharedKVTier
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig
from cluster.shared_kv import attach_shared_kv
from tests.test_engine_kv_offload import _assert_no_leak, _counting
from tests.test_metrics import sample_value
from tests.tiny import random_prompts, tiny_engine

BS = 4
PROMPTS = [p[:30 + 3 * i] for i, p in enumerate(random_prompts(3, seed=21, lo=50, hi=51))]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def _full_blocks(n: int) -> int:
    """Prompt tokens a prefix hit can cover: whole blocks, never the last token."""
    return (n - 1) // BS * BS


def _check_shared_run(a, b, baseline) -> None:
    """``a`` runs the prompts (publishing what it computes), then ``b`` (fetching all but the tails)."""
    a.generate(PROMPTS, SamplingParams(max_tokens=1), concurrency=1)  # finished in the prefill step
    first = a.generate(PROMPTS, PARAMS, concurrency=1)
    computed = _counting(b)
    second = b.generate(PROMPTS, PARAMS, concurrency=1)
    assert [o.token_ids for o in first] == [o.token_ids for o in second] == [o.token_ids for o in baseline]
    for o, p in zip(second, PROMPTS):
        assert o.num_cached_tokens == o.num_shared_cached_tokens == _full_blocks(len(p)) > 0
    prefill = sum(len(p) - _full_blocks(len(p)) for p in PROMPTS)  # the tail block of each prompt only
    assert computed[0] == prefill + sum(PARAMS.max_tokens - 1 for _ in PROMPTS)
    for eng in (a, b):
        _assert_no_leak(eng)
    snap_a, snap_b = a.metrics.snapshot(), b.metrics.snapshot()
    assert sample_value(snap_b, "specray:kv_shared_lookups_total", result="hit") == len(PROMPTS)
    assert sample_value(snap_b, "specray:kv_shared_blocks_total", direction="fetched") == \
        sum(_full_blocks(len(p)) // BS for p in PROMPTS)
    assert sample_value(snap_a, "specray:kv_shared_bytes_total", direction="published") > 0
    assert sample_value(snap_b, "specray:kv_shared_bytes_total", direction="fetched") > 0


@pytest.fixture(scope="module")
def baseline(tiny_target_dir):
    return tiny_engine(tiny_target_dir).generate(PROMPTS, PARAMS, concurrency=1)


def test_two_engines_share_an_in_process_tier(tiny_target_dir, baseline):
    tier = SharedKVTier(2**20, BS)
    a, b = tiny_engine(tiny_target_dir), tiny_engine(tiny_target_dir)
    for eng in (a, b):
        attach_shared_kv(eng, tier)
    _check_shared_run(a, b, baseline)
    tier.check_invariants()
    assert tier.stats()["blocks"] >= sum(len(p) // BS for p in PROMPTS)


def test_shared_tier_under_host_tier_and_pressure(tiny_target_dir, baseline):
    """A small device pool with a host tier: fetched blocks go through the same allocator paths;
    output unchanged, nothing leaked."""
    tier = SharedKVTier(2**20, BS)
    engs = [tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload={"host_blocks": 8}) for _ in range(2)]
    for eng in engs:
        attach_shared_kv(eng, tier)
    outs = [eng.generate(PROMPTS, PARAMS, concurrency=2) for eng in engs]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]] == [o.token_ids for o in baseline]
    assert sum(o.num_shared_cached_tokens for o in outs[1]) > 0
    for eng in engs:
        _assert_no_leak(eng)


def test_slow_tier_is_a_miss(tiny_target_dir, baseline):
    class Slow(SharedKVTier):
        def lookup(self, *args, **kw):
            raise TimeoutError("slow")  # what the Ray path raises past fetch_timeout_ms

    tier = Slow(2**20, BS)
    a, b = tiny_engine(tiny_target_dir), tiny_engine(tiny_target_dir)
    for eng in (a, b):
        attach_shared_kv(eng, tier)
    a.generate(PROMPTS, PARAMS, concurrency=1)
    out = b.generate(PROMPTS, PARAMS, concurrency=1)
    assert [o.token_ids for o in out] == [o.token_ids for o in baseline]
    assert all(o.num_cached_tokens == 0 for o in out)
    assert b.shared_kv.stats()["timeouts"] == len(PROMPTS)
    _assert_no_leak(b)


@pytest.mark.ray
def test_two_engines_share_the_tier_actor(ray_cluster, tiny_target_dir, baseline):
    """The Ray path: the named actor (created by the first engine, found by the second), blocks
    through the object store, the fetch within its timeout."""
    import ray

    from actors.kv_shared_tier import TIER_NAMESPACE

    cfg = {"enabled": True, "name": "specray-test-engines", "capacity_gb": 0.01, "fetch_timeout_ms": 5000}
    a = tiny_engine(tiny_target_dir, kv_tier=cfg)
    b = tiny_engine(tiny_target_dir, kv_tier=cfg)
    try:
        a.generate(PROMPTS, PARAMS)  # starts the actor; publishing is not awaited: let it land
        deadline = time.monotonic() + 30
        while a.shared_kv.stats().get("tier_blocks", 0) < sum(len(p) // BS for p in PROMPTS):
            assert time.monotonic() < deadline, a.shared_kv.stats()
            time.sleep(0.05)
        _check_shared_run(a, b, baseline)
    finally:
        ray.kill(ray.get_actor("specray-test-engines", namespace=TIER_NAMESPACE))


def _wait(what: str, check, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _named(name: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=TIER_NAMESPACE)
        return True
    except ValueError:
        return False


@pytest.mark.ray
def test_a_dead_tier_actor_is_looked_up_again(ray_cluster, tiny_target_dir, monkeypatch):
    """The tier actor dies (in Serve: with its host replica, which Serve replaces, starting a new
    tier under the same name): engines that found it by name let go of the dead handle on its first
    failed answer, a lookup or the stats poll, and share through the new tier, instead of failing
    against the dead one (and publishing into it) for good."""
    import ray

    import actors.kv_shared_client as shared_client
    from actors.kv_shared_tier import tier_actor

    monkeypatch.setattr(shared_client, "RESOLVE_EVERY_S", 0.0)
    name = "specray-test-lost-tier"
    cfg = {"enabled": True, "name": name, "owner": "application", "fetch_timeout_ms": 5000}
    old = tier_actor(name, 2**24, BS)  # the application's host owns the tier; the engines look it up
    a, b = tiny_engine(tiny_target_dir, kv_tier=cfg), tiny_engine(tiny_target_dir, kv_tier=cfg)
    other = random_prompts(3, seed=22, lo=40, hi=41)
    try:
        a.generate(PROMPTS, PARAMS)  # a publishes into the old tier
        _wait("the old tier to fill", lambda: ray.get(old.stats.remote())["blocks"] > 0)
        b.shared_kv.stats()  # b holds the old handle too, and has asked it for its figures
        ray.kill(old)
        _wait("the old tier's name to be free", lambda: not _named(name))
        new = tier_actor(name, 2**23, BS)  # what the replaced host does
        first = b.generate(other, PARAMS, concurrency=1)  # b's lookup fails once: it lets go, publishes into new
        assert b.shared_kv.stats()["errors"] == 1
        _wait("a's stats poll to find the new tier", lambda: a.shared_kv.stats().get("tier_capacity_bytes") == 2**23)
        _wait("b's blocks in the new tier",
              lambda: ray.get(new.stats.remote())["blocks"] == sum(len(p) // BS for p in other))
        second = a.generate(other, PARAMS, concurrency=1)
        assert [o.token_ids for o in second] == [o.token_ids for o in first]
        assert all(o.num_shared_cached_tokens == _full_blocks(len(p)) > 0 for o, p in zip(second, other))
        for eng in (a, b):
            _assert_no_leak(eng)
    finally:
        if _named(name):
            ray.kill(ray.get_actor(name, namespace=TIER_NAMESPACE))


@pytest.mark.parametrize("cfg, named", [
    ({"enabled": True, "capacity_gb": -1}, "capacity_gb=-1.0"),
    ({"enabled": True, "capacity_gb": 0}, "capacity_gb=0.0"),
    ({"enabled": True, "fetch_timeout_ms": 0}, "fetch_timeout_ms=0.0"),
    ({"enabled": True, "name": " "}, "kv_tier.name=' '"),
    ({"enabled": True, "owner": "someone"}, "owner"),
])
def test_bad_tier_config_named(cfg, named):
    with pytest.raises(ValidationError, match=named.replace("(", r"\(")):
        EngineConfig(kv_tier=cfg)


def test_tier_with_remote_verifier_or_kv_refused():
    from cluster.runtime import kv_tiers_for

    config = EngineConfig(kv_tier={"enabled": True})
    with pytest.raises(ValueError, match="kv_tier.enabled=true needs the in-process verifier"):
        kv_tiers_for(config, None, None, remote_verifier=True, remote_kv=False)
    with pytest.raises(ValueError, match="kv_tier.enabled=true needs the in-process KV service"):
        kv_tiers_for(config, None, None, remote_verifier=False, remote_kv=True)
