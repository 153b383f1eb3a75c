"""y = x W^T for the few-row products of decoding and verification on CPU.

At small batch a decode step multiplies 1 row (plain decoding, batch 1) or a few rows (more
sequences, or the root plus a few draft tokens) by every weight matrix. ``F.linear`` hands such
products to a BLAS path that, on the project's 2-core box (MKL, fp32, SmolLM2-135M's 538 MB of
weights), streams the weights at ~15 GB/s for 1 row and re-reads them for 2-12 rows: a forward of
2 rows cost 1.5x one of 1 row. The same product written as ``W @ x^T`` (x row-major, so x^T is a
transposed view) with 2 or 4 columns runs at the machine's memory bandwidth, ~33 GB/s. ``PLAN``
gives, per row count, the column counts of the products that cover the rows; a product wider than
the rows it holds repeats its last row and drops the copies. It is what ``python -m benchmarks.cpu_linear`` measured fastest here (ms per pass
over all 30 layers and the LM head, 2 threads; F.linear -> plan): 1 row 34.6 -> 16.4, 2 rows
58.2 -> 16.2, 4 rows 52.3 -> 18.6, 8 rows 48.3 -> 35.3, 9 rows 62.8 -> 36.0, 12 rows 52.4 -> 43.7;
from 13 rows on F.linear is as fast.

More rows (prefill, large batches), other devices and other dtypes keep ``F.linear``, and
``SPECRAY_CPU_LINEAR=torch`` turns the rewrite off.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

# rows -> widths of the products that cover them (the last one padded by repeating a row)
PLAN: dict[int, tuple[int, ...]] = {1: (2,), 2: (2,), 3: (4,), 4: (4,), 5: (5,), 6: (6,), 7: (4, 4), 8: (4, 4),
                                    9: (4, 5), 10: (4, 6), 11: (4, 4, 4), 12: (4, 4, 4)}
MAX_ROWS = max(PLAN)  # above this F.linear is as fast or faster


ENABLED = os.environ.get("SPECRAY_CPU_LINEAR", "columns") != "torch"  # read once: checked per product


def pieces(rows: int) -> list[tuple[int, int, int]]:
    """(start, rows, width) of the products covering ``rows`` rows: ``width - rows`` padding rows."""
    out, start = [], 0
    for width in PLAN[rows]:
        n = min(width, rows - start)
        out.append((start, n, width))
        start += n
    return out


def uses_columns(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear`` takes the column form for this input."""
    return (ENABLED and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype is torch.float32
            and weight.dtype is torch.float32 and x.device.type == "cpu")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [M, in], weight [out, in], bias [out] -> [M, out]."""
    if not uses_columns(x, weight):
        return F.linear(x, weight, bias)
    parts = []
    for start, n, width in pieces(x.shape[0]):
        piece = x[start:start + n]  # row-major [n, in]: its transpose is the fast operand
        if width > n:
            piece = torch.cat([piece, piece[-1:].expand(width - n, -1)])
        parts.append(torch.mm(weight, piece.t())[:, :n])  # [out, n]
    y = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).t().contiguous()  # [M, out]
    return y if bias is None else y.add_(bias)
