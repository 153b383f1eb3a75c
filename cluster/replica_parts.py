"""Pure wiring from config to a replica's actors: the TP verifier group, the global KV allocator
actor and the proposer (drafter worker actors, or in-process beside the verifier)."""
from __future__ import annotations

import logging

import ray

from actors.kv_service import KVService
from actors.proposers.base import ProposerContext
from cluster.config import EngineConfig
from cluster.runtime import kv_blocks_for, resolve_device_dtype

log = logging.getLogger("specray.replica")
_DTYPE_NAMES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def build_verifier_group(config: EngineConfig, meta, opts):
    """One placement group for the replica (TP bundles + drafter bundles, STRICT_PACK), then the
    ShardGroup on its first tp bundles."""
    from cluster.shard_group import ShardGroup
    from cluster.topology import ReplicaTopology, create_placement_group

    device, dtype = resolve_device_dtype(config.device, config.dtype)
    num_blocks, _ = kv_blocks_for(config, meta.config, dtype, config.speculative.max_nodes)
    topo = ReplicaTopology(tp_size=opts.tp, num_drafters=opts.drafters, use_gpu=device.type == "cuda")
    pg = create_placement_group(topo, timeout_s=opts.timeout_s)
    group = ShardGroup.create(config.model, opts.tp, num_blocks, config.block_size, topology=topo,
                              placement_group=pg, dtype=_DTYPE_NAMES[str(dtype)], device=str(device),
                              attention_backend=config.attention_backend, enforce_eager=config.enforce_eager,
                              cpu_activations=config.cpu_activations,
                              max_num_seqs=config.max_num_seqs, offload_layers=config.offload.layers,
                              weights_device_gb=config.offload.weights_device_gb)
    group.replica_placement_group = pg  # drafters are placed on its later bundles
    group.replica_topology = topo
    return group


def build_kv_actor(num_blocks: int, config: EngineConfig, opts):
    """The replica's global allocator: one block table serves all TP ranks."""
    return ray.remote(KVService).options(num_cpus=0.05).remote(
        num_blocks, config.block_size, config.enable_prefix_caching)


def build_proposer_for(config: EngineConfig, verifier, meta, opts):
    """Drafter workers when ``opts.drafters`` > 0: worker 0 runs the configured method and, for a
    draft model, extra workers run n-gram lookup, their trees merged (SpecInfer's merge); n-gram
    alone needs one worker. layerskip always runs beside the verifier (it shares the target's
    weights and KV cache). A drafter that fails to load is an error naming it, or plain decoding
    with ``allow_no_spec``."""
    device, dtype = resolve_device_dtype(config.device, config.dtype)
    spec = config.speculative.for_device(device.type)
    if not spec.enabled:
        return None
    ctx = ProposerContext(config.model, verifier, meta.tokenizer, device, dtype, config.block_size,
                          config.attention_backend, config.enforce_eager)
    try:
        if opts.drafters > 0 and spec.method in ("ngram", "draft"):
            return _remote_proposer(spec, ctx, opts)
        from cluster.proposers import build_proposer

        return build_proposer(spec, ctx)
    except Exception as e:
        if not opts.allow_no_spec:
            raise ValueError(f"drafter {spec.draft_model or spec.method!r} failed to load: {e}") from None
        log.warning("drafter %s failed to load (%s); serving without speculation", spec.method, e)
        return None


def drafter_methods(method: str, drafters: int) -> list[str]:
    return [method] + ["ngram"] * (drafters - 1) if method == "draft" else ["ngram"]


def _remote_proposer(spec, ctx: ProposerContext, opts):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from cluster.proposers import build_remote_proposer

    pg, topo = ctx.verifier.replica_placement_group, ctx.verifier.replica_topology
    # any free bundle of the replica's group: the verifier ranks fill theirs, drafters take the rest
    options = {"num_cpus": topo.cpus_per_drafter,
               "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=-1)}
    return build_remote_proposer(spec, ctx, drafter_methods(spec.method, opts.drafters), actor_options=options,
                                 start_timeout_s=opts.timeout_s)
