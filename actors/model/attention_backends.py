"""Attention backends: which attention a Llama-family model runs.

- ``torch``: ``actors.model.attention.paged_attention`` (pure torch; the reference and the CPU path);
- ``triton``: ``kernels.triton_attention.paged_attention``, one launch per layer reading the paged
  KV cache in place, fed from the ``ForwardBatch`` by ``triton_paged_attention`` below;
- ``auto``: triton on CUDA, torch elsewhere.

The Triton modules are imported only when used, so ``TRITON_INTERPRET=1`` (Triton on CPU, tests)
may be set any time before the first triton forward.
"""
from __future__ import annotations

import torch

from actors.model.batch import ForwardBatch

BACKENDS = ("auto", "torch", "triton")
_CACHE_KEY = "triton_attention"


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

    meta = batch.cache.get(_CACHE_KEY)
    if meta is None:
        tree = ta.pack_tree_masks(batch.window_masks or [None] * batch.num_seqs, q.device)
        max_context = batch.block_tables.shape[1] * batch.block_size  # an upper bound of every kv_len
        segments = ta.choose_num_segments(q.shape[0], batch.num_seqs, k_cache.shape[-2], max_context)
        meta = batch.cache[_CACHE_KEY] = (tree, segments)
    tree, segments = meta
    return ta.paged_attention(q, k_cache, v_cache, batch.query_start_loc, batch.kv_lens, batch.block_tables,
                              scale, tree=tree, num_segments=segments)
