"""Rotary position embedding (neox rotate-half) for the Llama-family forward: inverse frequencies for
the RoPE types default/linear/dynamic/llama3/yarn, the cos/sin cache, and the rotation in the few-op
form the eager forward uses (``apply_rotary_halves`` over ``RotaryEmbedding.halves_tables``) beside
the plain one (``apply_rotary``) it is tested against."""
from __future__ import annotations

import math

import torch
from torch import nn


def rope_inv_freq(head_dim: int, base: float, scaling: dict | None, seq_len: int | None = None):
    """(inv_freq [head_dim // 2] fp32, attention_factor) for RoPE types default/linear/dynamic/llama3/yarn."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = "default" if scaling is None else scaling["rope_type"]
    if rope_type == "default":
        return inv, 1.0
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv / factor, 1.0
    if rope_type == "dynamic":
        max_pos = scaling["max_position_embeddings"]
        seq = max(seq_len or max_pos, max_pos)
        base = base * ((factor * seq / max_pos) - (factor - 1)) ** (head_dim / (head_dim - 2))
        return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv, scaling), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, base, scaling)
    raise ValueError(f"rope type {rope_type!r} is not supported")


def _llama3_inv_freq(inv: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(dim: int, base: float, s: dict):
    factor = float(s["factor"])
    orig = s["original_max_position_embeddings"]
    mscale = lambda sc, m=1.0: 1.0 if sc <= 1 else 0.1 * m * math.log(sc) + 1.0  # noqa: E731
    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    corr = lambda rot: dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
    low, high = corr(s.get("beta_fast") or 32), corr(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, float(attn)


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) RoPE with a cos/sin cache [max_pos, head_dim // 2] in the model dtype."""

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: dict | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.head_dim, self.base, self.max_position = head_dim, base, max_position
        self.scaling = None if scaling is None else {**scaling, "max_position_embeddings": max_position}
        self.dtype = dtype or torch.get_default_dtype()
        self.dynamic = self.scaling is not None and self.scaling["rope_type"] == "dynamic"
        self._cos, self._sin = self._table(max_position, None)
        self._halves = None  # (the _cos it was made from, [len, 3, head_dim // 2]: cos, -sin, sin)

    def _table(self, length: int, seq_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        inv, attn = rope_inv_freq(self.head_dim, self.base, self.scaling, seq_len)
        freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv)
        return (freqs.cos() * attn).to(self.dtype), (freqs.sin() * attn).to(self.dtype)

    def _apply(self, fn, recurse=True):  # keep the cache on the module's device/dtype
        super()._apply(fn, recurse)
        self._cos, self._sin = fn(self._cos), fn(self._sin)
        self._halves = None
        self.dtype = self._cos.dtype
        return self

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] int64 -> (cos, sin), each [N, 1, head_dim // 2]."""
        if positions.device.type == "cpu" and positions.numel():
            top = int(positions.max()) + 1
            if top > self._cos.shape[0] or (self.dynamic and top > self.max_position):
                return self._fresh(positions, top)
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)

    def halves_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``rotary_halves_tables(*self.cos_sin(positions))`` in 3 ops instead of about 20: one lookup of
        positions [N] in a table of rows (cos, -sin, sin) made once, then two strided views of it."""
        table = self._halves[1] if self._halves is not None and self._halves[0] is self._cos else None
        if table is None:
            table = torch.stack((self._cos, -self._sin, self._sin), dim=1)  # [len, 3, d / 2]
            self._halves = (self._cos, table)
        if positions.device.type == "cpu":
            try:  # beyond the table (or, dynamic, beyond max_position: its table's length): aten::index raises
                rows = table[positions]
            except IndexError:
                return rotary_halves_tables(*self.cos_sin(positions))
        else:
            rows = table[positions]
        n, half = rows.shape[0], rows.shape[-1]
        cos = rows.as_strided((n, 1, 1, half), (3 * half, half, half, 1), rows.storage_offset())
        signed_sin = rows.as_strided((n, 1, 2, half), (3 * half, half, half, 1), rows.storage_offset() + half)
        return cos, signed_sin

    def _fresh(self, positions: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dynamic:  # NTK base depends on the longest sequence of this forward (as in transformers)
            cos, sin = self._table(top, top)
        else:  # grow the cache once, to a power of two
            self._cos, self._sin = cos, sin = self._table(1 << (top - 1).bit_length(), None)
        dev = positions.device
        return cos.to(dev)[positions].unsqueeze(1), sin.to(dev)[positions].unsqueeze(1)


def rotary_halves_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N, 1, head_dim // 2] -> the operands of ``apply_rotary_halves``: cos [N, 1, 1, head_dim // 2]
    and the signed sin [N, 1, 2, head_dim // 2] (-sin for the first half, sin for the second). Once per forward."""
    return cos.unsqueeze(2), torch.stack((-sin, sin), dim=2)


def apply_rotary_halves(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary`` in 6 ops instead of 14 (no chunk, no cat), same bits: x [N, heads, 2, head_dim // 2]
    (the two halves of each head on their own axis), tables of ``rotary_halves_tables``
    -> new contiguous [N, heads, 2, head_dim // 2]. First half x1 cos + x2 (-sin) = x1 cos - x2 sin,
    second x2 cos + x1 sin (IEEE: a + (-b) is a - b, and x (-s) is -(x s), exactly)."""
    return (x * cos).add_(x.flip(2).mul_(signed_sin))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim] (last dim contiguous), cos/sin [N, 1, head_dim // 2] -> new [N, heads, head_dim]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
