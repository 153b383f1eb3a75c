"""The engine a Serve replica runs, from its ServeArgs: in-process (the model in the replica) or
over Ray actors (tensor-parallel verifier shards, drafter workers, the allocator actor: the same
build as `specray generate --ray`, cluster/replica.py)."""
from __future__ import annotations

from deployments.serve_config import ServeArgs


def replica_engine_config(args: ServeArgs):
    """The in-process engine's config: torch threads default to the CPUs the replica reserves
    (``num_cpus``, at least 1), not every core of the node. Ray runs replicas at a low priority
    (niceness 15) beside its proxy and raylet; two threads on this 2-core box stalled on whichever
    was preempted, and one thread served 20% faster (BENCHMARKS.md, `make serve`)."""
    if args.engine.num_threads is not None:
        return args.engine
    return args.engine.model_copy(update={"num_threads": max(1, int(args.num_cpus))})


def build_engine(args: ServeArgs):
    """-> (LLMEngine, stop): ``stop()`` releases the actors the engine started (a no-op in-process)."""
    if not args.uses_ray_actors:
        from cluster.engine import LLMEngine

        return LLMEngine(replica_engine_config(args)), lambda: None
    from cluster.replica import RayOptions, build_replica_engine, shutdown_replica_engine

    opts = RayOptions(tp=args.tensor_parallel_size, drafters=args.drafters, allow_no_spec=args.allow_no_spec)
    engine = build_replica_engine(args.engine, opts)
    return engine, lambda: shutdown_replica_engine(engine)
