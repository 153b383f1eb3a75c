"""Fused small ops of the Llama forward in Triton, each beside its pure-torch reference (``*_ref``):

- ``rmsnorm_residual``: (norm(x + residual) * weight, x + residual), the sum written into x's
  storage, as ``actors.model.layers.RMSNorm.forward`` with a residual (one launch instead of an
  add and a norm);
- ``silu_and_mul``: [N, 2I] -> silu(gate) * up [N, I] (one launch instead of a silu and a mul,
  and no [N, I] temporary);
- ``rope_write_kv``: rotate q and k (neox rotate-half RoPE) from the fused qkv projection and store
  k, v at their KV-cache slots (one launch instead of a rotary, a split and two index copies).

Rounding follows the references: sums and products in fp32, rounded to the input dtype where the
torch ops round (bf16 inputs give the same bits up to the last ulp of rsqrt/exp).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.triton_attention import check_launchable


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# ---------------------------------------------------------------- RMSNorm with the residual add

@triton.jit
def _rmsnorm_residual_kernel(x_ptr, res_ptr, w_ptr, out_ptr, hidden, eps, stride_x, stride_r, stride_o,
                             BLOCK: tl.constexpr, IS_FP32: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    ok = c < hidden
    x = tl.load(x_ptr + row * stride_x + c, mask=ok, other=0.0)
    r = tl.load(res_ptr + row * stride_r + c, mask=ok, other=0.0)
    s = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the sum, rounded as x.add_(residual) rounds
    tl.store(x_ptr + row * stride_x + c, s, mask=ok)
    sf = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, 0) / hidden + eps)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    if IS_FP32:
        y = sf * rstd * w
    else:  # the reference normalises in fp32, rounds, then multiplies by the weight in the model dtype
        y = (sf * rstd).to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * stride_o + c, y.to(out_ptr.dtype.element_ty), mask=ok)


def rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """x, residual [N, H]; weight [H] -> (normed [N, H], x holding x + residual)."""
    n, hidden = x.shape
    if x.stride(-1) != 1 or residual.stride(-1) != 1 or residual.shape != x.shape:
        raise ValueError(f"rmsnorm_residual: x {tuple(x.shape)} and residual {tuple(residual.shape)} need equal "
                         "shapes and contiguous rows")
    check_launchable(x)
    out = torch.empty_like(x)
    if n:
        _rmsnorm_residual_kernel[(n,)](x, residual, weight, out, hidden, eps, x.stride(0), residual.stride(0),
                                       out.stride(0), BLOCK=_pow2(hidden), IS_FP32=x.dtype == torch.float32)
    return out, x


def rmsnorm_residual_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """RMSNorm.forward(x, residual) of actors.model.layers, written out."""
    x = x.add_(residual)
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps), x
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype) * weight, x


# ---------------------------------------------------------------- SiLU and multiply

@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < inter
    gate = tl.load(x_ptr + row * stride_x + c, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + c, mask=ok, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)  # F.silu rounds to the input dtype
    tl.store(out_ptr + row * stride_o + c, (act.to(tl.float32) * up.to(tl.float32)).to(out_ptr.dtype.element_ty),
             mask=ok)


def silu_and_mul(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """x [N, 2I] (gate | up) -> silu(gate) * up [N, I]."""
    n, two_i = x.shape
    if two_i % 2 or x.stride(-1) != 1:
        raise ValueError(f"silu_and_mul: x {tuple(x.shape)} needs an even last dim, contiguous")
    check_launchable(x)
    inter = two_i // 2
    out = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    block = min(block, _pow2(inter))
    if n:
        _silu_and_mul_kernel[(n, triton.cdiv(inter, block))](x, out, inter, x.stride(0), out.stride(0), BLOCK=block)
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


# ---------------------------------------------------------------- RoPE fused with the KV-cache write

@triton.jit
def _rope_write_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                          stride_qkv, stride_cs, stride_qo_n, stride_qo_h, stride_kslot, stride_kh,
                          NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                          BLOCK_HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr):
    """One token: q heads rotated into q_out, k heads rotated and v heads copied into slot_mapping[tok]."""
    tok = tl.program_id(0)
    hd = tl.arange(0, BLOCK_HEADS)
    c = tl.arange(0, BLOCK_HALF)
    c_ok = c < HALF
    cos = tl.load(cos_ptr + tok * stride_cs + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + tok * stride_cs + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    row = qkv_ptr + tok * stride_qkv
    # q and k heads are contiguous in qkv: heads [0, h + kvh) rotated alike
    rot_ok = (hd < NUM_HEADS + NUM_KV_HEADS)[:, None] & c_ok[None, :]
    x1 = tl.load(row + hd[:, None] * (2 * HALF) + c[None, :], mask=rot_ok, other=0.0)
    x2 = tl.load(row + hd[:, None] * (2 * HALF) + HALF + c[None, :], mask=rot_ok, other=0.0)
    dt = x1.dtype
    # the reference rounds each product and the difference/sum to the model dtype
    a1 = (x1.to(tl.float32) * cos).to(dt).to(tl.float32)
    b1 = (x2.to(tl.float32) * sin).to(dt).to(tl.float32)
    a2 = (x2.to(tl.float32) * cos).to(dt).to(tl.float32)
    b2 = (x1.to(tl.float32) * sin).to(dt).to(tl.float32)
    y1 = (a1 - b1).to(dt)
    y2 = (a2 + b2).to(dt)
    is_q = (hd < NUM_HEADS)[:, None] & c_ok[None, :]
    qo = q_out_ptr + tok * stride_qo_n + hd[:, None] * stride_qo_h + c[None, :]
    tl.store(qo, y1, mask=is_q)
    tl.store(qo + HALF, y2, mask=is_q)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # a padded row (CUDA graph buckets) has slot -1 and writes no K/V
    write = ((hd * 0 + slot) >= 0)[:, None]  # [BLOCK_HEADS, 1] (a scalar mask is refused when interpreted)
    is_k = (hd >= NUM_HEADS)[:, None] & rot_ok & write
    ko = k_cache_ptr + slot * stride_kslot + (hd - NUM_HEADS)[:, None] * stride_kh + c[None, :]
    tl.store(ko, y1, mask=is_k)
    tl.store(ko + HALF, y2, mask=is_k)
    v_ok = (hd < NUM_KV_HEADS)[:, None] & c_ok[None, :] & write
    vin = row + (NUM_HEADS + NUM_KV_HEADS) * 2 * HALF + hd[:, None] * (2 * HALF) + c[None, :]
    vo = v_cache_ptr + slot * stride_kslot + hd[:, None] * stride_kh + c[None, :]
    tl.store(vo, tl.load(vin, mask=v_ok, other=0.0), mask=v_ok)
    tl.store(vo + HALF, tl.load(vin + HALF, mask=v_ok, other=0.0), mask=v_ok)


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """qkv [N, (h + 2 kvh) d] (rows contiguous); cos/sin [N, 1 or absent, d/2]; slot_mapping [N];
    caches [blocks, bs, kvh, d] (contiguous) -> rotated q [N, h, d]; rotated k and v written at the slots
    (a slot < 0 marks a padded row: nothing written)."""
    n = qkv.shape[0]
    kvh, d = k_cache.shape[-2], k_cache.shape[-1]
    if qkv.shape[1] != (num_heads + 2 * num_kv_heads) * d or kvh != num_kv_heads or qkv.stride(-1) != 1 \
            or not k_cache.is_contiguous() or k_cache.stride() != v_cache.stride():
        raise ValueError(f"rope_write_kv: qkv {tuple(qkv.shape)}, caches {tuple(k_cache.shape)} do not match "
                         f"h={num_heads}, kvh={num_kv_heads} with contiguous caches")
    check_launchable(qkv)
    # one row broadcasts to every token (the CPU forward's doubled lone token: stride 0)
    cos, sin = cos.reshape(-1, d // 2).expand(n, -1), sin.reshape(-1, d // 2).expand(n, -1)
    slot_mapping = slot_mapping.contiguous()  # the kernel indexes it densely (a doubled token's is a broadcast view)
    q = torch.empty(n, num_heads, d, dtype=qkv.dtype, device=qkv.device)
    if n:
        _rope_write_kv_kernel[(n,)](qkv, cos, sin, slot_mapping, q, k_cache, v_cache, qkv.stride(0), cos.stride(0),
                                    q.stride(0), q.stride(1), k_cache.stride(1), k_cache.stride(2),
                                    NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=d // 2,
                                    BLOCK_HALF=_pow2(d // 2), BLOCK_HEADS=_pow2(num_heads + num_kv_heads))
    return q


def rope_write_kv_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """The torch ops LlamaAttention.forward runs: rotate q and k together (rotate-half), write k, v."""
    n, d = qkv.shape[0], k_cache.shape[-1]
    h, kvh = num_heads, num_kv_heads
    x = qkv[:, : (h + kvh) * d].view(n, h + kvh, d)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.reshape(n, 1, d // 2), sin.reshape(n, 1, d // 2)
    qk = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    q, k = qk.split((h, kvh), dim=1)
    v = qkv[:, (h + kvh) * d:].view(n, kvh, d)
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, v)
    return q
