"""Wiring of the shared KV tier (actors/kv_shared_tier.py) into an engine: which tier, the client
the engine's step calls (actors/kv_shared_client.py), and its series in ``/metrics``."""
from __future__ import annotations

from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from actors.kv_shared_client import SharedKVClient
from actors.kv_shared_tier import TIER_NAMESPACE, tier_actor

P = "specray:"
DEFAULT_TIER_NAME = "specray-kv-tier"


def check_shared_tier(config, remote_verifier: bool, remote_kv: bool) -> None:
    """The shared tier reads and writes the KV cache in the replica's process (cluster.runtime runs
    this with the other tier checks, before anything is built)."""
    if not config.kv_tier.enabled:
        return
    if remote_verifier:
        raise ValueError("kv_tier.enabled=true needs the in-process verifier (the shared tier copies blocks in and "
                         "out of its KV cache); this verifier backend (tensor_parallel_size > 1 / drafters) has no "
                         "shared tier yet: set kv_tier.enabled false or tensor_parallel_size 1")
    if remote_kv:
        raise ValueError("kv_tier.enabled=true needs the in-process KV service; a remote one has no shared tier yet")


def tier_layout(config, verifier) -> str:
    """What a block's bytes depend on besides its tokens: the model, the cache dtype and block shape."""
    k0 = verifier.kv_caches[0][0]
    return f"{config.model}|{k0.dtype}|{len(verifier.kv_caches)}x{tuple(k0.shape[1:])}"


def attach_shared_kv(engine, tier=None) -> SharedKVClient:
    """Give ``engine`` a shared-tier client: over ``tier`` (an actor handle or an in-process
    SharedKVTier), else over the named actor ``kv_tier.name`` (``owner`` engine: created if absent,
    then it lives as long as this process; application: looked up, the first lookups missing until
    the application's tier host has started it), and watch it in the engine's metrics."""
    cfg = engine.config.kv_tier
    resolve = None
    if tier is None:
        name = cfg.name or DEFAULT_TIER_NAME
        resolve = ((lambda: lookup_tier(name)) if cfg.owner == "application" else
                   (lambda: tier_actor(name, cfg.capacity_bytes, engine.config.block_size)))
    client = SharedKVClient(tier, engine.kv, engine.verifier, engine.config.block_size, cfg.fetch_timeout_ms / 1000,
                            tier_layout(engine.config, engine.verifier), resolve)
    engine.shared_kv = client
    engine.metrics.registry.register(SharedKVCollector(client))
    return client


def lookup_tier(name: str):
    """The running tier actor ``name`` (raises ValueError while it is not up)."""
    import ray

    return ray.get_actor(name, namespace=TIER_NAMESPACE)


class SharedKVCollector:
    """``specray:kv_shared_*``: the replica's view of the shared tier (lookups by result, blocks and
    bytes fetched and published) and the tier's capacity and fill as it last reported them."""

    def __init__(self, client: SharedKVClient):
        self.client = client

    def collect(self) -> Iterable[Metric]:
        s = self.client.stats()
        lookups = CounterMetricFamily(P + "kv_shared_lookups", "Shared KV tier lookups on a local miss, by result "
                                      "(timeout and error count as misses too)", labels=["result"])
        for result, key in (("hit", "hits"), ("miss", "misses"), ("timeout", "timeouts"), ("error", "errors")):
            lookups.add_metric([result], s[key])
        blocks = CounterMetricFamily(P + "kv_shared_blocks", "KV blocks moved to and from the shared tier",
                                     labels=["direction"])
        moved = CounterMetricFamily(P + "kv_shared_bytes", "KV bytes moved to and from the shared tier",
                                    labels=["direction"])
        for direction in ("fetched", "published"):
            blocks.add_metric([direction], s[f"blocks_{direction}"])
            moved.add_metric([direction], s[f"bytes_{direction}"])
        yield from (lookups, blocks, moved)
        if "tier_capacity_bytes" in s:
            yield GaugeMetricFamily(P + "kv_shared_tier_capacity_bytes", "Capacity of the shared KV tier",
                                    value=s["tier_capacity_bytes"])
            yield GaugeMetricFamily(P + "kv_shared_tier_bytes", "KV bytes the shared tier holds", value=s["tier_bytes"])
            yield GaugeMetricFamily(P + "kv_shared_tier_blocks", "KV blocks the shared tier holds",
                                    value=s["tier_blocks"])
