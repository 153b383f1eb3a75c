"""Paged KV cache and attention in pure torch: the reference the Triton kernels are tested against.

KV cache per layer: ``k, v`` of shape [num_blocks, block_size, num_kv_heads, head_dim]; flat slot
``s = block * block_size + offset``. Visibility rules are those of ``actors.model.batch``.

``paged_attention`` gathers each sequence's keys through its block table and runs ONE padded
``scaled_dot_product_attention`` for the whole batch. The gather indices and the dense mask are built
once per forward and kept in ``batch.cache`` for every layer. GQA folds the query heads sharing a KV
head into the query-length axis, so K/V are never repeated.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from actors.model.batch import ForwardBatch

_CACHE_KEY = "paged_attention"


def allocate_kv_cache(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One zero-filled (k, v) pair per layer, each [num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


def _flat(cache: torch.Tensor) -> torch.Tensor:  # [blocks, bs, kvh, d] -> [blocks * bs, kvh, d]
    return cache.view(-1, cache.shape[-2], cache.shape[-1])


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store k, v [N, kvh, d] at flat slots slot_mapping [N] int64 of k_cache/v_cache [blocks, bs, kvh, d]."""
    _flat(k_cache).index_copy_(0, slot_mapping, k)
    _flat(v_cache).index_copy_(0, slot_mapping, v)


def copy_kv_slots(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], src_slots: torch.Tensor,
                  dst_slots: torch.Tensor) -> None:
    """Copy K/V of src_slots [M] to dst_slots [M] in every layer (reads all sources before writing)."""
    if src_slots.numel() == 0:
        return
    for k_cache, v_cache in kv_caches:
        for cache in (k_cache, v_cache):
            flat = _flat(cache)
            flat.index_copy_(0, dst_slots, flat.index_select(0, src_slots))


@dataclass(slots=True)
class AttnMeta:
    """Per-forward gather indices and mask shared by every layer."""

    num_seqs: int
    max_q: int
    out_index: torch.Tensor | None  # [N] row of each token in the padded [B * max_q] layout; None = no padding
    kv_index: torch.Tensor  # [B, max_kv] flat slot of each key position (padding repeats a real key)
    mask: torch.Tensor | None  # [B, max_q, max_kv] bool, True = visible; None = all visible
    folded: dict  # group size -> mask [B, 1, g * max_q, max_kv]


def build_attn_meta(batch: ForwardBatch, device: torch.device) -> AttnMeta:
    """Gather indices and the dense visibility mask of a batch (built once per forward)."""
    i64 = dict(dtype=torch.int64, device=device)
    qsl = batch.query_start_loc.to(device)
    q_lens_t = qsl[1:] - qsl[:-1]
    kv_lens_t = batch.kv_lens.to(device)
    q_lens, kv_lens = q_lens_t.tolist(), kv_lens_t.tolist()
    num_seqs, max_q, max_kv = len(q_lens), max(q_lens), max(kv_lens)
    pos = torch.arange(max_kv, **i64)
    pos = torch.minimum(pos.unsqueeze(0), (kv_lens_t - 1).unsqueeze(1))  # [B, max_kv], clamp padding
    blocks = batch.block_tables.to(device).gather(1, pos // batch.block_size)
    kv_index = blocks * batch.block_size + pos % batch.block_size
    out_index = None
    if num_seqs > 1 and min(q_lens) != max_q:
        seq_of_tok = torch.repeat_interleave(torch.arange(num_seqs, **i64), q_lens_t, output_size=batch.num_tokens)
        out_index = torch.arange(batch.num_tokens, **i64) + seq_of_tok * max_q - qsl[seq_of_tok]
    windows = batch.window_masks or [None] * num_seqs
    mask = None
    all_visible = max_q == 1 and min(kv_lens) == max_kv and all(w is None for w in windows)
    if not all_visible:
        mask = _dense_mask(q_lens_t, kv_lens_t, max_q, max_kv, windows)
    return AttnMeta(num_seqs, max_q, out_index, kv_index, mask, {})


def _dense_mask(q_lens: torch.Tensor, kv_lens: torch.Tensor, max_q: int, max_kv: int,
                windows: list[torch.Tensor | None]) -> torch.Tensor:
    """[B, max_q, max_kv] bool: committed context + causal new tokens, custom windows pasted in;
    padding query rows see key 0 only (never a fully masked row)."""
    dev = q_lens.device
    i = torch.arange(max_q, device=dev).view(1, -1, 1)
    j = torch.arange(max_kv, device=dev).view(1, 1, -1)
    mask = j <= (kv_lens - q_lens).view(-1, 1, 1) + i
    mask = torch.where(i < q_lens.view(-1, 1, 1), mask, j == 0)
    for b, window in enumerate(windows):
        if window is None:
            continue
        q_b, w = window.shape
        kv_b = int(kv_lens[b])
        if q_b != int(q_lens[b]) or w > kv_b:
            raise ValueError(f"window_masks[{b}] has shape {tuple(window.shape)}; expected [q_len={int(q_lens[b])}, "
                             f"w <= kv_len={kv_b}]")
        mask[b, :q_b, : kv_b - w] = True
        mask[b, :q_b, kv_b - w: kv_b] = window.to(dev)
        mask[b, :q_b, kv_b:] = False
    return mask


def _meta(batch: ForwardBatch, device: torch.device) -> AttnMeta:
    meta = batch.cache.get(_CACHE_KEY)
    if meta is None:
        meta = batch.cache[_CACHE_KEY] = build_attn_meta(batch, device)
    return meta


def _folded_mask(meta: AttnMeta, group: int) -> torch.Tensor | None:
    """The mask repeated for the ``group`` query heads folded into the query axis: [B, 1, g * max_q, max_kv]."""
    if meta.mask is None:
        return None
    m = meta.folded.get(group)
    if m is None:
        b, q, kv = meta.mask.shape
        m = meta.folded[group] = meta.mask.unsqueeze(1).expand(b, group, q, kv).reshape(b, 1, group * q, kv)
    return m


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                    scale: float) -> torch.Tensor:
    """q [N, h, d]; k_cache/v_cache [blocks, bs, kvh, d] (this step's K/V already written) -> [N, h, d]."""
    n, h, d = q.shape
    kvh = k_cache.shape[-2]
    g = h // kvh
    meta = _meta(batch, q.device)
    b, max_q = meta.num_seqs, meta.max_q
    if meta.out_index is None:
        qp = q.view(b, max_q, kvh, g, d)
    else:
        qp = q.new_zeros(b * max_q, h, d).index_copy_(0, meta.out_index, q).view(b, max_q, kvh, g, d)
    qp = qp.permute(0, 2, 3, 1, 4).reshape(b, kvh, g * max_q, d)  # [B, kvh, g * max_q, d]
    keys = _flat(k_cache)[meta.kv_index].transpose(1, 2)  # [B, kvh, max_kv, d]
    values = _flat(v_cache)[meta.kv_index].transpose(1, 2)
    out = F.scaled_dot_product_attention(qp, keys, values, attn_mask=_folded_mask(meta, g), scale=scale)
    out = out.view(b, kvh, g, max_q, d).permute(0, 3, 1, 2, 4).reshape(b * max_q, h, d)
    return out if meta.out_index is None else out.index_select(0, meta.out_index)
