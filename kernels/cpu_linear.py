"""y = x W^T on CPU over a weight repacked once: the C++ kernel of ``kernels.cpu_native`` for fp32
(the default), oneDNN's inner product over its blocked layout for bf16 or where the kernels cannot
be built.

``F.linear`` on CPU hands fp32 products to MKL, whose rows depend on how many rows share the product
(greedy verification cannot take that) and which re-reads the weights for a few rows. Both paths
here read the weights once per product at any row count, and give every row the same bits whatever
rows share its product (tested), which greedy verification relies on: a draft is checked against
exactly what plain decoding would compute. ``python -m benchmarks.cpu_linear`` measures them on
your machine; on the 2-core Xeon (AVX-512) VM of 2026-11-27, ms per pass over SmolLM2-135M's
538 MB of fp32 weights, 2 threads (benchmarks/ARCHIVE.md, "the native kernels"): native / oneDNN /
MKL's F.linear, 1 row 25.6 / 38.5 / 25.5, 11 rows 32.0 / 46.4 / 74.8, 64 rows 79 / 100 / 111, 256 rows
298 / 281 / 320.

``SPECRAY_CPU_LINEAR`` picks: ``auto`` (native fp32 products when the kernels build, else oneDNN),
``native`` (an error if they cannot be built), ``onednn``, ``torch`` (``F.linear``). The packed copy
is made on the first product with a weight and kept on the weight tensor; an in-place change of the
weight (its ``_version``) makes a new one (inference tensors have no version: change them by making
new ones). Products that need gradients, other devices and other dtypes keep ``F.linear``.

oneDNN only: row counts are padded to a bucket (``padded_rows``: exact up to 16, then 8 sizes per
doubling, at most 12.5% more rows, zeros). oneDNN builds and caches a primitive per product shape
(ideep's and oneDNN's caches, 1024 entries each, ~0.5 MB per shape for both): a server's steps have
hundreds of distinct row counts (trees, prefill chunks), so exact shapes filled both caches, then
evicted and rebuilt primitives (~0.7 ms each) and fragmented the heap: RSS grew without a plateau.
With buckets the caches stop growing once every bucket has been seen, and never evict. Its 1-row
kernel sums in another order than its multi-row one, so a lone token's products run as two rows
(``lone_row_doubled``).
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

from kernels import cpu_native, gguf_blocks  # noqa: E402

KINDS = ("auto", "native", "onednn", "torch")
KIND = os.environ.get("SPECRAY_CPU_LINEAR", "auto")  # read once
if KIND not in KINDS:
    raise ValueError(f"SPECRAY_CPU_LINEAR={KIND!r} is not one of {', '.join(KINDS)}")
# products over packed weights at all (native or oneDNN); False: F.linear everywhere
ENABLED = KIND == "native" or (KIND != "torch" and torch.backends.mkldnn.is_available())
DTYPES = (torch.float32, torch.bfloat16)
_native: list = []  # [bool] once resolved: fp32 products run kernels.cpu_native
# The batch size the reorder is tuned for. 1 picks a layout that is slower from 2 rows on and whose
# rows depend on the row count; 8 to 64 measured alike for 1 to 64 rows.
PACK_HINT = 32
_packings = [0]  # how many times a weight's packed copy was (re)bound: see packing_generation


def packing_generation() -> int:
    """A count that grows whenever any weight's packed copy is made or rebound (``reordered`` packing
    anew, ``store_as``, ``bind_reordered``): a caller that keeps a list of packed copies, with the
    weights' ``_version``, knows from it whether the list still holds."""
    return _packings[0]


def _bind(weight: torch.Tensor, version: int, packed: torch.Tensor) -> None:
    weight._specray_packed = (version, packed)
    _packings[0] += 1


def native() -> bool:
    """Whether fp32 products run the C++ kernel (``kernels.cpu_native``; built on the first call)."""
    if not _native:
        ok = ENABLED and KIND in ("auto", "native") and cpu_native.load()
        if KIND == "native" and not ok:
            raise RuntimeError(f"SPECRAY_CPU_LINEAR=native but the CPU kernels cannot be used: "
                               f"{cpu_native.unavailable_reason()}; unset it to fall back to oneDNN")
        _native.append(ok)
    return _native[0]


def _native_dtype(dtype: torch.dtype) -> bool:
    return dtype is torch.float32 and native()


def lone_row_doubled(dtype: torch.dtype) -> bool:
    """Whether a one-token forward should run as two identical rows: oneDNN's 1-row kernel sums in
    another order than its multi-row one (ForwardBatch.doubled); the native kernel's rows never do."""
    return ENABLED and dtype in DTYPES and not _native_dtype(dtype)


def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear`` takes the packed-weight path (native or oneDNN) for this input."""
    return (ENABLED and x.device.type == "cpu" and weight.dtype in DTYPES and x.dtype is weight.dtype
            and x.dim() >= 2 and x.shape[-1] == weight.shape[1] and x.numel() > 0
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def packs(weight: torch.Tensor) -> bool:
    """Whether products with ``weight`` (and an input of its dtype) read the packed copy."""
    return ENABLED and weight.device.type == "cpu" and weight.dtype in DTYPES and weight.dim() == 2


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] -> a new packed copy: ``cpu_native.pack_linear``'s tiles for fp32 with the
    native kernels (or the storage ``store_as`` chose), else a oneDNN blocked copy (an opaque tensor).
    copy_ between two packs works."""
    with torch.no_grad():
        w = weight.detach().contiguous()
        if _native_dtype(w.dtype):
            storage = getattr(weight, "_specray_storage", None)  # store_as
            if storage == "Q8_0":
                return gguf_blocks.pack(gguf_blocks.quantize_q8_0(w))
            return cpu_native.pack_linear(w if storage is None else w.to(storage))
        return torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT)


STORAGES = (torch.float32, torch.bfloat16, "Q8_0")


def store_as(weight: torch.Tensor, dtype: torch.dtype | str) -> bool:
    """Products with the fp32 ``weight`` read its packed copy in ``dtype`` from now on: bfloat16 (half
    the bytes to stream; each value is widened exactly before its product, so inputs, sums and outputs
    stay fp32) or ``"Q8_0"`` (3.8x fewer bytes; the weights rounded to 8-bit blocks, so products change:
    for drafts only). Native kernels only: returns False (and changes nothing) where the products are
    not theirs. The EAGLE head stores its matrices this way (memory-bound at batch 1)."""
    if dtype not in STORAGES:
        raise ValueError(f"store_as: weights are stored as float32, bfloat16 or 'Q8_0', not {dtype!r}")
    if not (packs(weight) and weight.dtype is torch.float32 and native()):
        return False
    weight._specray_storage = None if dtype is torch.float32 else dtype
    _bind(weight, _version(weight), pack(weight))
    return True


def _version(weight: torch.Tensor) -> int:
    return -1 if weight.is_inference() else weight._version  # inference tensors keep no version


def bind_reordered(weight: torch.Tensor, packed: torch.Tensor) -> None:
    """Products with ``weight`` read ``packed`` (a ``pack`` of the same shape) from now on, until
    ``weight`` changes in place: a weight streamed from another tier (actors/model/weight_offload.py)
    is copied into ``packed`` and never materialised in the plain layout."""
    _bind(weight, _version(weight), packed)


def reordered(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] packed (``pack``), made once per weight version and cached on it."""
    version = _version(weight)
    cached = getattr(weight, "_specray_packed", None)
    if cached is not None and cached[0] == version:
        return cached[1]
    packed = pack(weight)
    _bind(weight, version, packed)
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., in], weight [out, in], bias [out] -> [..., out]."""
    if not uses_onednn(x, weight) or (bias is not None and bias.dtype is not weight.dtype):
        return F.linear(x, weight, bias)
    flat = x.dim() == 2  # the model's products: no reshape or view around them (each is an op)
    rows = x if flat else x.reshape(-1, x.shape[-1])
    if x.dtype is torch.float32 and native():
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        out = cpu_native.linear(rows, reordered(weight), weight.shape[0], bias)
        return out if flat else out.view(*x.shape[:-1], -1)
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
