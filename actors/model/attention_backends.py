"""Attention backends: which attention (and fused small ops) a Llama-family model runs.

- ``torch``: ``actors.model.attention.paged_attention`` (pure torch; the reference and the CPU path);
- ``triton``: ``kernels.triton_attention.paged_attention``, one launch per layer reading the paged
  KV cache in place, fed from the ``ForwardBatch`` by ``triton_paged_attention`` below; with fused
  ops (on CUDA by default) also the Triton RMSNorm + residual and SiLU-and-multiply kernels and
  RoPE fused with the KV-cache write (``kernels.triton_fused``);
- ``auto``: triton on CUDA, torch elsewhere.

``set_attention_backend(model, name)`` sets the hooks on the model's modules (LlamaAttention's
``attend`` and ``rope_write_kv``, RMSNorm's ``fused_add_norm``, SwiGLUMLP's ``fused_act``); the
engine calls it once per model it runs. The Triton modules are imported only when chosen, so
``TRITON_INTERPRET=1`` (Triton on CPU, tests) may be set any time before the first triton model.
"""
from __future__ import annotations

import torch
from torch import nn

from actors.model.attention import paged_attention
from actors.model.batch import ForwardBatch
from actors.model.layers import RMSNorm, SwiGLUMLP
from actors.model.llama import LlamaAttention

BACKENDS = ("auto", "torch", "triton")
CACHE_KEY = "triton_attention"


def resolve_backend(name: str, device: torch.device | str) -> str:
    """'auto' | 'torch' | 'triton' -> 'torch' or 'triton' for a model on ``device``."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    if name == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return name


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                           scale: float) -> torch.Tensor:
    """``paged_attention``'s contract on the Triton kernel: q [N, h, d] -> [N, h, d]. The tree masks and
    the split-K choice are made once per forward (from shapes only: no device sync) and kept in
    ``batch.cache`` for every layer."""
    from kernels import triton_attention as ta

    meta = batch.cache.get(CACHE_KEY)
    if meta is None:
        tree = ta.pack_tree_masks(batch.window_masks or [None] * batch.num_seqs, q.device)
        max_context = batch.block_tables.shape[1] * batch.block_size  # an upper bound of every kv_len
        segments = ta.choose_num_segments(q.shape[0], batch.num_seqs, k_cache.shape[-2], max_context)
        # the kernel indexes its metadata densely: a lone token's doubled batch (ForwardBatch.doubled,
        # on CPU) holds broadcast views of one row
        dense = (batch.query_start_loc.contiguous(), batch.kv_lens.contiguous(), batch.block_tables.contiguous())
        meta = batch.cache[CACHE_KEY] = (tree, segments, dense)
    tree, segments, (qsl, kv_lens, tables) = meta
    return ta.paged_attention(q, k_cache, v_cache, qsl, kv_lens, tables, scale, tree=tree, num_segments=segments)


def set_attention_backend(model: nn.Module, name: str = "auto", device: torch.device | str | None = None,
                          fused_ops: bool | None = None) -> str:
    """Point ``model``'s attention at backend ``name`` ('auto' resolved for ``device``, default the
    model's parameters' device) and return the resolved name. fused_ops: also the fused Triton small
    ops (RMSNorm + residual, SiLU-and-multiply, RoPE + KV write); None = with triton on CUDA only."""
    if device is None:
        device = next(model.parameters()).device
    backend = resolve_backend(name, device)
    use_triton = backend == "triton"
    fused = use_triton and (torch.device(device).type == "cuda" if fused_ops is None else fused_ops)
    attend, norm, act, rope = paged_attention, None, None, None
    if use_triton:
        from kernels.triton_attention import INTERPRETED

        if torch.device(device).type != "cuda" and not INTERPRETED:
            raise ValueError(f"attention backend 'triton' needs a CUDA device (the model is on {device}); on CPU "
                             "it runs only interpreted, for tests (TRITON_INTERPRET=1): use 'auto' or 'torch'")
        attend = triton_paged_attention
    if fused:
        from kernels import triton_fused

        norm, act, rope = triton_fused.rmsnorm_residual, triton_fused.silu_and_mul, triton_fused.rope_write_kv
    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.fused_add_norm = norm
        elif isinstance(m, SwiGLUMLP):
            m.fused_act = act
        elif isinstance(m, LlamaAttention):
            m.attend, m.rope_write_kv = attend, rope
    return backend
