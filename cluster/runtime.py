"""Device, dtype and KV-pool sizing decisions, derived from config once."""
from __future__ import annotations

import os

import torch

from actors.kv_disk_pool import DiskTierSpec
from actors.kv_swap import SwapPolicy
from cluster.shared_kv import check_shared_tier

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """auto: CUDA when present; fp32 on CPU, bf16 on GPU (ARCHITECTURE.md section 7)."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, _DTYPES[dtype]


def kv_cache_dtype_for(config, dtype: torch.dtype, model, verifier=None) -> torch.dtype:
    """The KV cache's dtype: the model's (``kv_cache_dtype`` auto), or the one asked for. bfloat16
    under an fp32 model halves the bytes a decode step reads from the cache and doubles the blocks
    per GB, but rounds every key and value to 8 bits of mantissa (the logits change: opt-in). Only
    the native CPU kernels read such a cache. ``verifier``: one the engine was given (a benchmark's
    engines share one; tensor-parallel shards keep their caches in their own processes)."""
    if config.kv_cache_dtype == "auto":
        return dtype
    kv = _DTYPES[config.kv_cache_dtype]
    if kv is dtype:
        return kv
    from actors.model.attention_backends import uses_native

    caches = getattr(verifier, "kv_caches", None)  # a remote (tensor-parallel) verifier has none here
    shared_ok = verifier is None or (caches is not None and caches[0][0].dtype is kv)
    if not shared_ok or not uses_native(model):
        raise ValueError(f"kv_cache_dtype={config.kv_cache_dtype!r} under a {str(dtype).removeprefix('torch.')} "
                         "model needs the in-process native CPU attention (--attention-backend native, one "
                         "tensor-parallel rank); use kv_cache_dtype='auto'")
    return kv


def kv_block_bytes(model_config, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * model_config.num_layers * block_size * model_config.num_kv_heads * model_config.head_dim * elem


def kv_tiers_for(config, model_config, dtype: torch.dtype, remote_verifier: bool,
                 remote_kv: bool) -> tuple[int, DiskTierSpec | None]:
    """(host tier blocks, disk tier or None); tiers need the in-process KV service, and the disk tier
    the in-process verifier (checked before anything, the disk dir's lock included, is taken), and so
    does the shared tier across replicas."""
    check_shared_tier(config, remote_verifier, remote_kv)
    num_host, disk = host_blocks_for(config, model_config, dtype), disk_tier_for(config, model_config, dtype)
    if num_host and remote_kv:
        raise ValueError("kv_offload needs the in-process KV service; a remote one has no host tier yet")
    if disk is not None and remote_verifier:
        raise ValueError("kv_offload.disk_dir needs the in-process verifier; this verifier backend has no "
                         "disk tier yet (leave --kv-disk-dir out)")
    return num_host, disk


def host_blocks_for(config, model_config, dtype: torch.dtype) -> int:
    """Blocks of the host KV tier (0 = off): ``kv_offload.host_blocks``, else ``host_gb`` over the
    bytes of one block (all layers, K and V)."""
    off = config.kv_offload
    if not off.enabled:
        return 0
    return _tier_blocks("host", off.host_blocks, off.host_gb, config, model_config, dtype)


def disk_tier_for(config, model_config, dtype: torch.dtype) -> DiskTierSpec | None:
    """The disk KV tier (None = off): ``kv_offload.disk_dir`` holding ``disk_blocks`` blocks, else
    ``disk_gb`` over the bytes of one block."""
    off = config.kv_offload
    if not off.disk_enabled:
        return None
    n = _tier_blocks("disk", off.disk_blocks, off.disk_gb, config, model_config, dtype)
    return DiskTierSpec(os.path.abspath(os.path.expanduser(off.disk_dir)), n)


def _tier_blocks(tier: str, blocks: int | None, gb: float | None, config, model_config, dtype: torch.dtype) -> int:
    if blocks is not None:
        return blocks
    per_block = kv_block_bytes(model_config, config.block_size, dtype)
    n = int(gb * 2**30) // per_block
    if n < 1:
        raise ValueError(f"kv_offload.{tier}_gb={gb} is smaller than one KV block ({per_block} bytes "
                         f"= {per_block / 2**30:.3g} GiB for block_size {config.block_size}): raise --kv-{tier}-gb "
                         f"or pass 0 to turn the {tier} tier off")
    return n


def kv_blocks_for(config, model_config, dtype: torch.dtype, max_spec_nodes: int) -> tuple[int, int]:
    """Number of KV blocks and the max model length. One sequence of max_model_len tokens plus its
    draft slots always fits, so preemption can always make progress."""
    bs = config.block_size
    if config.num_kv_blocks is not None:
        blocks = config.num_kv_blocks
    else:
        blocks = max(1, int(config.kv_cache_gb * 2**30) // kv_block_bytes(model_config, bs, dtype))
    fits = blocks * bs - max_spec_nodes - bs
    # a sliding-window model (Mistral v0.1) attends to its last `window` tokens only; sequences that
    # never grow past the window need no window in attention, so the context stops there
    context = min(model_config.max_position_embeddings, getattr(model_config, "sliding_window", None) or 1 << 62)
    limit = min(context, config.max_model_len or 1 << 62)
    if config.max_model_len is not None and config.max_model_len > context:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's context {context}"
                         + (" (its sliding attention window, which attention does not apply)"
                            if context < model_config.max_position_embeddings else ""))
    if fits < 16:
        raise ValueError(f"KV pool of {blocks} blocks x {bs} tokens is too small; raise num_kv_blocks/kv_cache_gb")
    return blocks, min(limit, fits)


def swap_policy_for(config, num_host: int, verifier) -> SwapPolicy | None:
    """How preemption gives a sequence's blocks back (``kv_offload.preemption``): a SwapPolicy over
    the host tier's measured copy costs, or None (recompute: no host tier, or asked for)."""
    mode = config.kv_offload.preemption
    if not num_host or mode == "recompute":
        return None
    return SwapPolicy(mode, verifier.host_pool.block_bytes, verifier.kv_copy_stats)


def load_target(config, device: torch.device, dtype: torch.dtype):
    """The engine's target model with its tokenizer. With weight offload on an accelerator it is
    loaded on the host: the offloader (actors/model/weight_offload.py) moves all but the streamed
    layers to the device, so a model larger than the device loads."""
    from actors.model import registry
    from actors.model.loader import load_model
    from actors.model.weight_offload import load_device

    if registry.is_random(config.model):  # before loading: random:llama-3-8b is 16-32 GB of weights
        raise ValueError(f"model {config.model!r} has random weights and no tokenizer, which the engine needs to "
                         "encode prompts and decode outputs; random models run only below the engine (the "
                         "Verifier, as `python -m benchmarks.gpu_bench` does): pass an alias, a local HF model "
                         "directory or a .gguf file")
    return load_model(config.model, dtype=dtype, device=load_device(device, config.offload.enabled))


def local_verifier(config, model, device: torch.device, dtype: torch.dtype, num_blocks: int, max_model_len: int,
                   num_host: int, disk: DiskTierSpec | None):
    """The in-process Verifier of ``model`` as ``config`` asks (KV tiers, graphs, weight offload, what
    the CPU products multiply: set for this process, as a tensor-parallel shard sets it for its own)."""
    from actors.model.weight_offload import offload_layers_for
    from actors.verifier import Verifier
    from kernels import cpu_native

    cpu_native.use_activations(config.cpu_activations, device)

    offload = offload_layers_for(config.offload.layers, config.offload.weights_device_gb, model)
    return Verifier(model, num_blocks, config.block_size, device, dtype, num_host_blocks=num_host,
                    enforce_eager=config.enforce_eager, max_num_seqs=config.max_num_seqs,
                    max_model_len=max_model_len, kv_disk=disk, offload_layers=offload)
