"""kernels/cpu_linear.py: oneDNN over reordered weights equals F.linear, gives every row the same
result whatever rows share its product (greedy verification relies on it), follows in-place weight
changes, and stays out of autograd, other dtypes and SPECRAY_CPU_LINEAR=torch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_linear
from kernels.cpu_linear import linear, uses_onednn

needs_onednn = pytest.mark.skipif(not cpu_linear.ENABLED, reason="oneDNN not available in this torch build")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 65])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 96, generator=g), torch.randn(130, 96, generator=g)
    b = torch.randn(130, generator=g) if bias else None
    y = linear(x, w, b)
    assert uses_onednn(x, w) and y.shape == (rows, 130) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@needs_onednn
def test_bf16_and_leading_dims_and_strided_inputs():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 32, generator=g).bfloat16()
    x = torch.randn(3, 5, 64, generator=g).bfloat16()[..., ::2]  # [3, 5, 32], not contiguous
    y = linear(x, w)
    assert y.shape == (3, 5, 40) and y.dtype is torch.bfloat16
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=5e-2)


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(96, 64), (64, 1536), (130, 576)])
def test_a_row_gets_the_same_bits_whatever_shares_its_product(dtype, shape):
    """Plain decoding multiplies one row, verification the same row among many: greedy output is
    the target's own only if both give the same bits (oneDNN's 1-row kernel alone sums in another
    order, which linear avoids)."""
    g = torch.Generator().manual_seed(shape[1])
    w = (torch.randn(*shape, generator=g) * 0.05).to(dtype)
    x = torch.randn(70, shape[1], generator=g).to(dtype)
    every = linear(x, w)
    for rows in (1, 2, 3, 5, 6, 8, 13, 33, 70):
        for j in {0, rows // 2, rows - 1}:
            assert torch.equal(linear(x[:rows], w)[j], every[j]), (rows, j)
    assert all(torch.equal(linear(x[j:j + 1], w)[0], every[j]) for j in range(70))


@needs_onednn
def test_an_in_place_weight_change_is_seen():
    w, x = torch.randn(16, 8), torch.randn(2, 8)
    first = linear(x, w)
    w.mul_(2)  # e.g. a weight loader copying into the parameter after a first forward
    torch.testing.assert_close(linear(x, w), 2 * first)
    with torch.inference_mode():  # inference tensors keep no version: the copy is made once
        wi = torch.randn(16, 8)
        torch.testing.assert_close(linear(x, wi), F.linear(x, wi))


def test_autograd_other_dtypes_devices_and_the_switch_keep_f_linear(monkeypatch):
    w = torch.randn(16, 8)
    assert not uses_onednn(torch.randn(4, 8, requires_grad=True), w)  # training the EAGLE head
    wg = torch.randn(16, 8, requires_grad=True)
    assert not uses_onednn(torch.randn(4, 8), wg)
    with torch.no_grad():
        assert uses_onednn(torch.randn(4, 8), wg) == cpu_linear.ENABLED
    assert not uses_onednn(torch.randn(4, 8, dtype=torch.float16), w.half())
    assert not uses_onednn(torch.randn(4, 8).bfloat16(), w)  # mixed dtypes
    assert not uses_onednn(torch.randn(0, 8), w)
    monkeypatch.setattr(cpu_linear, "ENABLED", False)  # SPECRAY_CPU_LINEAR=torch at import
    assert not uses_onednn(torch.randn(4, 8), w)
    x = torch.randn(3, 8)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_gradients_flow_through_the_fallback():
    w = torch.randn(6, 4, requires_grad=True)
    linear(torch.randn(3, 4), w).sum().backward()
    assert w.grad is not None and w.grad.shape == (6, 4)


def test_benchmark_command_prints_the_table(capsys):
    from benchmarks.cpu_linear import main, weight_shapes

    assert weight_shapes(2, 8, 16, 8, 4, 32) == [(16, 8), (8, 8), (32, 8), (8, 16)] * 2 + [(32, 8)]
    main(["--layers", "1", "--hidden", "8", "--intermediate", "16", "--q-size", "8", "--kv-size", "4",
          "--vocab", "32", "--reps", "1", "--threads", "1", "--rows", "1,3"])
    out = capsys.readouterr().out
    assert "| rows | F.linear ms |" in out and "\n| 1 | " in out and "\n| 3 | " in out
    if cpu_linear.native():
        main(["--layers", "1", "--hidden", "32", "--intermediate", "64", "--q-size", "32", "--kv-size", "32",
              "--vocab", "48", "--reps", "1", "--threads", "1", "--rows", "2", "--quantized"])
        out = capsys.readouterr().out
        assert "GGUF blocks (Q4_1, LM head Q8_0)" in out and "\n| 2 | " in out


def test_row_counts_are_padded_to_few_buckets():
    pads = [cpu_linear.padded_rows(m) for m in range(1, 1025)]
    assert pads[:16] == list(range(1, 17))  # small products exact
    assert all(m <= p <= m * 1.125 for m, p in enumerate(pads, start=1))
    assert all(a <= b for a, b in zip(pads, pads[1:]))
    assert cpu_linear.padded_rows(17) == 18 and cpu_linear.padded_rows(130) == 144
    assert len(set(pads)) <= 16 + 8 * 6  # 1..16, then 8 per doubling up to 1024


def _live_heap_bytes() -> int | None:
    """Bytes malloc holds for the program (in arenas and mmapped), or None without glibc's mallinfo2."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    fn = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = MallInfo2
    info = fn()
    return info.uordblks + info.hblkhd


@needs_onednn
def test_new_row_counts_in_seen_buckets_cost_no_memory():
    """oneDNN caches a primitive per product shape (~150 KB each): once every bucket has been seen,
    row counts never seen before add nothing (exact shapes grew the caches, then churned them)."""
    if _live_heap_bytes() is None:
        pytest.skip("needs glibc's mallinfo2")
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(192, 128, generator=g), torch.randn(128, 384, generator=g)]
    with torch.inference_mode():
        def run(row_counts):
            for m in row_counts:
                for w in ws:
                    linear(torch.randn(m, w.shape[1], generator=g), w)

        run(range(17, 260, 2))  # odd counts: every bucket from 18 to 288 (17 -> 18, 31 -> 32, 257 -> 288)
        before = _live_heap_bytes()
        run(range(18, 260, 2))  # 121 x 2 shapes never seen exactly
        grown = _live_heap_bytes() - before
    assert grown < 4 * 2**20, f"{grown / 2**20:.1f} MB more after products of new row counts in seen buckets"
