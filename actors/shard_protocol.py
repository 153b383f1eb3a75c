"""The command a tensor-parallel verifier's rank 0 broadcasts to the other ranks each step.

A command travels as two int64 tensors: a fixed header ``[HEADER_LEN]`` and a payload whose length
follows from the header, so every rank can receive it with two ``dist.broadcast`` calls.

Header: ``[op, N tokens, B seqs, W table width, M logit rows, E mask elements, num_layers (-1 = all),
C slot copies]``. Payload, in order: input_ids[N], positions[N], slot_mapping[N],
query_start_loc[B+1], kv_lens[B], block_tables[B*W], mask widths[B] (0 = causal), masks[E] (0/1,
row-major per sequence), logit rows[M], copy src[C], copy dst[C].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from actors.model.batch import ForwardBatch
from actors.verifier import SeqChunk

OP_NOOP, OP_FORWARD, OP_STOP = 0, 1, 2
HEADER_LEN = 8


@dataclass(slots=True)
class StepCommand:
    """What every rank runs for one OP_FORWARD: slot copies first, then the forward (if N > 0)."""

    batch: ForwardBatch | None  # None when the command only copies slots
    rows: torch.Tensor  # [M] int64 flat token indices needing logits
    num_layers: int | None
    copy_src: torch.Tensor  # [C] int64
    copy_dst: torch.Tensor  # [C] int64


def header(op: int) -> torch.Tensor:
    """A payload-less header (NOOP heartbeat, STOP) -> [HEADER_LEN] int64."""
    h = torch.zeros(HEADER_LEN, dtype=torch.int64)
    h[0] = op
    return h


def payload_len(h: torch.Tensor) -> int:
    """h: [HEADER_LEN] int64 -> number of payload elements that follow it."""
    _, n, b, w, m, e, _, c = h.tolist()
    return 3 * n + (b + 1 if b else 0) + b + b * w + b + e + m + 2 * c


def pack_forward(chunks: list[SeqChunk], rows: list[int], num_layers: int | None,
                 copy_src: list[int] = (), copy_dst: list[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode one step -> (header [HEADER_LEN] int64, payload [P] int64)."""
    if len(copy_src) != len(copy_dst):
        raise ValueError(f"copy_src has {len(copy_src)} slots but copy_dst has {len(copy_dst)}")
    ids, pos, slots, qsl, widths, masks = [], [], [], [0], [], []
    for c in chunks:
        q = len(c.token_ids)
        if not (q == len(c.positions) == len(c.slots)):
            raise ValueError(f"chunk has {q} tokens, {len(c.positions)} positions, {len(c.slots)} slots")
        ids += c.token_ids
        pos += c.positions
        slots += c.slots
        qsl.append(qsl[-1] + q)
        if c.window_mask is None:
            widths.append(0)
        else:
            if c.window_mask.shape[0] != q:
                raise ValueError(f"window_mask {tuple(c.window_mask.shape)} does not have {q} rows")
            widths.append(int(c.window_mask.shape[1]))
            masks += c.window_mask.to(torch.int64).flatten().tolist()
    width = max((len(c.block_table) for c in chunks), default=0)
    tables = [x for c in chunks for x in c.block_table + [0] * (width - len(c.block_table))]
    kv_lens = [c.kv_len for c in chunks]
    n, b = len(ids), len(chunks)
    h = torch.tensor([OP_FORWARD, n, b, width, len(rows), len(masks), -1 if num_layers is None else num_layers,
                      len(copy_src)], dtype=torch.int64)
    body = ids + pos + slots + (qsl if b else []) + kv_lens + tables + widths + masks + list(rows)
    body += list(copy_src) + list(copy_dst)
    return h, torch.tensor(body, dtype=torch.int64)


def unpack_forward(h: torch.Tensor, payload: torch.Tensor, block_size: int,
                   device: torch.device) -> StepCommand:
    """h: [HEADER_LEN] int64, payload: [P] int64 (any device) -> the step, tensors on ``device``."""
    op, n, b, w, m, e, layers, c = h.tolist()
    if op != OP_FORWARD:
        raise ValueError(f"header op {op} is not OP_FORWARD ({OP_FORWARD})")
    if payload.numel() != payload_len(h):
        raise ValueError(f"payload has {payload.numel()} elements, header says {payload_len(h)}")
    payload = payload.to(device)
    sizes = [n, n, n, b + 1 if b else 0, b, b * w, b, e, m, c, c]
    ids, pos, slots, qsl, kv_lens, tables, widths, masks, rows, src, dst = payload.split(sizes)
    batch = None
    if b:
        batch = ForwardBatch(
            input_ids=ids, positions=pos, slot_mapping=slots, query_start_loc=qsl, kv_lens=kv_lens,
            block_tables=tables.view(b, w), block_size=block_size,
            window_masks=_window_masks(qsl.tolist(), widths.tolist(), masks.bool()),
        )
    return StepCommand(batch, rows, None if layers < 0 else layers, src, dst)


def _window_masks(qsl: list[int], widths: list[int], flat: torch.Tensor) -> list[torch.Tensor | None]:
    """flat: [E] bool, the concatenated row-major masks of the sequences with a width > 0."""
    out, start = [], 0
    for i, w in enumerate(widths):
        if w == 0:
            out.append(None)
            continue
        q = qsl[i + 1] - qsl[i]
        out.append(flat[start:start + q * w].view(q, w))
        start += q * w
    return out


def check_command(cmd: StepCommand, num_blocks: int, block_size: int, num_layers: int) -> None:
    """ValueError for a step that would index outside the KV cache or the batch (checked on rank 0
    before broadcasting, so bad input never reaches the other ranks or changes any state)."""
    cap = num_blocks * block_size
    checks = [("copy src slot", cmd.copy_src, cap), ("copy dst slot", cmd.copy_dst, cap)]
    n = 0
    if cmd.batch is not None:
        b = cmd.batch
        n = b.num_tokens
        checks += [("slot", b.slot_mapping, cap), ("block id", b.block_tables, num_blocks)]
    checks.append(("logit row", cmd.rows, n))
    for what, t, limit in checks:
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= limit):
            bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
            raise ValueError(f"{what} {bad} is outside [0, {limit})")
    if cmd.num_layers is not None and not 0 <= cmd.num_layers <= num_layers:
        raise ValueError(f"num_layers={cmd.num_layers} is out of range; use 0..{num_layers}")
