"""Paged attention over a flattened batch in Triton: one launch per layer for prefill chunks,
decode tokens and token-tree nodes together; ``paged_attention_ref`` is its pure-torch reference.

Arguments are plain tensors (kernels/ imports nothing from actors/):

- ``q`` [N, h, d]: the new tokens' queries, sequence b owning rows ``[qsl[b], qsl[b+1])``;
- ``k_cache``/``v_cache`` [num_blocks, block_size, kvh, d], this step's K/V already written;
  sequence b's keys are its logical positions ``[0, kv_lens[b])`` read in place through
  ``block_tables[b]`` (no dense gather);
- visibility: keys before the new tokens are visible to all of them; over the new tokens it is
  causal, unless ``tree`` (``pack_tree_masks``) gives sequence b a window of the trailing ``w``
  key positions and one mask row per query (a token-tree node sees its ancestors only).

Programs: one per (tile of ``BLOCK_Q`` query tokens of one sequence, KV head[, key segment]). A
program holds the tile's queries of all ``h / kvh`` query heads sharing its KV head as
``BLOCK_Q x GROUP_PAD`` rows, so K/V are read once per group and never repeated. The tile grid
has ``N // BLOCK_Q + B`` slots (an upper bound known without reading ``query_start_loc``); a
program finds its sequence by binary search over ``query_start_loc`` and exits if it has no
rows (vLLM's unified attention does the same). Online softmax in base 2, fp32 accumulation.

Split-K: with ``num_segments`` S > 1, the keys a tile needs are cut into S segments run by
separate programs, each writing an unnormalised partial (acc, max, sum) that ``_reduce_kernel``
merges: long contexts at small batch keep the GPU busy.

Under ``TRITON_INTERPRET=1`` (CPU, tests) ``tl.dot`` on bf16 operands gives wrong results, so
interpreted launches upcast the operands to fp32 before each product; on CUDA bf16 products use
the tensor cores and fp32 ones use IEEE fp32 (no TF32), so fp32 matches the reference closely.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
NEG_BIG = tl.constexpr(-1.0e30)  # initial running max: finite, so fully masked rows give exp2(-inf) = 0, not NaN


@dataclass(frozen=True)
class TreeMasks:
    """Token-tree visibility of the new tokens, packed for the kernel.

    win_lens [B] int32: w_b, the trailing key window governed by the mask (0 = causal sequence);
    row_start [B] int32: the first mask row of sequence b; mask [R, W] int8: row ``row_start[b] + i``
    column c says whether query i of b sees key position ``kv_lens[b] - w_b + c``."""

    win_lens: torch.Tensor
    row_start: torch.Tensor
    mask: torch.Tensor


def pack_tree_masks(windows: list[torch.Tensor | None], device: torch.device | str) -> TreeMasks | None:
    """Per-sequence window masks ([q_b, w_b] bool, or None = causal) -> TreeMasks, or None when
    every sequence is causal. Uses only the masks' shapes on the host (no device sync)."""
    if all(w is None for w in windows):
        return None
    width = max(w.shape[1] for w in windows if w is not None)
    win_lens, row_start, rows, r = [], [], [], 0
    for w in windows:
        win_lens.append(0 if w is None else int(w.shape[1]))
        row_start.append(r)
        if w is not None:
            rows.append(F.pad(w.to(device=device, dtype=torch.int8), (0, width - w.shape[1])))
            r += int(w.shape[0])
    i32 = dict(dtype=torch.int32, device=device)
    return TreeMasks(torch.tensor(win_lens, **i32), torch.tensor(row_start, **i32), torch.cat(rows))


@triton.jit
def _find_seq(qsl_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence b whose tile slots start at or before ``tile``: slots of b begin at
    qsl[b] // BLOCK_Q + b (each sequence gets at least cdiv(q_b, BLOCK_Q) slots)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if start <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attn_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, qsl_ptr, kv_lens_ptr, tables_ptr,
    win_ptr, mrow_ptr, mask_ptr, part_acc_ptr, part_ml_ptr,
    scale_log2, num_seqs, block_size,
    stride_qn, stride_qh, stride_on, stride_oh, stride_kb, stride_ks, stride_kh, stride_tb, stride_m,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr, NUM_SEGMENTS: tl.constexpr, HAS_TREE: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    tile_slot = tl.program_id(0)
    kvh = tl.program_id(1)
    seg = tl.program_id(2)
    b = _find_seq(qsl_ptr, tile_slot, num_seqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    tile = tile_slot - (q_start // BLOCK_Q + b)
    if tile * BLOCK_Q < q_len:
        kv_len = tl.load(kv_lens_ptr + b)
        ctx = kv_len - q_len  # keys before the first new token: visible to every query
        rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
        qi = tile * BLOCK_Q + rows // GROUP_PAD  # query index within the sequence
        hg = rows % GROUP_PAD
        head = kvh * GROUP + hg
        row_ok = (qi < q_len) & (hg < GROUP)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        tok = q_start + qi
        q = tl.load(q_ptr + tok[:, None] * stride_qn + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
        last_q = tl.minimum(tile * BLOCK_Q + BLOCK_Q, q_len) - 1
        kv_stop = ctx + last_q + 1  # keys this tile may see: [0, kv_stop)
        if HAS_TREE:
            win = tl.load(win_ptr + b)
            mrow = tl.load(mrow_ptr + b)
            kv_stop = tl.where(win > 0, kv_len, kv_stop)
        k_lo = 0
        k_hi = kv_stop
        if NUM_SEGMENTS > 1:
            seg_len = tl.cdiv(tl.cdiv(kv_stop, NUM_SEGMENTS), TILE_N) * TILE_N
            k_lo = seg * seg_len
            k_hi = tl.minimum(kv_stop, k_lo + seg_len)
        m_i = tl.full([BLOCK_Q * GROUP_PAD], NEG_BIG, tl.float32)
        l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
        acc = tl.zeros([BLOCK_Q * GROUP_PAD, BLOCK_D], tl.float32)
        kv_off = kvh * stride_kh
        for start in range(k_lo, k_hi, TILE_N):
            j = start + tl.arange(0, TILE_N)
            j_ok = j < k_hi
            blk = tl.load(tables_ptr + b * stride_tb + j // block_size, mask=j_ok, other=0).to(tl.int64)
            slot = blk * stride_kb + (j % block_size) * stride_ks + kv_off  # [TILE_N]
            k = tl.load(k_ptr + slot[None, :] + d[:, None], mask=j_ok[None, :] & d_ok[:, None], other=0.0)
            if DOT_FP32:
                s = tl.dot(q, k.to(tl.float32), input_precision="ieee")
            else:
                s = tl.dot(q, k)
            s = s * scale_log2  # [rows, TILE_N], base-2 logits
            vis = j[None, :] <= (ctx + qi)[:, None]
            if HAS_TREE:
                w0 = kv_len - win
                in_win = (j >= w0) & j_ok  # empty when win == 0 (w0 = kv_len)
                mv = tl.load(mask_ptr + (mrow + qi)[:, None] * stride_m + (j - w0)[None, :],
                             mask=row_ok[:, None] & in_win[None, :], other=0)
                tree_vis = tl.where(in_win[None, :], mv != 0, (j < w0)[None, :])
                vis = tl.where(win > 0, tree_vis, vis)
            vis = vis & j_ok[None, :] & row_ok[:, None]
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + slot[:, None] + d[None, :], mask=j_ok[:, None] & d_ok[None, :], other=0.0)
            if DOT_FP32:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        io_ok = row_ok[:, None] & d_ok[None, :]
        if NUM_SEGMENTS == 1:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(out_ptr + tok[:, None] * stride_on + head[:, None] * stride_oh + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=io_ok)
        else:
            # partials [N, h, S, BLOCK_D] and [N, h, S, 2] (max, sum), contiguous
            part = (tok * (GROUP * tl.num_programs(1)) + head) * NUM_SEGMENTS + seg
            tl.store(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=io_ok)
            tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
            tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _reduce_kernel(out_ptr, part_acc_ptr, part_ml_ptr, num_heads, stride_on, stride_oh,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SEGMENTS: tl.constexpr):
    """Merge the S partials of one (token, head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
    tok = tl.program_id(0)
    head = tl.program_id(1)
    part = (tok * num_heads + head) * NUM_SEGMENTS + tl.arange(0, NUM_SEGMENTS)
    m = tl.load(part_ml_ptr + part * 2)
    l = tl.load(part_ml_ptr + part * 2 + 1)
    d = tl.arange(0, BLOCK_D)
    acc = tl.load(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :])
    w = tl.exp2(m - tl.max(m, 0))
    total = tl.sum(w * l, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + tok * stride_on + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


INTERPRETED = type(_attn_kernel).__name__ == "InterpretedFunction"  # TRITON_INTERPRET=1 at import


def check_launchable(x: torch.Tensor) -> None:
    """Clear error instead of a driver failure when a compiled kernel meets CPU tensors."""
    if x.device.type != "cuda" and not INTERPRETED:
        raise RuntimeError(f"Triton kernels need CUDA tensors (got {x.device}), or TRITON_INTERPRET=1 set before "
                           "kernels.triton_* is imported (CPU tests); use the torch attention backend on CPU")


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def choose_block_q(num_tokens: int, num_seqs: int, group_pad: int) -> int:
    """Query tokens per program: the batch's mean query length rounded up to a power of two,
    with at least 16 rows (tl.dot's minimum) and at most 64 rows per program."""
    mean_q = -(-num_tokens // max(1, num_seqs))
    rows = min(64, max(16, _pow2(mean_q) * group_pad))
    return max(1, rows // group_pad)


def choose_num_segments(num_tokens: int, num_seqs: int, num_kv_heads: int, max_context: int,
                        target_programs: int = 128, min_segment: int = 512, max_segments: int = 16) -> int:
    """Split-K segments for a launch, from shapes known on the host: more than one only for
    decode-like batches (at most 4 query tokens per sequence) whose (sequence, KV head) programs
    are fewer than ``target_programs`` (about the SM count of an A100/H100) and whose longest
    possible context (``max_context``, an upper bound) gives each segment ``min_segment`` keys.
    A power of two. (Untuned: the GPU session should time it.)"""
    if num_tokens > 4 * num_seqs:
        return 1
    programs = max(1, num_seqs * num_kv_heads)
    s = min(max_segments, max_context // min_segment, target_programs // programs)
    return 1 << (max(1, s).bit_length() - 1)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                    kv_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, tree: TreeMasks | None = None,
                    num_segments: int = 1, block_q: int | None = None, tile_n: int = 32) -> torch.Tensor:
    """q [N, h, d] (last dim contiguous); caches [blocks, bs, kvh, d]; query_start_loc [B+1],
    kv_lens [B], block_tables [B, max_blocks] (int32 or int64, on q's device) -> out [N, h, d].
    num_segments: split-K segments (a power of two; 1 = none)."""
    n, h, d = q.shape
    num_blocks, bs, kvh, d_k = k_cache.shape
    if d_k != d or h % kvh or k_cache.stride() != v_cache.stride() or q.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError(f"paged_attention: q {tuple(q.shape)} / caches {tuple(k_cache.shape)} with strides "
                         f"{k_cache.stride()}, {v_cache.stride()}: need equal head dims, h divisible by kvh, "
                         "equal cache layouts and a contiguous last dim")
    if num_segments < 1 or num_segments & (num_segments - 1):
        raise ValueError(f"num_segments={num_segments} must be a power of two")
    check_launchable(q)
    out = torch.empty(n, h, d, dtype=q.dtype, device=q.device)
    num_seqs = kv_lens.shape[0]
    if n == 0:
        return out
    group = h // kvh
    group_pad = _pow2(group)
    block_q = block_q or choose_block_q(n, num_seqs, group_pad)
    if q.is_cuda:  # tl.dot needs every side >= 16 when compiled (the interpreter takes any size)
        block_q = max(block_q, 16 // group_pad)
    block_d = max(16, _pow2(d))
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise ValueError(f"tile_n={tile_n} must be a power of two >= 16")
    dummy = kv_lens  # any tensor for unused pointer arguments
    has_tree = tree is not None
    if num_segments > 1:
        part_acc = torch.empty(n * h * num_segments * block_d, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(n * h * num_segments * 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = dummy
    grid = (n // block_q + num_seqs, kvh, num_segments)
    _attn_kernel[grid](
        out, q, k_cache, v_cache, query_start_loc, kv_lens, block_tables,
        tree.win_lens if has_tree else dummy, tree.row_start if has_tree else dummy,
        tree.mask if has_tree else dummy, part_acc, part_ml,
        scale * LOG2E, num_seqs, bs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        tree.mask.stride(0) if has_tree else 0,
        HEAD_DIM=d, BLOCK_D=block_d, GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, TILE_N=tile_n,
        NUM_SEGMENTS=num_segments, HAS_TREE=has_tree, DOT_FP32=INTERPRETED or q.dtype == torch.float32,
    )
    if num_segments > 1:
        _reduce_kernel[(n, h)](out, part_acc, part_ml, h, out.stride(0), out.stride(1),
                               HEAD_DIM=d, BLOCK_D=block_d, NUM_SEGMENTS=num_segments)
    return out


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        query_start_loc: torch.Tensor, kv_lens: torch.Tensor, block_tables: torch.Tensor,
                        scale: float, windows: list[torch.Tensor | None] | None = None) -> torch.Tensor:
    """The same contract in plain torch, one sequence at a time (slow, obviously right): fp32 math."""
    out = torch.empty_like(q)
    h, kvh = q.shape[1], k_cache.shape[2]
    bs = k_cache.shape[1]
    qsl, lens = query_start_loc.tolist(), kv_lens.tolist()
    for b, kv_len in enumerate(lens):
        s, e = qsl[b], qsl[b + 1]
        pos = torch.arange(kv_len, device=q.device)
        blocks = block_tables[b, pos // bs]
        keys = k_cache[blocks, pos % bs].float().repeat_interleave(h // kvh, dim=1)  # [kv, h, d]
        vals = v_cache[blocks, pos % bs].float().repeat_interleave(h // kvh, dim=1)
        qb = q[s:e].float()
        i = torch.arange(e - s, device=q.device).unsqueeze(1)
        vis = pos.unsqueeze(0) <= kv_len - (e - s) + i  # [q, kv]
        w = None if windows is None else windows[b]
        if w is not None:
            vis = torch.ones_like(vis)
            vis[:, kv_len - w.shape[1]:] = w
        logits = torch.einsum("qhd,khd->hqk", qb, keys) * scale
        probs = logits.masked_fill(~vis, float("-inf")).softmax(-1)
        out[s:e] = torch.einsum("hqk,khd->qhd", probs, vals).to(q.dtype)
    return out
