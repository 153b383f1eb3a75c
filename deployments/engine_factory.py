"""The engine a Serve replica runs, from its ServeArgs: in-process (the model in the replica) or
over Ray actors (tensor-parallel verifier shards, drafter workers, the allocator actor: the same
build as `specray generate --ray`, cluster/replica.py)."""
from __future__ import annotations

import os

from deployments.serve_config import ServeArgs


def replica_engine_config(args: ServeArgs, replica_id: str | None = None, app_name: str | None = None):
    """The in-process engine's config: torch threads default to the CPUs the replica reserves
    (``num_cpus``, at least 1), not every core of the node. Ray runs replicas at a low priority
    (niceness 15) beside its proxy and raylet; two threads on this 2-core box stalled on whichever
    was preempted, and one thread served 20% faster (BENCHMARKS.md, `make serve`).
    A disk KV tier belongs to one engine: each replica (``replica_id``) gets a subdirectory of
    ``kv_offload.disk_dir`` of its own, so replicas sharing a node do not refuse each other.
    The shared KV tier is the application's (``app_name``'s, deployments/kv_tier.py): looked up, not
    created, by the engine."""
    update = {}
    tier = args.effective_kv_tier
    if tier.enabled:
        from deployments.kv_tier import tier_name

        update["kv_tier"] = tier.model_copy(update={"owner": "application",
                                                    "name": tier.name or tier_name(app_name or "")})
    if args.engine.num_threads is None:
        update["num_threads"] = max(1, int(args.num_cpus))
    off = args.engine.kv_offload
    if replica_id is not None and off.disk_enabled:
        disk_dir = os.path.join(off.disk_dir, f"replica-{replica_id}")
        update["kv_offload"] = off.model_copy(update={"disk_dir": disk_dir})
    return args.engine.model_copy(update=update) if update else args.engine


def build_engine(args: ServeArgs, replica_id: str | None = None, app_name: str | None = None):
    """-> (LLMEngine, stop): ``stop()`` releases what the engine started (actors; in-process, the disk
    KV tier's file and directory lock)."""
    if not args.uses_ray_actors:
        from cluster.engine import LLMEngine

        engine = LLMEngine(replica_engine_config(args, replica_id, app_name))
        engine.grammars.warm_up()  # before traffic: the first structured request would stall the step loop
        return engine, engine.shutdown
    from cluster.replica import RayOptions, build_replica_engine, shutdown_replica_engine

    opts = RayOptions(tp=args.tensor_parallel_size, drafters=args.drafters, allow_no_spec=args.allow_no_spec)
    engine = build_replica_engine(args.engine, opts)
    engine.grammars.warm_up()
    return engine, lambda: shutdown_replica_engine(engine)
