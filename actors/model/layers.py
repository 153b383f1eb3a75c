"""Building blocks of the Llama-family forward: RMSNorm, SwiGLU MLP and the tensor-parallel linears
(rotary embedding: ``actors.model.rope``, re-exported here).

Every parameter carries ``weight_loader(param, src, shard_id=None)``: ``src`` is the FULL checkpoint
tensor, or a safetensors ``get_slice`` handle of it, and the loader reads only this rank's shard.
With ``TPContext.single()`` (size 1) no collective is ever called.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from actors.model.rope import (  # noqa: F401  (re-exported: callers import RoPE from here)
    RotaryEmbedding,
    apply_rotary,
    apply_rotary_halves,
    rope_inv_freq,
    rotary_halves_tables,
)
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


# ---------------------------------------------------------------- norm

class RMSNorm(nn.Module):
    fused_add_norm = None  # (x, residual, weight, eps) -> (normed, sum); set by attention_backends
    fused_norm = None  # (x, weight, eps) -> normed; set by attention_backends

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
            return self._norm(x) if self.fused_norm is None else self.fused_norm(x, self.weight, self.eps)
        if self.fused_add_norm is not None:
            return self.fused_add_norm(x, residual, self.weight, self.eps)
        x = x.add_(residual)
        return self._norm(x), x


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
        if self.tp.size == 1:  # the rows copied: F.embedding's bits in one op (indexing is 4, F.embedding 7)
            return self.weight.index_select(0, input_ids)
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
