"""kernels/csrc/linear_fixed.cpp: products over a GGUF model's Q4_1 / Q8_0 tiles with the activations in
fixed point, 16 bits (SPECRAY_CPU_ACTIVATIONS=int16, the default) or 8 (int8): the documented
arithmetic (checked against a float64 evaluation of it, to within the kernel's own fp32 roundings), a
row's bits independent of the rows beside it and of the threads, identity rows giving the dequantized
weights exactly (what the binding checks), closeness to the fp32 product, edge rows, and the switch."""
from __future__ import annotations

import pytest
import torch

from kernels import cpu_native as cn
from kernels import gguf_blocks as gb
from tests.test_gguf_blocks import random_blocks

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")

U = 2.0 ** -24  # fp32 unit roundoff
BITS = {"int16": 16, "int8": 8}


@pytest.fixture(params=list(BITS))
def fixed_mode(request):
    """Each fixed-point format in turn (its name), set for the test."""
    with cn.activations(request.param):
        yield request.param


def fixed_reference(x: torch.Tensor, b: gb.QBlocks, bias: torch.Tensor | None, bits: int):
    """x [M, K] fp32 -> (y [M, N] float64, bound [M, N]): linear_fixed.cpp's arithmetic evaluated in
    float64 (exact but for the kernel's fp32 roundings, which ``bound`` covers: per block two roundings
    of the running sum and Q8_0's int32 -> fp32 conversion, then the bias add)."""
    m_rows, k = x.shape
    kb = k // gb.BLOCK_K
    xb = x.double().view(m_rows, kb, gb.BLOCK_K)
    amax = xb.abs().amax(-1)  # [M, KB]
    _, e = torch.frexp(amax)  # amax in [2^(e-1), 2^e)
    top = 2 ** (bits - 1)  # the block's largest |x| / s in [top / 2, top), saturated to the type's range
    s = torch.where(amax < 2.0 ** -112, torch.zeros_like(amax), torch.ldexp(torch.ones_like(amax), e - bits + 1))
    p = torch.where(s[..., None] > 0, torch.round(xb / s.clamp_min(1e-300)[..., None]), 0.0).clamp(-top, top - 1)
    q = b.q.double().view(-1, kb, gb.BLOCK_K)  # [N, KB, 32]
    sums = torch.einsum("mbi,nbi->mnb", p, q)  # exact integers
    scaled = s[:, None, :] * b.d.double()[None] * sums  # [M, N, KB]
    mins = (s * p.sum(-1))[:, None, :] * b.m.double()[None] if b.m is not None else torch.zeros_like(scaled)
    y = (scaled + mins).sum(-1)
    running = (scaled.abs() + mins.abs()).cumsum(-1)  # what the running sum's roundings are relative to
    bound = 3 * U * running.sum(-1) + U * y.abs() + 1e-30
    if bias is not None:
        y = y + bias.double()
        bound = bound + U * y.abs()
    return y, bound


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 11, 30])  # one register block, a block and its remainder, the scratch path
def test_the_product_is_the_documented_fixed_point_arithmetic(kind, rows, fixed_mode):
    n, k = 37, 96  # a partial last tile; three blocks
    b = random_blocks(kind, n, k, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-3, 2, k)  # blocks of very different scales
    bias = torch.randn(n, generator=g)
    for bb in (None, bias):
        y = cn.linear(x, gb.pack(b), n, bb)
        ref, bound = fixed_reference(x, b, bb, BITS[fixed_mode])
        err = (y.double() - ref).abs()
        assert bool((err <= 2 * bound).all()), f"{kind}: worst error {float((err / bound).max()):.1f} bounds"


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_a_row_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count(kind, fixed_mode):
    n, k = 50, 64
    b = random_blocks(kind, n, k, seed=3)
    tiles = gb.pack(b)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(3))
    together = cn.linear(x, tiles, n)
    alone = torch.cat([cn.linear(x[i:i + 1], tiles, n) for i in range(len(x))])
    assert torch.equal(together, alone)
    for m in (5, 11, 12, 23, 24):
        assert torch.equal(cn.linear(x[:m], tiles, n), together[:m]), m
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cn.linear(x, tiles, n), together)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_identity_rows_give_the_dequantized_weights_bit_for_bit(kind, fixed_mode):
    """gguf_weights binds a matrix to blocks by this check; the power-of-two scales keep it exact."""
    n, k = 33, 64
    b = random_blocks(kind, n, k, seed=5)
    eye = torch.eye(k)
    assert torch.equal(cn.linear(eye, gb.pack(b), n), gb.dequantize(b).T)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_close_to_the_fp32_product(kind, fixed_mode):
    n, k = 64, 576
    b = random_blocks(kind, n, k, seed=6)
    w = gb.dequantize(b)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(6)) * 4
    exact = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T  # sum |x w|
    fixed = cn.linear(x, gb.pack(b), n).double()
    worst = float(((fixed - exact).abs() / scale).max())
    assert worst < 2.0 ** (2 - BITS[fixed_mode])  # x rounded to 15-16 or 7-8 bits per block
    assert worst > 2.0 ** (-4 - BITS[fixed_mode])  # ... and not finer: it is neither the fp32 product nor the other


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_zero_tiny_and_non_finite_rows(kind, fixed_mode):
    n, k = 20, 64
    b = random_blocks(kind, n, k, seed=7)
    tiles, bias = gb.pack(b), torch.randn(n, generator=torch.Generator().manual_seed(7))
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(8))
    x[0] = 0.0
    x[1] = 1e-36  # below 2^-112: counts as zero
    x[2, 40] = float("nan")
    x[3, 3] = float("inf")
    y = cn.linear(x, tiles, n, bias)
    assert torch.equal(y[0], bias) and torch.equal(y[1], bias)
    assert bool(y[2].isnan().all()) and bool(y[3].isnan().all())
    assert torch.equal(y[4], cn.linear(x[4:], tiles, n, bias)[0])  # the other rows untouched


def test_the_switch_and_its_bad_values_are_named(monkeypatch):
    b = random_blocks("Q8_0", 20, 64, seed=9)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
    with cn.activations("float32"):  # float32: the fp32 product over the dequantized weights, bit for bit
        assert torch.equal(cn.linear(x, gb.pack(b), 20), cn.linear(x, cn.pack_linear(gb.dequantize(b)), 20))
        assert cn.set_activations("int16") == "float32"
        sixteen = cn.linear(x, gb.pack(b), 20)
        assert not torch.equal(sixteen, cn.linear(x, cn.pack_linear(gb.dequantize(b)), 20))
        assert cn.set_activations("int8") == "int16"
        assert not torch.equal(cn.linear(x, gb.pack(b), 20), sixteen)
    with pytest.raises(ValueError, match="'int4'"):
        cn.set_activations("int4")
    with pytest.raises(RuntimeError, match="bits must be 8 or 16 .* got 4"):
        torch.ops.specray_cpu.set_product_activations(4)
    monkeypatch.setenv("SPECRAY_CPU_ACTIVATIONS", "bf16")
    with pytest.raises(ValueError, match="SPECRAY_CPU_ACTIVATIONS='bf16'"):
        cn.activations_mode()
    monkeypatch.delenv("SPECRAY_CPU_ACTIVATIONS")
    assert cn.activations_mode() == "int16"
