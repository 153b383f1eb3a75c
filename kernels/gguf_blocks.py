"""A GGUF model's quantized matrices as the native CPU product reads them (``csrc/linear.cpp``).

The default model ships as a GGUF file whose matrices are Q4_1 (every 32 weights of a row share an
fp16 scale ``d`` and minimum ``m``: w = d q + m, q in 0..15) and whose embedding, tied to the LM
head, is Q8_0 (w = d q, q int8). The fp32 model specray runs is their dequantization, so streaming
those blocks instead of the fp32 copy reads 6.4x (Q4_1) or 3.8x (Q8_0) fewer bytes per product
for the same weights. With fp32 activations (SPECRAY_CPU_ACTIVATIONS=float32) the kernel rebuilds
each weight with the dequantization's own rounding (d q is exact in fp32; + m rounds once), so a
product over the blocks has the fp32 product's bits; by default it multiplies the quants by the
activations in 16-bit (or, opt-in, 8-bit) fixed point (csrc/linear_fixed.cpp).

Here: the blocks parsed from a tensor's raw GGUF bytes, their dequantization (the reference and the
check that blocks reproduce a weight bit for bit) and the packing into the kernel's tiles:
uint8 [ceil(N / 16), K / 32, 320] for Q4_1, [.., 544] for Q8_0, one tile per 16 output columns and
32 k (Q4_1: 16 scales, 16 minimums as fp16, then 16 rows of 16 bytes, row p holding k = 2p in the
low nibbles and k = 2p + 1 in the high ones; Q8_0: 16 scales, then 32 rows of 16 int8).

``QBlocks``: d [N, K / 32] fp16, m [N, K / 32] fp16 or None (Q8_0), q [N, K] (uint8 0..15 for Q4_1,
int8 for Q8_0): one row of blocks per output row, rows stackable in any order (``take``, ``cat``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_K = 32  # weights per block along a row (GGUF's QK4_1 and QK8_0)
LANES = 16  # output columns per tile
TILE_BYTES = {"Q4_1": 320, "Q8_0": 544}
RAW_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # GGUF: d (fp16)[, m (fp16)], the quants


@dataclass(frozen=True)
class QBlocks:
    kind: str  # "Q4_1" or "Q8_0"
    d: torch.Tensor  # [N, K / 32] fp16
    m: torch.Tensor | None  # [N, K / 32] fp16 (Q4_1), None (Q8_0)
    q: torch.Tensor  # [N, K] uint8 0..15 (Q4_1) or int8 (Q8_0)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def take(self, rows: torch.Tensor) -> "QBlocks":
        """The blocks of ``rows`` [R] int64, in that order."""
        return QBlocks(self.kind, self.d[rows], None if self.m is None else self.m[rows], self.q[rows])

    @staticmethod
    def cat(parts: list["QBlocks"]) -> "QBlocks":
        kinds = {p.kind for p in parts}
        if len(kinds) != 1:
            raise ValueError(f"cannot stack blocks of different kinds {sorted(kinds)}")
        kind = kinds.pop()
        m = None if kind == "Q8_0" else torch.cat([p.m for p in parts])
        return QBlocks(kind, torch.cat([p.d for p in parts]), m, torch.cat([p.q for p in parts]))


def parse(kind: str, raw: torch.Tensor, k: int) -> QBlocks:
    """raw [N, K / 32 * block bytes] uint8: a GGUF tensor's rows as stored -> its blocks."""
    if kind not in RAW_BLOCK_BYTES:
        raise ValueError(f"GGUF block type {kind!r} is not one of {sorted(RAW_BLOCK_BYTES)}")
    if k % BLOCK_K:
        raise ValueError(f"a {kind} row of {k} weights is not a whole number of {BLOCK_K}-weight blocks")
    n, kb = raw.shape[0], k // BLOCK_K
    if raw.dtype is not torch.uint8 or raw.shape[1] != kb * RAW_BLOCK_BYTES[kind]:
        raise ValueError(f"{kind} rows of {k} weights are {kb * RAW_BLOCK_BYTES[kind]} bytes, got {tuple(raw.shape)} "
                         f"{raw.dtype}")
    blocks = raw.reshape(n, kb, RAW_BLOCK_BYTES[kind])
    d = blocks[..., 0:2].contiguous().view(torch.float16).reshape(n, kb)
    if kind == "Q8_0":
        return QBlocks(kind, d, None, blocks[..., 2:].contiguous().view(torch.int8).reshape(n, k))
    m = blocks[..., 2:4].contiguous().view(torch.float16).reshape(n, kb)
    qs = blocks[..., 4:]  # [n, kb, 16]: byte j holds weight j (low nibble) and weight j + 16 (high)
    q = torch.cat([qs & 15, qs >> 4], dim=-1).reshape(n, k)
    return QBlocks(kind, d, m, q)


def quantize_q8_0(w: torch.Tensor) -> QBlocks:
    """w [N, K] fp32 (K a multiple of 32) -> Q8_0 blocks as GGML makes them: d = max |w| / 127 per
    block (fp16), q = round(w / d). For matrices whose products need not be exact (a draft head)."""
    n, k = w.shape
    if k % BLOCK_K:
        raise ValueError(f"Q8_0 needs rows of a multiple of {BLOCK_K} weights, got {k}")
    blocks = w.detach().float().reshape(n, k // BLOCK_K, BLOCK_K)
    d = blocks.abs().amax(-1) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return QBlocks("Q8_0", d.half(), None, q.reshape(n, k))


def dequantize(b: QBlocks) -> torch.Tensor:
    """-> fp32 [N, K], rounded as gguf's dequantization: d * q (exact in fp32), then + m."""
    n, k = b.shape
    w = b.d.float().repeat_interleave(BLOCK_K, dim=1) * b.q.float()
    if b.m is not None:
        w = w + b.m.float().repeat_interleave(BLOCK_K, dim=1)
    return w.reshape(n, k)


def pack(b: QBlocks) -> torch.Tensor:
    """blocks -> the kernel's tiles uint8 [T, K / 32, TILE_BYTES[kind]] (columns past N are zero)."""
    n, k = b.shape
    tiles, kb = -(-n // LANES), k // BLOCK_K
    pad = tiles * LANES - n

    def by_tile(t: torch.Tensor) -> torch.Tensor:  # [N, ...] -> [T, 16, ...] with zero rows past N
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
        return t.reshape(tiles, LANES, *t.shape[1:])

    def scales(s: torch.Tensor) -> torch.Tensor:  # [N, KB] fp16 -> [T, KB, 32] bytes
        return by_tile(s).permute(0, 2, 1).contiguous().view(torch.uint8)

    if b.kind == "Q8_0":
        q = by_tile(b.q).reshape(tiles, LANES, kb, BLOCK_K).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
        return torch.cat([scales(b.d), q.reshape(tiles, kb, BLOCK_K * LANES)], dim=-1).contiguous()
    q = by_tile(b.q).reshape(tiles, LANES, kb, BLOCK_K // 2, 2).permute(0, 2, 3, 1, 4)  # [T, KB, p, j, 2]
    nibbles = (q[..., 0] | (q[..., 1] << 4)).reshape(tiles, kb, BLOCK_K // 2 * LANES)
    return torch.cat([scales(b.d), scales(b.m), nibbles], dim=-1).contiguous()


def packed_bytes(n: int, k: int, kind: str) -> int:
    """Bytes a product streams for an [n, k] matrix of ``kind`` blocks."""
    return -(-n // LANES) * (k // BLOCK_K) * TILE_BYTES[kind]
