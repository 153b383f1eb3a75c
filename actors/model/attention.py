"""Paged KV cache and attention in pure torch: the reference the Triton kernels are tested against.

KV cache per layer: ``k, v`` of shape [num_blocks, block_size, num_kv_heads, head_dim]; flat slot
``s = block * block_size + offset``. Visibility rules are those of ``actors.model.batch``.

``paged_attention`` gathers each sequence's keys through its block table and runs a padded
``scaled_dot_product_attention`` per group of sequences of similar shape (``group_sequences``):
usually one group for the whole batch. Why groups: padding makes one call cost
B x max_q x max_kv, so a 1,000-token prefill chunk batched with 63 decoding sequences padded every
one of them to 1,000 query rows (attention was 88% of a step of the training-data generator). The
gather indices and dense masks are built once per forward (on the host, with numpy, from the batch's
``HostMeta`` when it has one) and kept in ``batch.cache`` for every layer, with the buffers every
layer gathers K/V into and folds its query into: a layer's attention is a few ops (issue 25: every
op costs dispatcher and Python time). GQA folds the query heads sharing a KV head into the query-length axis, so K/V are never
repeated.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from actors.model.batch import ForwardBatch

_CACHE_KEY = "paged_attention"


def allocate_kv_cache(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One zero-filled (k, v) pair per layer, each [num_blocks, block_size, num_kv_heads, head_dim]: a
    view of a flat [num_blocks * block_size, num_kv_heads, head_dim] tensor, which ``_flat`` then
    returns as it is (a view op less each time a layer reads or writes its cache)."""
    flat = (num_blocks * block_size, num_kv_heads, head_dim)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    def one() -> torch.Tensor:
        return torch.zeros(flat, dtype=dtype, device=device).view(shape)
    return [(one(), one()) for _ in range(num_layers)]


def _flat(cache: torch.Tensor) -> torch.Tensor:  # [blocks, bs, kvh, d] -> [blocks * bs, kvh, d]
    base = cache._base  # allocate_kv_cache's flat tensor, when it is exactly that
    if (base is not None and base.dim() == 3 and base.shape[0] == cache.shape[0] * cache.shape[1]
            and base.shape[1:] == cache.shape[2:] and base.data_ptr() == cache.data_ptr() and cache.is_contiguous()):
        return base
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
    kv_index: torch.Tensor  # [B * max_kv] flat slot of each key position, sequence-major (padding repeats a real key)
    mask: torch.Tensor | None  # [B, max_q, max_kv] bool, True = visible; None = all visible or causal
    folded: dict  # (group size, dtype) -> additive mask [B, 1, g * max_q, max_kv]
    causal: bool = False  # every sequence is a prompt from position 0 (q_len == kv_len): no mask needed
    gathered: dict = field(default_factory=dict)  # (kvh, d, dtype, device) -> the K/V gather buffers and their views
    host_mask: np.ndarray | None = None  # ``mask`` on the host, when it was built there


GROUP_SLACK = 4096  # cost units a group may waste beyond half its real work (about one call's overhead)


def _work(q_len: int, kv_len: int) -> int:
    """Cost units of one sequence: query x key cells, plus ~8 rows' worth for gathering its keys
    (one padded call measured at about (q + 6..12) x keys on the 2-core CPU, fp32 and bf16)."""
    return (q_len + 8) * kv_len


def group_sequences(q_lens: list[int], kv_lens: list[int]) -> list[list[int]]:
    """Partition sequence indices into groups run as one padded call each: a sequence joins the
    current group while the group's padded cost stays within 1.5x its real cost plus ``GROUP_SLACK``
    (sequences visited by query length, then key length, descending). Each group is in ascending
    index order; a homogeneous batch is one group."""
    order = sorted(range(len(q_lens)), key=lambda i: (q_lens[i], kv_lens[i]), reverse=True)
    groups: list[list[int]] = []
    cur: list[int] = []
    max_q = max_kv = real = 0
    for i in order:
        mq, mk, r = max(max_q, q_lens[i]), max(max_kv, kv_lens[i]), real + _work(q_lens[i], kv_lens[i])
        if cur and 2 * (len(cur) + 1) * _work(mq, mk) > 3 * r + 2 * GROUP_SLACK:
            groups.append(sorted(cur))
            cur, mq, mk, r = [], q_lens[i], kv_lens[i], _work(q_lens[i], kv_lens[i])
        cur.append(i)
        max_q, max_kv, real = mq, mk, r
    return groups + ([sorted(cur)] if cur else [])


def _host_meta(batch: ForwardBatch) -> tuple[list[int], list[int], np.ndarray]:
    """(query_start_loc, kv_lens, block tables [B, max_blocks]) on the host: the batch's HostMeta, else read back."""
    if batch.host is not None:
        return batch.host.query_start_loc, batch.host.kv_lens, batch.host.block_tables
    return batch.query_start_loc.tolist(), batch.kv_lens.tolist(), batch.block_tables.cpu().numpy()


def _to_torch(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array as a tensor on ``device``: over the array's memory on CPU (frombuffer is no dispatcher
    op; a view is one, for 2+ dims), one copy elsewhere."""
    a = np.ascontiguousarray(a)
    t = torch.frombuffer(a, dtype=_TORCH_OF[a.dtype]) if a.size else torch.from_numpy(a)
    t = t.view(a.shape) if a.ndim != 1 else t
    return t if torch.device(device).type == "cpu" else t.to(device, non_blocking=True)


_TORCH_OF = {np.dtype(np.int64): torch.int64, np.dtype(np.bool_): torch.bool, np.dtype(np.float32): torch.float32}


def build_attn_meta(batch: ForwardBatch, device: torch.device) -> list[tuple[torch.Tensor | None, AttnMeta]]:
    """Per group of sequences: (its query rows [n] int64, or None when the group is the whole batch
    in order, and its gather indices and mask). Built once per forward, on the host (numpy: small
    arrays cost no dispatcher ops), then handed to torch without a copy on CPU."""
    qsl, kv_lens, tables = _host_meta(batch)
    q_lens = [qsl[i + 1] - qsl[i] for i in range(len(qsl) - 1)]
    windows = batch.window_masks or [None] * len(q_lens)
    groups = group_sequences(q_lens, kv_lens)
    if len(groups) == 1:
        return [(None, _group_meta(batch.block_size, tables, list(range(len(q_lens))), q_lens, kv_lens, windows,
                                   device))]
    parts = []
    for g in groups:
        rows = np.concatenate([np.arange(qsl[i], qsl[i + 1]) for i in g])
        parts.append((_to_torch(rows, device),
                      _group_meta(batch.block_size, tables[g], g, q_lens, kv_lens, windows, device)))
    return parts


def _group_meta(block_size: int, tables: np.ndarray, seqs: list[int], q_lens_all: list[int],
                kv_lens_all: list[int], windows_all: list, device: torch.device) -> AttnMeta:
    """Gather indices and the dense visibility mask of the sequences ``seqs`` of a batch (block
    tables [len(seqs), max_blocks]), whose query rows come in the order of ``seqs``."""
    q_lens, kv_lens = [q_lens_all[i] for i in seqs], [kv_lens_all[i] for i in seqs]
    windows = [windows_all[i] for i in seqs]
    num_seqs, max_q, max_kv, num_tokens = len(q_lens), max(q_lens), max(kv_lens), sum(q_lens)
    q_arr, kv_arr = np.array(q_lens, dtype=np.int64), np.array(kv_lens, dtype=np.int64)
    pos = np.minimum(np.arange(max_kv)[None, :], kv_arr[:, None] - 1)  # [B, max_kv], clamp padding
    blocks = np.take_along_axis(tables, pos // block_size, 1)
    kv_index = (blocks * block_size + pos % block_size).reshape(-1)
    out_index = None
    if num_seqs > 1 and min(q_lens) != max_q:
        starts = np.cumsum(q_arr) - q_arr
        seq_of_tok = np.repeat(np.arange(num_seqs), q_arr)
        out_index = _to_torch(np.arange(num_tokens) + seq_of_tok * max_q - starts[seq_of_tok], device)
    mask = None
    plain = all(w is None for w in windows)
    all_visible = plain and max_q == 1 and min(kv_lens) == max_kv
    # fresh prompts: query i sees keys 0..i, SDPA's own causal path (real rows never see padding)
    causal = plain and max_q > 1 and q_lens == kv_lens
    if not (all_visible or causal):
        mask = _dense_mask(q_arr, kv_arr, max_q, max_kv, windows)
    meta = AttnMeta(num_seqs, max_q, out_index, _to_torch(kv_index, device),
                    None if mask is None else _to_torch(mask, device), {}, causal)
    meta.host_mask = mask
    return meta


def _dense_mask(q_lens: np.ndarray, kv_lens: np.ndarray, max_q: int, max_kv: int,
                windows: list[torch.Tensor | None]) -> np.ndarray:
    """[B, max_q, max_kv] bool: committed context + causal new tokens, custom windows pasted in;
    padding query rows see key 0 only (never a fully masked row)."""
    i = np.arange(max_q).reshape(1, -1, 1)
    j = np.arange(max_kv).reshape(1, 1, -1)
    mask = j <= (kv_lens - q_lens).reshape(-1, 1, 1) + i
    mask = np.where(i < q_lens.reshape(-1, 1, 1), mask, j == 0)
    host: dict = {}  # id -> the window as numpy: a step's sequences often share one tree's mask
    for b, window in enumerate(windows):
        if window is None:
            continue
        q_b, w = window.shape
        kv_b = int(kv_lens[b])
        if q_b != int(q_lens[b]) or w > kv_b:
            raise ValueError(f"window_masks[{b}] has shape {tuple(window.shape)}; expected [q_len={int(q_lens[b])}, "
                             f"w <= kv_len={kv_b}]")
        win = host.get(id(window))
        if win is None:
            win = host[id(window)] = window.cpu().numpy()
        mask[b, :q_b, : kv_b - w] = True
        mask[b, :q_b, kv_b - w: kv_b] = win
        mask[b, :q_b, kv_b:] = False
    return mask


def _meta(batch: ForwardBatch, device: torch.device) -> list[tuple[torch.Tensor | None, AttnMeta]]:
    parts = batch.cache.get(_CACHE_KEY)
    if parts is None:
        parts = batch.cache[_CACHE_KEY] = build_attn_meta(batch, device)
    return parts


def _folded_mask(meta: AttnMeta, group: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask repeated for the ``group`` query heads folded into the query axis, as SDPA's additive
    mask in ``dtype`` (0 visible, -inf hidden: what SDPA makes of a bool mask, on every call; made
    here once per forward): [B, 1, g * max_q, max_kv]."""
    if meta.mask is None:
        return None
    m = meta.folded.get((group, dtype))
    if m is None:
        b, q, kv = meta.mask.shape
        if meta.host_mask is not None:  # on the host: the fp32 0/-inf (exact in any float dtype), then one cast
            folded = np.broadcast_to(meta.host_mask[:, None], (b, group, q, kv)).reshape(b, 1, group * q, kv)
            m = _to_torch(np.where(folded, np.float32(0), np.float32(-np.inf)), meta.mask.device)
            m = m if m.dtype is dtype else m.to(dtype)
        else:
            folded = meta.mask.unsqueeze(1).expand(b, group, q, kv).reshape(b, 1, group * q, kv)
            m = torch.zeros(folded.shape, dtype=dtype, device=folded.device).masked_fill_(~folded, float("-inf"))
        meta.folded[(group, dtype)] = m
    return m


GATHER_ROWS = 512  # up to this many keys per layer, torch.gather (2 ops); above, index_select (5, faster)


def _gather_buffers(meta: AttnMeta, cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(k rows, v rows, k view, v view, slots): two [B * max_kv, kvh, d] buffers every layer gathers
    into, their transposed views [B, kvh, max_kv, d] (as_strided: the view + transpose in one op), and
    the gather's slots, made once per forward: a layer's gather is then one op into memory already
    mapped, no empty and no view op (and 10-25% faster than a fresh tensor's page faults at a few MB).
    The slots are meta.kv_index [B * max_kv], or that broadcast to [B * max_kv, kvh, d] for
    torch.gather when there are at most GATHER_ROWS keys."""
    key = (cache.shape[-2], cache.shape[-1], cache.dtype, cache.device)
    bufs = meta.gathered.get(key)
    if bufs is None:
        n, b = meta.kv_index.shape[0], meta.num_seqs
        kvh, d = key[0], key[1]
        rows = [torch.empty((n, kvh, d), dtype=cache.dtype, device=cache.device) for _ in range(2)]
        views = [r.as_strided((b, kvh, n // b, d), (n * kvh * d // b, d, kvh * d, 1)) for r in rows]
        slots = meta.kv_index if n > GATHER_ROWS else meta.kv_index.as_strided((n, kvh, d), (1, 0, 0))
        bufs = meta.gathered[key] = (*rows, *views, slots)
    return bufs


def _gather(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """The keys (or values) at flat slots [B * max_kv] of cache [blocks, bs, kvh, d] into rows
    [B * max_kv, kvh, d] (slots broadcast to rows' shape: torch.gather). index_select copies whole
    rows: 2-3x faster than advanced indexing on the 2-core CPU (0.2-25 MB gathered) and than
    torch.gather from ~1,000 rows (it loads an index per element); torch.gather is 2 dispatcher ops
    to index_select's 5 (it selects a row of the source and of the output to size its copies), and
    as fast up to ~500 rows. Both copy: the same bits."""
    if slots.dim() == 1:
        torch.index_select(_flat(cache), 0, slots, out=rows)
    else:
        torch.gather(_flat(cache), 0, slots, out=rows)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)`` (no GQA repeat: q's heads are
    k's). On CPU it calls the flash kernel SDPA picks there directly: the same kernel and bits, an op less."""
    if q.device.type == "cpu" and q.dtype in _FLASH_DTYPES:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fold_buffers(meta: AttnMeta, h: int, kvh: int, d: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(query [B, kvh, g * max_q, d], its [B, kvh, g, max_q, d] view, output rows [B * max_q, h, d], their
    [B, kvh, g, max_q, d] view): the folded query and the unfolded output, made once per forward, so that
    a layer's fold and unfold are one strided copy each (a permute, an empty, a copy and views: 6-7 ops)."""
    key = ("fold", h, kvh, d, like.dtype, like.device)
    bufs = meta.gathered.get(key)
    if bufs is None:
        b, max_q, g = meta.num_seqs, meta.max_q, h // kvh
        q = torch.empty((b, kvh, g * max_q, d), dtype=like.dtype, device=like.device)
        out = torch.empty((b * max_q, h, d), dtype=like.dtype, device=like.device)
        out5 = out.as_strided((b, kvh, g, max_q, d), (max_q * h * d, g * d, d, h * d, 1))
        bufs = meta.gathered[key] = (q, q.view(b, kvh, g, max_q, d), out, out5)
    return bufs


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                    scale: float) -> torch.Tensor:
    """q [N, h, d]; k_cache/v_cache [blocks, bs, kvh, d] (this step's K/V already written) -> [N, h, d]."""
    parts = _meta(batch, q.device)
    if len(parts) == 1:
        return _attend_group(q, k_cache, v_cache, parts[0][1], scale)
    out = torch.empty_like(q)
    for rows, meta in parts:
        out.index_copy_(0, rows, _attend_group(q.index_select(0, rows), k_cache, v_cache, meta, scale))
    return out


def _attend_group(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttnMeta,
                  scale: float) -> torch.Tensor:
    """One padded SDPA call: q [n, h, d], the query rows of ``meta``'s sequences in order -> [n, h, d]."""
    n, h, d = q.shape
    kvh = k_cache.shape[-2]
    g = h // kvh
    b, max_q = meta.num_seqs, meta.max_q
    k_rows, v_rows, keys, values, slots = _gather_buffers(meta, k_cache)  # keys, values: [B, kvh, max_kv, d]
    _gather(k_cache, slots, k_rows)
    _gather(v_cache, slots, v_rows)
    if max_q == 1 and meta.out_index is None:  # decode: q [B, h, d] is already [B, kvh, g, d], no permutes
        mask = _folded_mask(meta, g, q.dtype)
        out = _sdpa(q.view(b, kvh, g, d), keys, values, mask, scale)
        # a view on CPU (one op; reshape is two); CUDA's kernels may return another layout (g = 3)
        return out.view(b, h, d) if out.is_contiguous() else out.reshape(b, h, d)
    if meta.out_index is not None:  # [B * max_q, h, d]: each sequence's rows padded to max_q
        q = q.new_zeros(b * max_q, h, d).index_copy_(0, meta.out_index, q)
    if meta.causal:  # heads unfolded: the causal kernel needs query i at row i (about 2x at 1,000 tokens)
        qp = q.view(b, max_q, h, d).transpose(1, 2)  # [B, h, max_q, d]
        out = F.scaled_dot_product_attention(qp, keys, values, is_causal=True, scale=scale, enable_gqa=True)
        out = out.transpose(1, 2).reshape(b * max_q, h, d)
    else:  # query heads sharing a KV head folded into the query axis, rows (head, token)
        qp, qp5, out_rows, out5 = _fold_buffers(meta, h, kvh, d, q)
        s0, s1, s2 = q.stride()  # q [B * max_q, h, d] as [B, kvh, g, max_q, d]: one strided view, one copy
        qp5.copy_(q.as_strided((b, kvh, g, max_q, d), (max_q * s0, g * s1, s1, s0, s2)))
        out = _sdpa(qp, keys, values, _folded_mask(meta, g, q.dtype), scale)  # [B, kvh, g * max_q, d]
        t0, t1, t2, t3 = out.stride()
        out5.copy_(out.as_strided((b, kvh, g, max_q, d), (t0, t1, max_q * t2, t2, t3)))
        out = out_rows  # [B * max_q, h, d], overwritten by the next layer (o_proj has read it by then)
    return out if meta.out_index is None else out.index_select(0, meta.out_index)
