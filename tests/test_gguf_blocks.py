"""kernels/gguf_blocks.py and the native product over quantized tiles: GGUF's Q4_1 / Q8_0 rows parsed
as the gguf package reads them, and a product over the blocks with exactly the bits of the fp32
product over their dequantization (what keeps greedy output the model's own), at every row count."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import cpu_native as cn
from kernels import gguf_blocks as gb

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")


def random_blocks(kind: str, n: int, k: int, seed: int) -> gb.QBlocks:
    """Scales as a quantizer makes them (small, some zero or subnormal), quants over their full range."""
    g = torch.Generator().manual_seed(seed)
    kb = k // gb.BLOCK_K
    d = (torch.rand(n, kb, generator=g) * 0.02).half()
    d[0, 0], d[-1, -1] = 0.0, 3e-6  # an all-equal block; a subnormal fp16 scale
    if kind == "Q8_0":
        return gb.QBlocks(kind, d, None, torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8))
    m = (-torch.rand(n, kb, generator=g) * 0.15).half()
    return gb.QBlocks(kind, d, m, torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8))


def gguf_rows(b: gb.QBlocks) -> np.ndarray:
    """The blocks as a GGUF file stores them (written here from the format, not by gguf_blocks)."""
    n, k = b.shape
    kb = k // gb.BLOCK_K
    d = b.d.numpy().view(np.uint8).reshape(n, kb, 2)
    if b.kind == "Q8_0":
        qs = b.q.numpy().view(np.uint8).reshape(n, kb, gb.BLOCK_K)
        return np.concatenate([d, qs], axis=-1).reshape(n, -1)
    m = b.m.numpy().view(np.uint8).reshape(n, kb, 2)
    q = b.q.numpy().reshape(n, kb, gb.BLOCK_K)
    qs = q[..., :16] | (q[..., 16:] << 4)  # byte j: weight j low, weight j + 16 high
    return np.concatenate([d, m, qs], axis=-1).reshape(n, -1)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_parse_and_dequantize_match_the_gguf_package_bit_for_bit(kind):
    from gguf import GGMLQuantizationType, quants

    b = random_blocks(kind, 7, 96, seed=1)
    raw = gguf_rows(b)
    parsed = gb.parse(kind, torch.from_numpy(raw), 96)
    assert torch.equal(parsed.d, b.d) and torch.equal(parsed.q, b.q)
    assert (parsed.m is None) if kind == "Q8_0" else torch.equal(parsed.m, b.m)
    ref = torch.from_numpy(quants.dequantize(raw, getattr(GGMLQuantizationType, kind)).astype(np.float32))
    assert torch.equal(gb.dequantize(parsed), ref)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("n, k", [(37, 64), (16, 32), (100, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_a_product_over_blocks_has_the_fp32_products_bits_at_every_row_count(kind, n, k, bias, fp32_activations):
    b = random_blocks(kind, n, k, seed=n + k)
    g = torch.Generator().manual_seed(3)
    bb = torch.randn(n, generator=g) if bias else None
    tiles, dense = gb.pack(b), cn.pack_linear(gb.dequantize(b))
    assert tiles.dtype is torch.uint8 and tiles.shape == (-(-n // 16), k // 32, gb.TILE_BYTES[kind])
    assert tiles.numel() == gb.packed_bytes(n, k, kind)
    x = torch.randn(25, k, generator=g)
    for m in (1, 2, 11, 12, 13, 25):  # register blocks of 11 rows and their tails
        assert torch.equal(cn.linear(x[:m], tiles, n, bb), cn.linear(x[:m], dense, n, bb)), m
    torch.testing.assert_close(cn.linear(x, tiles, n, bb), torch.nn.functional.linear(x, gb.dequantize(b), bb),
                               rtol=1e-4, atol=1e-4)


def test_quantize_q8_0_rounds_each_block_to_its_own_scale():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 64, generator=g)
    w[1, :32] = 0.0
    b = gb.quantize_q8_0(w)
    assert b.kind == "Q8_0" and b.d[1, 0] == 0 and b.q.abs().max() <= 127
    err = (gb.dequantize(b) - w).abs().reshape(5, 2, 32)
    assert (err <= b.d.float().unsqueeze(-1) * 0.5 + 1e-3 * w.abs().max()).all()
    with pytest.raises(ValueError, match="multiple of 32.*got 40"):
        gb.quantize_q8_0(torch.randn(3, 40))


def test_bad_blocks_are_clear_errors_naming_the_value():
    with pytest.raises(ValueError, match="'Q5_K'"):
        gb.parse("Q5_K", torch.zeros(1, 22, dtype=torch.uint8), 32)
    with pytest.raises(ValueError, match="60 weights"):
        gb.parse("Q4_1", torch.zeros(1, 40, dtype=torch.uint8), 60)
    with pytest.raises(ValueError, match=r"40 bytes, got \(1, 38\)"):
        gb.parse("Q4_1", torch.zeros(1, 38, dtype=torch.uint8), 64)
    with pytest.raises(RuntimeError, match="Q4_1.*got \\[2, 1, 300\\]"):
        cn.linear(torch.randn(1, 32), torch.zeros(2, 1, 300, dtype=torch.uint8), 20)
    with pytest.raises(RuntimeError, match="does not fit"):
        cn.linear(torch.randn(1, 64), gb.pack(random_blocks("Q4_1", 20, 32, 0)), 20)
