"""The EAGLE head's KV cache (paged, one pool for every sequence, read through the target's
attention backends), the head's forward over it, and that forward as CUDA graphs.

Each sequence's head entries are a list of cache indices 0, 1, 2, ... (entry i is the head's K/V of
RoPE position ``base + i``), stored through a block table of this pool exactly as the target's KV
is stored through its own: flat slot ``block * block_size + i % block_size``. So one head forward
for the whole batch is one ``ForwardBatch`` (actors/model/batch.py) and one call of whichever
paged attention the target runs (the torch reference on CPU, the Triton kernel on CUDA), not one
attention call per sequence, and the same padded static inputs that CUDA graphs replay for the
target can hold the head's steps.

Speculative entries (draft depths, tree nodes) go after a sequence's committed entries and are
simply overwritten by the next catch-up: only ``fed`` (the committed count) is state. The pool
grows by doubling when a reservation does not fit (``growable``; a CUDA-graph caller fixes it).

On CUDA (``HeadGraphRunner``) each head step (a catch-up, a draft depth, a tree level) is one
replay of the graph captured for its bucket: the target's ``GraphRunner`` with the head's forward,
its static metadata filled from the same SeqChunks, plus a static feature buffer. The pool is then
fixed: the graphs hold its tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from actors.model.attention import allocate_kv_cache
from actors.model.attention_backends import native_meta
from actors.model.batch import ForwardBatch, host_int64, is_every_row, rows_of
from actors.model.graph_runner import MAX_GRAPH_TOKENS, GraphRunner
from actors.model.llama import cos_sin_rows
from kernels import cpu_native


class HeadKVPool:
    """k, v [num_blocks, block_size, num_kv_heads, head_dim] and per-sequence block tables."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 block_size: int = 16, num_blocks: int = 64, growable: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"head KV pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.kv_shape, self.dtype, self.device = (num_kv_heads, head_dim), dtype, torch.device(device)
        self.block_size, self.growable = block_size, growable
        self.k, self.v = allocate_kv_cache(1, num_blocks, block_size, num_kv_heads, head_dim, dtype, device)[0]
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low blocks first
        self.tables: dict[int, list[int]] = {}  # seq id -> its blocks, in cache-index order

    @property
    def num_blocks(self) -> int:
        return self.k.shape[0]

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def reserve(self, seq_id: int, entries: int) -> list[int]:
        """Blocks enough for cache indices [0, entries) of ``seq_id``; returns its block table."""
        table = self.tables.setdefault(seq_id, [])
        need = -(-entries // self.block_size) - len(table)
        if need > len(self.free):
            self._grow(need - len(self.free))
        for _ in range(max(need, 0)):
            table.append(self.free.pop())
        return table

    def slots(self, seq_id: int, start: int, n: int) -> list[int]:
        """Flat slots of cache indices [start, start + n) (already reserved)."""
        table, bs = self.tables[seq_id], self.block_size
        return [table[i // bs] * bs + i % bs for i in range(start, start + n)]

    def release(self, seq_id: int) -> None:
        self.free += reversed(self.tables.pop(seq_id, []))

    def _grow(self, at_least: int) -> None:
        if not self.growable:
            raise RuntimeError(f"head KV pool full: {self.num_blocks} blocks of {self.block_size} in use, "
                               f"{at_least} more needed (a fixed pool is sized for max_num_seqs x max_model_len)")
        old = self.num_blocks
        new = max(2 * old, old + at_least)
        k, v = allocate_kv_cache(1, new, self.block_size, *self.kv_shape, self.dtype, self.device)[0]
        k[:old], v[:old] = self.k, self.v
        self.k, self.v = k, v
        self.free = list(range(new - 1, old - 1, -1)) + self.free


@dataclass(slots=True)
class HeadScores:
    """What the head says of some rows (R): logits [R, Vd] fp32 over its draft vocabulary, and per row
    its ``k`` likeliest tokens (the target's ids) with their log-probabilities, best first."""

    logits: torch.Tensor
    ids: list[list[int]]
    logprobs: list[list[float]]

    def take(self, rows: list[int]) -> "HeadScores":
        if is_every_row(rows, self.logits.shape[0]):
            return self
        return HeadScores(rows_of(self.logits, rows), [self.ids[i] for i in rows], [self.logprobs[i] for i in rows])


def scored_rows(head, out: torch.Tensor, score: list[int], k: int) -> tuple[torch.Tensor, HeadScores]:
    """out [N, H]: a step's f̂ -> (its rows ``score`` [R, H] (ascending row indices; all of them: out
    itself), the head's scores of them)."""
    picked = rows_of(out, score)
    return picked, head_scores(head, picked, k)


def head_scores(head, feats: torch.Tensor, k: int) -> HeadScores:
    """feats [R, H] -> the head's scores of each row: ``log_softmax(logits).topk(k)`` read back once
    (one sync on CUDA, not one per row)."""
    logits = head.logits(feats).float()  # [R, Vd]
    top = torch.log_softmax(logits, -1).topk(k)
    both = torch.cat((head.draft_vocab[top.indices].to(top.values.dtype), top.values)).tolist()
    r = logits.shape[0]
    return HeadScores(logits, [[int(t) for t in row] for row in both[:r]], both[r:])


def head_step(head, batch: ForwardBatch, feats: torch.Tensor, pool: HeadKVPool, attend, score: list[int],
              k: int) -> tuple[torch.Tensor, HeadScores]:
    """The head's step over ``batch`` (``head_forward``), then its scores of the rows ``score``
    (ascending row indices: the ones drafted from next) -> (f̂ of those rows [R, H], their
    HeadScores). With the native CPU kernels
    this is one op (``cpu_native.head_step``: the same kernels in the same order)."""
    if head.native_layer:
        return native_head_step(head, batch, feats, pool, score, k)
    return scored_rows(head, head_forward(head, batch, feats, pool, attend), score, k)


def head_forward(head, batch: ForwardBatch, feats: torch.Tensor, pool: HeadKVPool, attend) -> torch.Tensor:
    """The head's step over ``batch`` (its input_ids are the tokens x_{t+1}, positions the RoPE
    positions, slots in ``pool``): feats [N, H] -> f̂ [N, H]. Writes the step's K/V first."""
    h = head.entry(batch.input_ids, feats)
    q = head.qkv_rope_write(h, batch.positions, batch.slot_mapping, pool.k, pool.v)  # [N, nh, d]
    attn = attend(q, pool.k, pool.v, batch, head.cfg.head_dim ** -0.5)
    return head.finish(h, attn.reshape(attn.shape[0], -1))


def native_head_step(head, batch: ForwardBatch, feats: torch.Tensor, pool: HeadKVPool, score: list[int],
                     k: int) -> tuple[torch.Tensor, HeadScores]:
    """``head_step`` as one ``cpu_native.head_step`` op (entries, the decoder layer, the output norm,
    the LM rows and their top-k): ~40 fewer Python-side ops and calls per step. Writes the step's K/V."""
    c, w = head.cfg, head.native_weights()
    cos, sin = cos_sin_rows(head.rotary.halves_tables(batch.positions))  # cos_sin's values, one lookup, no max()
    qsl, kv_lens, tables, windows = native_meta(batch)
    picked, logits, ids, logprobs = cpu_native.head_step(
        batch.input_ids, feats, head.embed, w.fc, head.fc.bias, w.layer, pool.k, pool.v, cos, sin, batch.slot_mapping,
        qsl, kv_lens, tables, windows, c.num_heads, c.num_kv_heads, c.rms_norm_eps, c.head_dim ** -0.5, head.out_norm,
        w.lm, head.draft_vocab, host_int64(score), k)
    return picked, HeadScores(logits, ids.tolist(), logprobs.tolist())


class HeadGraphRunner(GraphRunner):
    """The head's step and its scores as CUDA graphs: ``run(chunks, feats)`` -> the static (f̂
    [N_pad, H], logits [N_pad, Vd], packed top-``top_k`` [N_pad, 2 top_k]: ids then log-probs), or
    None; ``scored`` reads the rows a step drafts from. Scoring inside the graph saves about eight
    launches and host ops per head step outside it (the LM rows, log-softmax, top-k, the vocabulary
    map, the packing: the GPU run of 2026-11-30 counted 13 launch calls per step)."""

    def __init__(self, head, pool: HeadKVPool, attend, max_num_seqs: int, max_entries: int,
                 capture: bool = True, top_k: int = 1):
        """max_entries: the most cache indices a sequence uses (its context plus the draft's nodes);
        top_k: the candidates per row the graphs keep (a step that wants more scores eagerly)."""
        if pool.growable:
            raise ValueError("HeadGraphRunner needs a fixed HeadKVPool (growable=False): graphs hold its tensors")
        c = head.cfg
        self.top_k = top_k
        self.feats = torch.zeros(MAX_GRAPH_TOKENS, c.hidden_size, dtype=pool.dtype, device=pool.device)  # [T, H]
        self._feats_in: torch.Tensor | None = None

        def step(batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            out = head_forward(head, batch, self.feats[: batch.num_tokens], pool, attend)  # [N, H]
            logits = head.logits(out).float()  # [N, Vd]
            top = torch.log_softmax(logits, -1).topk(top_k)
            return out, logits, torch.cat((head.draft_vocab[top.indices].to(top.values.dtype), top.values), 1)

        super().__init__(step, pool.device, c.num_kv_heads, pool.block_size, max_num_seqs, max_entries,
                         capture=capture)

    def scored(self, out: tuple, n: int, score: list[int], k: int) -> tuple[torch.Tensor, HeadScores]:
        """``run``'s static output for a step of ``n`` tokens -> (f̂ of the rows ``score`` [R, H], their
        HeadScores with ``k`` <= top_k candidates): copies (the next replay overwrites the static
        buffers) and one read-back of the packed top-k."""
        feats, logits, packed = out
        picked, logits = rows_of(feats[:n], score).clone(), rows_of(logits[:n], score).clone()
        rows = packed[:n].tolist()  # [[ids..., log-probs...]]: the step's one sync
        kk = self.top_k
        return picked, HeadScores(logits, [[int(t) for t in rows[i][:k]] for i in score],
                                  [rows[i][kk: kk + k] for i in score])

    def run(self, chunks, feats: torch.Tensor) -> torch.Tensor | None:  # feats [N, H]
        self._feats_in = feats
        try:
            return super().run(chunks)
        finally:
            self._feats_in = None

    def before_replay(self, num_tokens: int) -> None:
        self.feats[:num_tokens].copy_(self._feats_in)
