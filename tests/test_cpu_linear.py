"""kernels/cpu_linear.py: the column form of few-row products equals F.linear (to fp32 rounding),
covers every row exactly once, and is used only where it was measured to pay."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_linear
from kernels.cpu_linear import PLAN, linear, pieces, uses_columns


@pytest.mark.parametrize("rows", range(1, 13))
@pytest.mark.parametrize("bias", [False, True])
def test_equals_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 96, generator=g), torch.randn(130, 96, generator=g)
    b = torch.randn(130, generator=g) if bias else None
    y = linear(x, w, b)
    assert y.shape == (rows, 130) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_a_row_gets_its_own_result_not_its_neighbours():
    """Rows that differ must give different outputs in the right order (padding drops only copies)."""
    w = torch.eye(8)
    for rows in range(1, 9):
        x = torch.arange(rows * 8, dtype=torch.float32).reshape(rows, 8)
        assert torch.equal(linear(x, w), x)


@pytest.mark.parametrize("rows", sorted(PLAN))
def test_pieces_cover_the_rows_once(rows):
    got = pieces(rows)
    assert [p[0] for p in got] == [sum(p[1] for p in got[:i]) for i in range(len(got))]
    assert sum(p[1] for p in got) == rows and all(0 < n <= width for _, n, width in got)
    assert tuple(width for *_, width in got) == PLAN[rows]


def test_only_small_fp32_cpu_products_take_the_column_form(monkeypatch):
    w = torch.randn(16, 8)
    assert uses_columns(torch.randn(4, 8), w)
    assert not uses_columns(torch.randn(cpu_linear.MAX_ROWS + 1, 8), w)  # prefill, big batches
    assert not uses_columns(torch.randn(4, 8, dtype=torch.bfloat16), w.bfloat16())
    assert not uses_columns(torch.randn(2, 4, 8), w)
    assert not uses_columns(torch.randn(0, 8), w)
    monkeypatch.setattr(cpu_linear, "ENABLED", False)  # SPECRAY_CPU_LINEAR=torch at import
    assert not uses_columns(torch.randn(4, 8), w)


def test_benchmark_command_prints_both_tables(capsys):
    from benchmarks.cpu_linear import main, weight_shapes

    assert weight_shapes(2, 8, 16, 8, 4, 32) == [(16, 8), (8, 8), (32, 8), (8, 16)] * 2 + [(32, 8)]
    main(["--layers", "1", "--hidden", "8", "--intermediate", "16", "--q-size", "8", "--kv-size", "4",
          "--vocab", "32", "--reps", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert "| W @ x^T, 4 columns |" in out and f"| {cpu_linear.MAX_ROWS} |" in out
