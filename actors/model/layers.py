"""Building blocks of the Llama-family forward: RMSNorm, rotary embedding, SwiGLU MLP and the
tensor-parallel linears.

Every parameter carries ``weight_loader(param, src, shard_id=None)``: ``src`` is the FULL checkpoint
tensor, or a safetensors ``get_slice`` handle of it, and the loader reads only this rank's shard.
With ``TPContext.single()`` (size 1) no collective is ever called.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from kernels.cpu_linear import linear


@dataclass(frozen=True)
class TPContext:
    """This process's place in its tensor-parallel group (``group=None``: the default group)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    @staticmethod
    def single() -> "TPContext":
        return _SINGLE

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:  # in place, returns x
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:  # [..., n] -> [..., size * n]
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def gather_last_to_rank0(self, x: torch.Tensor) -> torch.Tensor | None:  # None off rank 0
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        dst = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        dist.gather(x.contiguous(), parts, dst=dst, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else None


_SINGLE = TPContext()


# ---------------------------------------------------------------- weight-loading helpers

def src_shape(src: Any) -> tuple[int, ...]:
    """Shape of a tensor or of a safetensors slice."""
    return tuple(src.shape) if isinstance(src, torch.Tensor) else tuple(src.get_shape())


def narrow_src(src: Any, dim: int, start: int, length: int) -> torch.Tensor:
    """``src.narrow(dim, start, length)`` that reads only that part of a safetensors slice."""
    shape = src_shape(src)
    if start + length > shape[dim]:
        raise ValueError(f"checkpoint tensor of shape {shape} is too small: needs [{start}, {start + length}) "
                         f"along dim {dim}; does the checkpoint match the config?")
    if isinstance(src, torch.Tensor):
        return src.narrow(dim, start, length)
    index = [slice(None)] * len(shape)
    index[dim] = slice(start, start + length)
    return src[tuple(index)]


def read_src(src: Any) -> torch.Tensor:
    return src if isinstance(src, torch.Tensor) else src[:]


_NUMPY_DTYPES = (torch.float32, torch.float16, torch.float64)


def _copy_into(dst: torch.Tensor, value: torch.Tensor, what: str) -> None:
    if tuple(dst.shape) != tuple(value.shape):
        raise ValueError(f"{what}: checkpoint shard has shape {tuple(value.shape)}, expected {tuple(dst.shape)}")
    if dst.device.type == value.device.type == "cpu" and dst.dtype == value.dtype and dst.dtype in _NUMPY_DTYPES:
        # single-threaded copy: safetensors tensors are mmap-backed, and page faults taken by several
        # OpenMP threads at once serialise on the mm lock (10x slower load on a busy 2-core box)
        dst.numpy()[...] = value.numpy()
    else:
        dst.copy_(value)


def _param(shape: Sequence[int], dtype: torch.dtype | None, loader) -> nn.Parameter:
    p = nn.Parameter(torch.empty(*shape, dtype=dtype or torch.get_default_dtype()), requires_grad=False)
    p.weight_loader = loader
    return p


def _load_replicated(param: nn.Parameter, src: Any, shard_id: Any = None) -> None:
    _copy_into(param.data, read_src(src), "replicated parameter")


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what}={n} is not divisible by tp size {d}; choose a tp size that divides it")
    return n // d


# ---------------------------------------------------------------- norm, rotary, activation

class RMSNorm(nn.Module):
    fused_add_norm = None  # (x, residual, weight, eps) -> (normed, sum); set by attention_backends

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.shape = (hidden_size,)
        self.weight = _param((hidden_size,), dtype, _load_replicated)
        # 0-dim fp32 operands for the CPU fp32 path: a Python number costs a conversion op per use
        self.register_buffer("_size", torch.tensor(float(hidden_size)), persistent=False)
        self.register_buffer("_eps", torch.tensor(eps, dtype=torch.float32), persistent=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype is torch.float32 is self.weight.dtype is self._eps.dtype and x.device.type == "cpu":
            # the ops of F.rms_norm's CPU composite (x*x is pow(x, 2), mean is sum then div_, then
            # + eps: one addcdiv) in 7 dispatcher calls instead of 24, same bits (tests/model/test_lean_forward.py)
            r = torch.addcdiv(self._eps, (x * x).sum(-1, keepdim=True), self._size).rsqrt_()
            return x.mul(r).mul_(self.weight)
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        return F.rms_norm(x.float(), self.shape, None, self.eps).to(x.dtype) * self.weight

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [N, H]. Without residual returns norm(x); with residual [N, H] returns
        (norm(x + residual), x + residual), reusing x's storage for the sum."""
        if residual is None:
            return self._norm(x)
        if self.fused_add_norm is not None:
            return self.fused_add_norm(x, residual, self.weight, self.eps)
        x = x.add_(residual)
        return self._norm(x), x


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


# ---------------------------------------------------------------- tensor-parallel linears

class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's output rows split across ranks: weight [output_size / tp, input_size]."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 tp: TPContext = _SINGLE, dtype: torch.dtype | None = None):
        super().__init__()
        self.tp = tp
        self.output_size_per_rank = _divide(output_size, tp.size, "output_size")
        self.weight = _param((self.output_size_per_rank, input_size), dtype, self.weight_loader)
        self.bias = _param((self.output_size_per_rank,), dtype, self.weight_loader) if bias else None

    def weight_loader(self, param: nn.Parameter, src: Any, shard_id: Any = None) -> None:
        n = param.shape[0]
        _copy_into(param.data, narrow_src(src, 0, self.tp.rank * n, n), "column-parallel shard")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [N, in] -> [N, out / tp]
        return linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate_up): rank r holds [shard0_r, shard1_r, ...]."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False,
                 tp: TPContext = _SINGLE, dtype: torch.dtype | None = None):
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(self.output_sizes), bias, tp, dtype)
        self.shard_sizes = [_divide(s, tp.size, "output size") for s in self.output_sizes]

    def weight_loader(self, param: nn.Parameter, src: Any, shard_id: int | None = None) -> None:
        ids = range(len(self.output_sizes)) if shard_id is None else [int(shard_id)]
        for i in ids:
            base = sum(self.output_sizes[:i]) if shard_id is None else 0
            n, dst = self.shard_sizes[i], sum(self.shard_sizes[:i])
            value = narrow_src(src, 0, base + self.tp.rank * n, n)
            _copy_into(param.data[dst:dst + n], value, f"merged shard {i}")


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q, k, v projection. Query heads split across ranks; KV heads split too, or replicated when
    there are fewer KV heads than ranks. Rank output layout: [q (h/tp*d), k (kvh_r*d), v (kvh_r*d)]."""

    def __init__(self, config, tp: TPContext = _SINGLE, dtype: torch.dtype | None = None):
        c = config
        self.head_dim, self.num_heads, self.num_kv_heads = c.head_dim, c.num_heads, c.num_kv_heads
        self.heads_per_rank = _divide(c.num_heads, tp.size, "num_heads")
        if c.num_kv_heads >= tp.size:
            self.kv_heads_per_rank = _divide(c.num_kv_heads, tp.size, "num_kv_heads")
            self.kv_head_start = tp.rank * self.kv_heads_per_rank
        else:
            self.kv_heads_per_rank = 1
            self.kv_head_start = tp.rank // _divide(tp.size, c.num_kv_heads, "tp size over num_kv_heads")
        self.q_size = self.heads_per_rank * c.head_dim
        self.kv_size = self.kv_heads_per_rank * c.head_dim
        out_full = (self.q_size + 2 * self.kv_size) * tp.size
        super().__init__(c.hidden_size, out_full, c.attention_bias, tp, dtype)

    def _shard(self, shard_id: str) -> tuple[int, int, int, int]:
        """(dst offset, length, src offset within the shard's full tensor, src offset of that tensor in fused qkv)."""
        d, full_q = self.head_dim, self.num_heads * self.head_dim
        if shard_id == "q":
            return 0, self.q_size, self.tp.rank * self.q_size, 0
        start = self.kv_head_start * d
        if shard_id == "k":
            return self.q_size, self.kv_size, start, full_q
        if shard_id == "v":
            return self.q_size + self.kv_size, self.kv_size, start, full_q + self.num_kv_heads * d
        raise ValueError(f"shard_id {shard_id!r} is not one of 'q', 'k', 'v'")

    def weight_loader(self, param: nn.Parameter, src: Any, shard_id: str | None = None) -> None:
        for sid in ("q", "k", "v") if shard_id is None else (shard_id,):
            dst, n, start, fused_base = self._shard(sid)
            value = narrow_src(src, 0, start + (fused_base if shard_id is None else 0), n)
            _copy_into(param.data[dst:dst + n], value, f"qkv shard {sid}")


class RowParallelLinear(nn.Module):
    """y = x W^T with W's input columns split across ranks; partial outputs are all-reduced (tp > 1)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 tp: TPContext = _SINGLE, dtype: torch.dtype | None = None):
        super().__init__()
        self.tp = tp
        self.input_size_per_rank = _divide(input_size, tp.size, "input_size")
        self.weight = _param((output_size, self.input_size_per_rank), dtype, self.weight_loader)
        self.bias = _param((output_size,), dtype, _load_replicated) if bias else None

    def weight_loader(self, param: nn.Parameter, src: Any, shard_id: Any = None) -> None:
        n = param.shape[1]
        _copy_into(param.data, narrow_src(src, 1, self.tp.rank * n, n), "row-parallel shard")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [N, in / tp] -> [N, out]
        if self.tp.size == 1:
            return linear(x, self.weight, self.bias)
        y = self.tp.all_reduce(linear(x, self.weight))
        return y if self.bias is None else y.add_(self.bias)


class VocabParallelEmbedding(nn.Module):
    """Embedding with the vocabulary split across ranks (padded to a multiple of tp)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TPContext = _SINGLE,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.tp, self.num_embeddings = tp, num_embeddings
        self.per_rank = -(-num_embeddings // tp.size)
        self.vocab_start = tp.rank * self.per_rank
        self.num_loaded = max(0, min(self.per_rank, num_embeddings - self.vocab_start))
        self.weight = _param((self.per_rank, embedding_dim), dtype, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, src: Any, shard_id: Any = None) -> None:
        n = self.num_loaded
        _copy_into(param.data[:n], narrow_src(src, 0, self.vocab_start, n), "vocab shard")
        param.data[n:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [N] int64 -> [N, H]
        if self.tp.size == 1:  # the rows copied: F.embedding's bits in 4 ops instead of 7
            return self.weight[input_ids]
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_loaded)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Vocab-split output projection; logits gathered to all ranks (or rank 0 only), fp32 [M, vocab]."""

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor, gather: str = "all") -> torch.Tensor | None:
        """hidden [M, H] -> logits [M, vocab] float32 (None off rank 0 when gather == 'rank0')."""
        local = linear(hidden, self.weight)
        if self.tp.size > 1:
            local = self.tp.all_gather_last(local) if gather == "all" else self.tp.gather_last_to_rank0(local)
            if local is None:
                return None
        if local.shape[-1] != self.num_embeddings:
            local = local[..., : self.num_embeddings]
        return local if local.dtype is torch.float32 else local.float()  # .float() is an op even when a no-op


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate/up fused into one column-parallel matmul."""

    fused_act = None  # [N, 2I] -> [N, I] silu-and-mul kernel; set by attention_backends

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 tp: TPContext = _SINGLE, dtype: torch.dtype | None = None):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias, tp, dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, tp, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        gate_up = self.gate_up_proj(x)
        if self.fused_act is not None:
            return self.down_proj(self.fused_act(gate_up))
        n, half = gate_up.shape[0], gate_up.shape[-1] // 2  # gate_up [N, 2I] contiguous: as_strided is 1 op, a slice 2
        gate = gate_up.as_strided((n, half), (gate_up.stride(0), 1))
        up = gate_up.as_strided((n, half), (gate_up.stride(0), 1), gate_up.storage_offset() + half)
        return self.down_proj(F.silu(gate).mul_(up))
