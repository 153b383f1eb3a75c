"""One engine replica on a Ray cluster: the BatchScheduler actor drives the step loop and owns
sequence state; it talks to the tensor-parallel verifier shards (a ShardGroup), the replica's
global KV allocator actor and the drafter workers, and streams tokens out to callers as a Ray
streaming generator.

Faults: a dead verifier rank restarts the whole TP group and every in-flight request is re-queued
from its last committed token (engine.step); so does a dead KV allocator actor, replaced by a fresh
one (RemoteKV); a dead drafter degrades to plain decoding and is
replaced (RemoteProposer); a dead scheduler is restarted by Ray and its callers get a clear
``ReplicaLostError`` instead of a hang (RayReplicaClient)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray

from actors.kv_service import KVEntry, KVPlan, KVServiceLost, Settle
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig

log = logging.getLogger("specray.replica")


@dataclass
class RayOptions:
    tp: int = 1
    drafters: int = 0  # drafter worker actors (0 = proposers run inside the scheduler actor)
    allow_no_spec: bool = False  # serve without speculation if the drafter fails to load
    timeout_s: float = 120.0  # placement / start-up wait before a clear error
    cpus_per_actor: float = 0.25


class RemoteKV:
    """KVService client over the allocator actor: one call to plan, one (ordered, not awaited)
    call to settle per step. A dead allocator actor is replaced by a fresh one from ``factory``
    (at most ``max_restarts`` times) and ``plan`` raises ``KVServiceLost``: the engine then re-queues
    every running request, which recomputes from its committed tokens (nothing lost)."""

    def __init__(self, factory, max_restarts: int = 3):
        self.factory, self.max_restarts = factory, max_restarts
        self.handle = factory()
        self.num_restarts = 0

    def plan(self, running: list[KVEntry], waiting: list[KVEntry], max_num_seqs: int, token_budget: int) -> KVPlan:
        try:
            return ray.get(self.handle.plan.remote(running, waiting, max_num_seqs, token_budget))
        except ray.exceptions.RayActorError as e:
            if self.num_restarts >= self.max_restarts:
                raise
            self.num_restarts += 1
            log.warning("KV allocator actor died (%s); starting a fresh one (restart %d) and re-queueing "
                        "the running requests", e, self.num_restarts)
            self.handle = self.factory()
            raise KVServiceLost(f"KV allocator actor died: {e}") from e

    def settle(self, ops: list[Settle]) -> None:
        self.handle.settle.remote(ops)  # actor calls from one caller run in order

    def reset(self) -> None:
        ray.get(self.handle.reset.remote())

    def stats(self) -> dict:
        return ray.get(self.handle.stats.remote())


def load_model_meta(spec: str):
    """Config and tokenizer without weights: the scheduler needs no copy of the target."""
    from actors.model.config import ModelConfig
    from actors.model.loader import LoadedModel, load_tokenizer, resolve_model_dir

    model_dir = resolve_model_dir(spec)
    return LoadedModel(None, load_tokenizer(model_dir), ModelConfig.from_dir(model_dir), model_dir)


def build_replica_engine(config: EngineConfig, opts: RayOptions):
    """An LLMEngine whose verifier is a tensor-parallel shard group, whose allocator is an actor and
    whose proposer may be drafter workers; the caller's process runs only the step loop (the
    scheduler actor here, or a Serve replica)."""
    from cluster.engine import LLMEngine
    from cluster.replica_parts import build_kv_actor, build_proposer_for, build_verifier_group

    meta = load_model_meta(config.model)
    verifier = build_verifier_group(config, meta, opts)
    try:
        kv = RemoteKV(lambda: build_kv_actor(verifier.num_blocks, config, opts))
        config = config.model_copy(update={"num_kv_blocks": verifier.num_blocks})
        proposer = build_proposer_for(config, verifier, meta, opts)
        if proposer is None:  # speculation off (or its drafter failed with allow_no_spec)
            config = config.model_copy(update={"speculative": SpeculativeConfig()})
        return LLMEngine(config, loaded=meta, verifier=verifier, kv=kv, proposer=proposer)
    except BaseException:  # a replica that fails to start leaves no actors or bundles behind
        _shutdown_verifier(verifier)
        raise


def shutdown_replica_engine(engine) -> None:
    """Stop what build_replica_engine started: drafter workers and the shard group."""
    engine.shutdown()
    _shutdown_verifier(engine.verifier)


class SchedulerActor:
    """Runs in its own Ray actor (async): builds the replica's other actors, then serves."""

    def __init__(self, config: EngineConfig, opts: RayOptions):
        from cluster.async_engine import AsyncLLMEngine

        self.engine = build_replica_engine(config, opts)
        self.async_engine = AsyncLLMEngine(self.engine)

    async def generate(self, prompt, params: dict | None = None, chat: bool = False, request_id: str | None = None):
        """Streams RequestOutput deltas (a Ray streaming generator for the caller)."""
        async for out in self.async_engine.generate(prompt, SamplingParams(**(params or {})), chat, request_id):
            yield out

    def abort(self, request_id: str) -> None:
        self.async_engine.abort(request_id)

    def stats(self) -> dict:
        eng = self.engine
        v = eng.verifier
        return {"kv": eng.kv.stats(), "proposer_failures": eng.num_proposer_failures,
                "verifier_restarts": eng.num_verifier_restarts, "kv_restarts": eng.kv.num_restarts,
                "verifier": v.stats() if hasattr(v, "stats") else {},
                "proposer": eng.proposer.stats() if eng.proposer is not None else {}}

    def ping(self) -> str:
        return "ok"

    def verifier_actors(self) -> list:
        """Handles of the TP ranks (fault-injection tests kill one)."""
        return list(self.engine.verifier.actors)

    def kv_actor(self):
        """Handle of the replica's KV allocator actor (fault-injection tests kill it)."""
        return self.engine.kv.handle

    def shutdown(self) -> None:
        self.async_engine.shutdown()
        shutdown_replica_engine(self.engine)


def _shutdown_verifier(verifier) -> None:
    from ray.util.placement_group import remove_placement_group

    verifier.shutdown()
    pg = getattr(verifier, "replica_placement_group", None)
    if pg is not None:
        remove_placement_group(pg)


class ReplicaLostError(RuntimeError):
    pass


class RayReplicaClient:
    """The caller's side: starts the scheduler actor and turns its stream into outputs."""

    def __init__(self, config: EngineConfig, opts: RayOptions):
        actor_cls = ray.remote(SchedulerActor)
        self.actor = actor_cls.options(num_cpus=opts.cpus_per_actor, max_restarts=-1,
                                       max_concurrency=1000).remote(config, opts)
        try:
            ray.get(self.actor.ping.remote(), timeout=opts.timeout_s)
        except ray.exceptions.RayActorError as e:
            raise ValueError(f"the engine replica failed to start: {_cause(e)}") from None

    async def stream(self, prompt, params: SamplingParams, chat: bool = False, request_id: str | None = None):
        gen = self.actor.generate.remote(prompt, params.model_dump(), chat, request_id)
        try:
            async for ref in gen:
                yield await ref
        except ray.exceptions.RayActorError as e:
            raise ReplicaLostError(f"the scheduler of this replica died and was restarted; request "
                                   f"{request_id or ''} was lost, retry it ({_cause(e)})") from None

    def generate_all(self, prompts: list, params: list[SamplingParams], chat: bool, concurrency: int | None):
        """All prompts, at most ``concurrency`` in flight; final outputs in input order."""
        import asyncio

        async def run():
            sem = asyncio.Semaphore(concurrency or len(prompts))

            async def one(i):
                async with sem:
                    last = None
                    async for out in self.stream(prompts[i], params[i], chat, f"cli-{os.getpid()}-{i}"):
                        last = out
                    return last
            return await asyncio.gather(*(one(i) for i in range(len(prompts))))
        return asyncio.run(run())

    def stats(self) -> dict:
        return ray.get(self.actor.stats.remote())

    def shutdown(self) -> None:
        try:
            ray.get(self.actor.shutdown.remote(), timeout=30)
        finally:
            ray.kill(self.actor)


def _cause(e: Exception) -> str:
    return str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__


def connect_or_start_ray() -> bool:
    """Connect to RAY_ADDRESS when set, else start a local instance. Returns True if we started it."""
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        return False
    ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    return True
