"""A GGUF-loaded model's products read the file's own quantized blocks on CPU (kernels/gguf_blocks.py).

The fp32 model is the GGUF's dequantization, so each of its matrices (fused qkv and gate_up
included: rows of several GGUF tensors side by side; q and k rows permuted by the conversion) is,
row for row, some GGUF tensor's blocks. The rows are matched by a fingerprint of their fp32 bits,
and a matrix is bound to its blocks only if their dequantization equals it bit for bit; the native
product over the blocks then streams ~5.6x fewer bytes per decode step, multiplying the activations
in 16-bit fixed point (the default, csrc/linear_fixed.cpp; 8-bit with SPECRAY_CPU_ACTIVATIONS=int8) or, with SPECRAY_CPU_ACTIVATIONS=float32, in
fp32 with the fp32 product's bits (the kernel rounds as the dequantization did). A matrix without an
exact match (another file, a tensor-parallel shard split along its rows' length) keeps its fp32
product.

The match reads the whole GGUF (~3 s for the default model); its result is cached next to the
converted model (``gguf-tiles-v1.safetensors.cache`` in the content-keyed directory of
loader.convert_gguf; one file per tensor-parallel rank) and checked on every later load: a product of the tiles with identity rows must give the matrix's
columns at 8 random positions exactly.

``SPECRAY_CPU_WEIGHTS``: ``auto`` (default: the blocks where they reproduce the weights) or
``float32`` (the fp32 products throughout). Only where the native CPU products run (fp32 models on
CPU, kernels built): ``kernels.cpu_linear.native()``.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from kernels import cpu_linear, cpu_native, gguf_blocks
from kernels.gguf_blocks import QBlocks

log = logging.getLogger(__name__)

MODES = ("auto", "float32")
CACHE_NAME = "gguf-tiles-v1.safetensors.cache"  # not *.safetensors: that is the weights
_CHUNK_ROWS = 4096
_CHECK_COLUMNS = 8


def cache_name(model: torch.nn.Module) -> str:
    """The cache file of this model's matrices: a tensor-parallel shard holds other rows (its own file)."""
    tp = getattr(model, "tp", None)
    if tp is None or tp.size == 1:
        return CACHE_NAME
    return CACHE_NAME.replace("-v1", f"-v1-tp{tp.size}-rank{tp.rank}")


def mode() -> str:
    value = os.environ.get("SPECRAY_CPU_WEIGHTS", "auto")
    if value not in MODES:
        raise ValueError(f"SPECRAY_CPU_WEIGHTS={value!r} is not one of {', '.join(MODES)}")
    return value


def matrices(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's fp32 CPU matrices that products read (a tied embedding once, under its first name)."""
    return {name: p for name, p in model.named_parameters() if p.dim() == 2 and p.dtype is torch.float32
            and p.device.type == "cpu" and cpu_linear.packs(p)}


def num_bound(model: torch.nn.Module) -> int:
    """How many of ``model``'s matrices have their products read quantized blocks."""
    return sum(cpu_linear.reordered(w).dtype is torch.uint8 for w in matrices(model).values())


def bind(model: torch.nn.Module, gguf: Path, cache_dir: Path | None) -> dict[str, str]:
    """Bind each of ``model``'s matrices that a GGUF tensor's blocks reproduce exactly to those blocks'
    tiles (``cpu_linear.bind_reordered``); returns {parameter name: block kind} of those bound. Does
    nothing (returns {}) with SPECRAY_CPU_WEIGHTS=float32 or where the native products do not run."""
    if mode() == "float32" or not cpu_linear.native():
        return {}
    mats = matrices(model)
    if not mats:
        return {}
    cache = cache_dir / cache_name(model) if cache_dir is not None else None
    tiles = _load_cache(cache, mats) if cache is not None and cache.is_file() else None
    if tiles is None:
        tiles = match_tiles(mats, read_blocks(gguf))
        if cache is not None:
            _save_cache(cache, tiles)
    for name, (kind, packed) in tiles.items():
        cpu_linear.bind_reordered(mats[name], packed)
    log.info("products of %d of %d matrices read %s's blocks (%s)", len(tiles), len(mats), gguf.name,
             ", ".join(sorted({k for k, _ in tiles.values()})) or "none")
    return {name: kind for name, (kind, _) in tiles.items()}


def read_blocks(gguf: Path) -> dict[tuple[str, int], QBlocks]:
    """Every Q4_1 / Q8_0 tensor of the file, stacked by (kind, row length): {(kind, K): blocks}."""
    from gguf import GGUFReader

    parts: dict[tuple[str, int], list[QBlocks]] = {}
    for t in GGUFReader(gguf).tensors:
        kind = t.tensor_type.name
        if kind not in gguf_blocks.RAW_BLOCK_BYTES:
            continue
        k = int(t.shape[0])  # GGUF lists dimensions innermost first
        raw = torch.from_numpy(np.array(t.data).reshape(-1, t.data.shape[-1]))  # a copy: the map is read-only
        parts.setdefault((kind, k), []).append(gguf_blocks.parse(kind, raw, k))
    return {key: QBlocks.cat(p) for key, p in parts.items()}


def fingerprint(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] fp32 -> [N] int64, a hash of each row's bits (equal rows, equal hashes)."""
    k = w.shape[1]
    mult = torch.randint(1, 2 ** 62, (k,), generator=torch.Generator().manual_seed(k), dtype=torch.int64) | 1
    bits = w.contiguous().view(torch.int32)
    return torch.cat([(bits[i:i + _CHUNK_ROWS].to(torch.int64) * mult).sum(1)
                      for i in range(0, w.shape[0], _CHUNK_ROWS)])


def match_tiles(mats: dict[str, torch.Tensor], pools: dict[tuple[str, int], QBlocks]
                ) -> dict[str, tuple[str, torch.Tensor]]:
    """{name: (kind, tiles)} for each matrix whose rows all come from one pool's rows, exactly."""
    indexed = {}
    for key, pool in pools.items():
        fp = fingerprint(gguf_blocks.dequantize(pool))
        order = torch.argsort(fp)
        indexed[key] = (fp[order], order, pool)
    out = {}
    with torch.no_grad():
        for name, w in mats.items():
            fp = None  # once per matrix, for the first pool of its row length
            for (kind, k), (sorted_fp, order, pool) in indexed.items():
                if k != w.shape[1]:
                    continue
                fp = fingerprint(w) if fp is None else fp
                at = torch.searchsorted(sorted_fp, fp).clamp(max=len(sorted_fp) - 1)
                if not torch.equal(sorted_fp[at], fp):
                    continue
                blocks = pool.take(order[at])
                if torch.equal(gguf_blocks.dequantize(blocks), w):
                    out[name] = (kind, gguf_blocks.pack(blocks))
                    break
    return out


def check_tiles(w: torch.Tensor, packed: torch.Tensor, gen: torch.Generator) -> bool:
    """Whether ``packed`` holds ``w`` [N, K]: a product with identity rows gives 8 random columns exactly."""
    n, k = w.shape
    if packed.dtype is not torch.uint8 or packed.dim() != 3 or packed.shape[0] * gguf_blocks.LANES < n \
            or packed.shape[1] * gguf_blocks.BLOCK_K != k:
        return False
    cols = torch.randint(0, k, (_CHECK_COLUMNS,), generator=gen)
    eye = torch.zeros(_CHECK_COLUMNS, k)
    eye[torch.arange(_CHECK_COLUMNS), cols] = 1.0
    return torch.equal(cpu_native.linear(eye, packed, n), w.detach()[:, cols].T)


def _load_cache(path: Path, mats: dict[str, torch.Tensor]) -> dict[str, tuple[str, torch.Tensor]] | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            kinds = f.metadata() or {}
            tiles = {name: (kinds[name], f.get_tensor(name)) for name in f.keys() if name in mats and name in kinds}
    except Exception as e:  # unreadable: match again and rewrite it
        log.warning("ignoring %s: %s", path, e)
        return None
    gen = torch.Generator().manual_seed(0)
    if not all(check_tiles(mats[name], packed, gen) for name, (_, packed) in tiles.items()):
        log.warning("%s does not hold this model's matrices; matching the GGUF again", path)
        return None
    return tiles


def _save_cache(path: Path, tiles: dict[str, tuple[str, torch.Tensor]]) -> None:
    """Written to a temporary file and renamed into place; a read-only cache directory is not an error."""
    from safetensors.torch import save_file

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        save_file({n: t for n, (_, t) in tiles.items()}, tmp, metadata={n: k for n, (k, _) in tiles.items()})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        log.warning("could not cache the GGUF tiles in %s: %s", path.parent, e)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
