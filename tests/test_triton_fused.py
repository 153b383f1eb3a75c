"""Fused Triton small ops against their torch references and against the model's own modules:
RMSNorm with the residual add, SiLU-and-multiply, RoPE fused with the KV-cache write. On CPU they
run under ``TRITON_INTERPRET=1`` (set below, before triton is imported); on CUDA compiled."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from actors.model.layers import RMSNorm, RotaryEmbedding, apply_rotary  # noqa: E402
from kernels import triton_fused as tf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
# fp32: a few ulps (rsqrt / exp differ). bf16: one rounding of the output; under the interpreter,
# which truncates fp32 -> bf16 instead of rounding to nearest, one ulp more (2^-7 relative).
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2)}


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hidden", [(1, 64), (7, 48), (3, 100)])
def test_rmsnorm_residual_matches_module(dtype, n, hidden):
    """Same results as RMSNorm.forward(x, residual): the normed rows, and x's storage holding x + residual."""
    x, res = _randn(n, hidden, dtype=dtype), _randn(n, hidden, dtype=dtype, seed=1)
    norm = RMSNorm(hidden, 1e-6, dtype).to(DEVICE)
    norm.weight.data.copy_(0.5 + torch.rand(hidden, generator=torch.Generator().manual_seed(2)))
    x0 = x.clone()
    want, want_sum = norm(x.clone(), res)
    got, got_sum = tf.rmsnorm_residual(x, res, norm.weight, 1e-6)
    assert got_sum.data_ptr() == x.data_ptr(), "the sum must reuse x's storage, as the module does"
    torch.testing.assert_close(got_sum.float(), want_sum.float(), **TOL[dtype])
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    ref, _ = tf.rmsnorm_residual_ref(x0, res, norm.weight, 1e-6)  # the reference beside the kernel
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])


def test_rmsnorm_residual_uses_the_weight_and_eps():
    x, res = _randn(4, 32), _randn(4, 32, seed=1)
    w = torch.linspace(0.1, 2.0, 32, device=DEVICE)
    got, _ = tf.rmsnorm_residual(x.clone(), res, w, 1e-6)
    plain, _ = tf.rmsnorm_residual(x.clone(), res, torch.ones_like(w), 1e-6)
    torch.testing.assert_close(got, plain * w)
    big_eps, _ = tf.rmsnorm_residual(x.clone(), res, w, 10.0)
    assert (big_eps.abs() < got.abs()).float().mean() > 0.9


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,inter,block", [(1, 128, 1024), (5, 40, 16), (3, 96, 32)])
def test_silu_and_mul(dtype, n, inter, block):
    x = _randn(n, 2 * inter, dtype=dtype) * 3
    got = tf.silu_and_mul(x, block=block)
    assert got.shape == (n, inter) and got.dtype == dtype
    torch.testing.assert_close(got.float(), tf.silu_and_mul_ref(x).float(), **TOL[dtype])
    swapped = torch.cat(x.chunk(2, dim=-1)[::-1], dim=-1)  # gate and up must not be confused
    assert (tf.silu_and_mul(swapped, block=block).float() - got.float()).abs().max() > 0.1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h,kvh,d", [(4, 2, 16), (6, 2, 16), (4, 1, 32), (2, 2, 24)])
def test_rope_write_kv(dtype, h, kvh, d):
    """Rotated q, and rotated k / plain v at their slots, as LlamaAttention's rotary + write_kv; other
    slots untouched."""
    n, blocks, bs = 6, 5, 4
    qkv = _randn(n, (h + 2 * kvh) * d, dtype=dtype)
    rotary = RotaryEmbedding(d, 256, 10000.0, None, dtype).to(DEVICE)
    positions = torch.tensor([0, 1, 7, 30, 31, 200], device=DEVICE)
    cos, sin = rotary.cos_sin(positions)
    slots = torch.tensor([3, 0, 9, 15, 7, 19], device=DEVICE)
    caches = [_randn(blocks, bs, kvh, d, dtype=dtype, seed=s) for s in (5, 6)]
    k_ref, v_ref = (c.clone() for c in caches)
    q = tf.rope_write_kv(qkv, cos, sin, slots, caches[0], caches[1], h, kvh)
    q_want = tf.rope_write_kv_ref(qkv, cos, sin, slots, k_ref, v_ref, h, kvh)
    torch.testing.assert_close(q.float(), q_want.float(), **TOL[dtype])
    torch.testing.assert_close(caches[0].float(), k_ref.float(), **TOL[dtype])
    assert torch.equal(caches[1], v_ref)  # v is copied, not computed
    # the reference is the model's own rotary
    torch.testing.assert_close(q_want, apply_rotary(qkv[:, :(h + kvh) * d].view(n, h + kvh, d), cos, sin)[:, :h])
    untouched = torch.ones(blocks * bs, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    before = _randn(blocks, bs, kvh, d, dtype=dtype, seed=5).view(-1, kvh, d)
    assert torch.equal(caches[0].view(-1, kvh, d)[untouched], before[untouched])


def test_rope_write_kv_rotates():
    """Position 0 leaves q as it is; another position changes it (cos/sin are really applied)."""
    h, kvh, d = 2, 1, 16
    qkv = _randn(2, (h + 2 * kvh) * d)
    rotary = RotaryEmbedding(d, 64, 10000.0, None, torch.float32).to(DEVICE)
    cos, sin = rotary.cos_sin(torch.tensor([0, 5], device=DEVICE))
    k, v = torch.zeros(2, 4, kvh, d, device=DEVICE), torch.zeros(2, 4, kvh, d, device=DEVICE)
    q = tf.rope_write_kv(qkv, cos, sin, torch.tensor([0, 1], device=DEVICE), k, v, h, kvh)
    torch.testing.assert_close(q[0], qkv[0, : h * d].view(h, d))
    assert (q[1] - qkv[1, : h * d].view(h, d)).abs().max() > 1e-2
