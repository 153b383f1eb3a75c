"""The shared KV tier of a Serve application (issue 27): a small deployment that owns the tier actor.

``SharedKVTierHost`` (one replica, no CPU) creates the named tier actor (actors/kv_shared_tier.py)
when the application starts. The actor is not detached: its owner is this replica, so it goes with
the application (delete, redeploy) and nothing outlives it; the engine replicas look it up by name
(``tier_name`` of the application) and count misses until it is up (cluster/shared_kv.py). A tier
actor that dies fails this replica's health check, so Serve replaces the replica and the new one
starts a new tier; the engine replicas look the tier up again when the old one stops answering
(actors/kv_shared_client.py).
"""
from __future__ import annotations

import ray
from ray import serve


def tier_name(app_name: str) -> str:
    """The tier actor's name for application ``app_name`` (one tier per application)."""
    return f"specray-kv-tier:{app_name or 'default'}"


@serve.deployment(name="SharedKVTier", num_replicas=1, ray_actor_options={"num_cpus": 0})
class SharedKVTierHost:
    def __init__(self, capacity_bytes: int, block_size: int, name: str | None = None):
        from actors.kv_shared_tier import tier_actor

        self.name = name or tier_name(serve.get_replica_context().app_name)
        self.actor = tier_actor(self.name, capacity_bytes, block_size)
        ray.get(self.actor.stats.remote())  # up before this replica reports ready

    async def stats(self) -> dict:
        """The tier's own figures (capacity, bytes and blocks held, puts, lookups, hits)."""
        return await self.actor.stats.remote()

    async def check_health(self) -> None:
        """Serve's health check: the tier actor answers (raises once it has died)."""
        await self.actor.stats.remote()
