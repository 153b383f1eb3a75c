"""y = x W^T on CPU through oneDNN with the weight reordered once into its blocked layout.

``F.linear`` on CPU hands fp32 products to MKL, which on the project's 2-core AMD box streams
SmolLM2-135M's 538 MB of weights at ~18 GB/s for 1 row, re-reads them for a few rows, and runs
prefill-sized products at half of what the cores do (MKL takes its slower paths on non-Intel
CPUs). oneDNN's inner-product primitive over a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, as PyTorch's own frozen CPU graphs do) reads the
weights once per product at any row count and uses AVX-512 (and AVX512-BF16 for bf16) on any
x86 CPU. ``python -m benchmarks.cpu_linear`` measures both on your machine; here (2 threads, ms
per pass over all 30 layers and the LM head): fp32 1 row 30 -> 9.4, 8 rows 40 -> 12.6, 64 rows
112 -> 44; bf16 weights 1 row 5.8, 16 rows 10.6.

The reordered copy is made on the first product with a weight and kept on the weight tensor; an
in-place change of the weight (its ``_version``) makes a new one (inference tensors have no version:
change them by making new ones). Products that need gradients,
other devices, other dtypes, and ``SPECRAY_CPU_LINEAR=torch`` keep ``F.linear``. Each row's
result does not depend on how many rows share the product (tested), which greedy verification
relies on: a draft is checked against exactly what plain decoding would compute.

Row counts are padded to a bucket (``padded_rows``: exact up to 16, then 8 sizes per doubling, at
most 12.5% more rows, zeros). oneDNN builds and caches a primitive per product shape (ideep's and
oneDNN's caches, 1024 entries each, ~0.5 MB per shape for both): a server's steps have hundreds of
distinct row counts (trees, prefill chunks), so exact shapes filled both caches, then evicted and
rebuilt primitives (~0.7 ms each) and fragmented the heap: RSS grew without a plateau (+400 MB
over 400 requests of the default model in-process, still rising). With buckets the caches stop
growing once every bucket has been seen, and never evict. The padding costs ~5% of the products'
time over 17-450 rows (with every shape cached; nothing up to 16 rows).
"""
from __future__ import annotations

import os

# On CPUs with AMX (Sapphire Rapids and later), oneDNN runs bf16 products of many rows on AMX tiles
# and of few rows on AVX512-BF16: a row's bits then depend on how many rows share its product, and
# a verified draft would not be checked against what plain decoding computes. Capping oneDNN at
# AVX512-BF16 keeps every row count on one kernel family (fp32 products never use AMX). oneDNN reads
# the cap on its first primitive, so it is set before torch is imported here; a value already in the
# environment wins.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ENABLED = (os.environ.get("SPECRAY_CPU_LINEAR", "onednn") != "torch"  # read once: checked per product
           and torch.backends.mkldnn.is_available())
DTYPES = (torch.float32, torch.bfloat16)
# The batch size the reorder is tuned for. 1 picks a layout that is slower from 2 rows on and whose
# rows depend on the row count; 8 to 64 measured alike for 1 to 64 rows.
PACK_HINT = 32


def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear`` takes the reordered-weight path for this input."""
    return (ENABLED and x.device.type == "cpu" and weight.dtype in DTYPES and x.dtype is weight.dtype
            and x.dim() >= 2 and x.shape[-1] == weight.shape[1] and x.numel() > 0
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def packs(weight: torch.Tensor) -> bool:
    """Whether products with ``weight`` (and an input of its dtype) read the reordered copy."""
    return ENABLED and weight.device.type == "cpu" and weight.dtype in DTYPES and weight.dim() == 2


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] -> a new oneDNN blocked copy (an opaque tensor: copy_ between two works)."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_HINT)


def _version(weight: torch.Tensor) -> int:
    return -1 if weight.is_inference() else weight._version  # inference tensors keep no version


def bind_reordered(weight: torch.Tensor, packed: torch.Tensor) -> None:
    """Products with ``weight`` read ``packed`` (a ``pack`` of the same shape) from now on, until
    ``weight`` changes in place: a weight streamed from another tier (actors/model/weight_offload.py)
    is copied into ``packed`` and never materialised in the plain layout."""
    weight._specray_onednn = (_version(weight), packed)


def reordered(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] in oneDNN's blocked layout, made once per weight version and cached on it."""
    version = _version(weight)
    cached = getattr(weight, "_specray_onednn", None)
    if cached is not None and cached[0] == version:
        return cached[1]
    packed = pack(weight)
    weight._specray_onednn = (version, packed)
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., in], weight [out, in], bias [out] -> [..., out]."""
    if not uses_onednn(x, weight) or (bias is not None and bias.dtype is not weight.dtype):
        return F.linear(x, weight, bias)
    flat = x.dim() == 2  # the model's products: no reshape or view around them (each is an op)
    rows = x if flat else x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    if m == 1:  # oneDNN's 1-row kernel sums in another order: take the multi-row one
        out = _product(torch.cat((rows, rows)), weight, bias)[:1]  # 1 op; expand + contiguous is 7
    elif padded_rows(m) != m:  # a bucket's shape (rows do not depend on what shares the product)
        out = _product(torch.cat([rows, rows.new_zeros(padded_rows(m) - m, rows.shape[1])]), weight, bias)[:m]
    else:
        out = _product(rows, weight, bias)
    return out if flat else out.view(*x.shape[:-1], -1)


def padded_rows(m: int) -> int:
    """The row count a product of ``m`` rows runs with: ``m`` up to 16, above that rounded up to a
    multiple of 1/8 of the power of two below it (17 -> 18, 33 -> 36, 130 -> 144, 450 -> 480)."""
    if m <= 16:
        return m
    step = 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def _product(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """rows [M >= 2, in] -> [M, out]."""
    rows = rows if rows.is_contiguous() else rows.contiguous()  # .contiguous() is an op even when a no-op
    return torch.ops.mkldnn._linear_pointwise(rows, reordered(weight), bias, "none", [], "")
