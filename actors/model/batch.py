"""The flattened forward batch: the one contract between the engine and the model.

One forward runs N tokens from B sequences. Sequence b owns the query tokens
``[query_start_loc[b], query_start_loc[b+1])``. Its keys are the logical positions
``[0, kv_lens[b])`` of its block table, *after* this step's K/V have been written through
``slot_mapping``. Visibility:

- key positions ``< kv_lens[b] - w`` are visible to every query of b (committed context);
- the trailing window of ``w`` key positions ``[kv_lens[b] - w, kv_lens[b])`` is governed by
  ``window_masks[b]`` of shape [q_b, w] (True = visible). ``None`` means causal over the new
  tokens (w = q_b, lower-triangular): a prefill chunk or a plain decode token.
  A token tree passes its ancestor-or-self mask (a node sees its ancestors only).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch


def host_int64(values: Iterable[int]) -> torch.Tensor:
    """int64 [len(values)] on the CPU over an ``array('q')`` of the values: no dispatcher op (torch.tensor
    is four: empty, to, lift_fresh, detach_). The tensor owns the array (a reference)."""
    buf = array("q", values)
    return torch.frombuffer(buf, dtype=torch.int64) if len(buf) else torch.empty(0, dtype=torch.int64)


def to_device(values: list[int], device: torch.device, on_host: bool | None = None) -> torch.Tensor:
    """int64 [len(values)] on ``device`` without waiting for the device's queued work (a plain
    ``torch.tensor(..., device=cuda)`` synchronises the stream). on_host: whether ``device`` is the CPU,
    when the caller knows (a batch's six tensors ask once)."""
    try:
        t = host_int64(values)
    except TypeError:  # not plain integers (e.g. floats): torch.tensor's own conversion and errors
        t = torch.tensor(values, dtype=torch.int64)
    if on_host is None:
        on_host = torch.device(device).type == "cpu"
    return t if on_host else t.to(device, non_blocking=True)


def is_every_row(rows: list[int], n: int) -> bool:
    """Whether ``rows`` are 0..n-1 in order (a selection that changes nothing)."""
    return len(rows) == n and rows == list(range(n))


def rows_of(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """t [R, ...] -> its ``rows`` [len(rows), ...] (a copy; ``t`` itself when they are all of its rows in
    order, as at concurrency 1): one index_select, where indexing with a list is ~4 ops."""
    if is_every_row(rows, t.shape[0]):
        return t
    return t.index_select(0, to_device(rows, t.device))


@dataclass(slots=True)
class HostMeta:
    """Host copies of a batch's lengths and block tables, as the batch was built from them: the torch
    attention builds its per-forward indices from these with numpy, reading nothing back from tensors
    (a ``.tolist()`` is 2 dispatcher ops, ``.numpy()`` 4). Optional: without it they are read back."""

    query_start_loc: list[int]  # [B+1]
    kv_lens: list[int]  # [B]
    block_tables: np.ndarray  # [B, max_blocks] int64


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64, RoPE position of each token
    slot_mapping: torch.Tensor  # [N] int64, flat KV slot = block * block_size + offset
    query_start_loc: torch.Tensor  # [B+1] int64, cumulative query lengths
    kv_lens: torch.Tensor  # [B] int64, key positions visible to sequence b after the write
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with 0
    block_size: int
    window_masks: list[torch.Tensor | None] = field(default_factory=list)  # per seq [q_b, w_b] bool or None
    # Per-forward cache for attention backends (e.g. the dense mask built once, used by every layer).
    cache: dict = field(default_factory=dict)
    host: HostMeta | None = None  # host copies of query_start_loc, kv_lens, block_tables (see HostMeta)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.kv_lens.shape[0])

    def doubled(self) -> "ForwardBatch":
        """This one-token batch as two identical sequences (same token, position, slot and keys).
        The model runs a lone token this way so that every product has two rows: oneDNN's 1-row
        kernel sums in another order, and padding each product separately costs a copy per product.
        Both rows compute the same bits, so writing the slot twice stores the same K/V."""
        if self.num_tokens != 1:
            raise ValueError(f"doubled() is for a one-token batch; this one has {self.num_tokens} tokens")
        qsl = _doubled_qsl(self.query_start_loc)
        host = None if self.host is None else HostMeta(
            [0, 1, 2], self.host.kv_lens * 2, np.broadcast_to(self.host.block_tables, (2, self.host.block_tables.shape[1])))
        return ForwardBatch(_twice(self.input_ids), _twice(self.positions), _twice(self.slot_mapping), qsl,
                            _twice(self.kv_lens), _twice(self.block_tables), self.block_size,
                            self.window_masks * 2, host=host)

    @staticmethod
    def make_dummy(num_tokens: int = 4, block_size: int = 16, device: str | torch.device = "cpu") -> "ForwardBatch":
        """One sequence prefilling ``num_tokens`` tokens from position 0 in block 0.. (warm-up, tests)."""
        n = num_tokens
        nblocks = (n + block_size - 1) // block_size
        i64 = dict(dtype=torch.int64, device=device)
        return ForwardBatch(
            input_ids=torch.zeros(n, **i64),
            positions=torch.arange(n, **i64),
            slot_mapping=torch.arange(n, **i64),
            query_start_loc=torch.tensor([0, n], **i64),
            kv_lens=torch.tensor([n], **i64),
            block_tables=torch.arange(nblocks, **i64).unsqueeze(0),
            block_size=block_size,
            window_masks=[None],
        )


_DOUBLED_QSL: dict = {}


def _doubled_qsl(like: torch.Tensor) -> torch.Tensor:
    """[0, 1, 2] of ``like``'s dtype and device, made once (read only: an arange per step is 3 ops)."""
    key = (like.dtype, like.device)
    qsl = _DOUBLED_QSL.get(key)
    if qsl is None:
        qsl = _DOUBLED_QSL[key] = torch.arange(3, dtype=like.dtype, device=like.device)
    return qsl


def _twice(t: torch.Tensor) -> torch.Tensor:
    """t [1, ...] as [2, ...], both rows the one row (stride 0): ``t.expand(2, ...)`` in one op instead of two."""
    return t.as_strided((2, *t.shape[1:]), (0, *t.stride()[1:]))
