"""Helpers for the model tests: building paged ForwardBatches by hand and HF reference logits."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from actors.model.batch import ForwardBatch


@dataclass
class Chunk:
    """One sequence's part of a forward: its new tokens, written at logical key positions start.."""

    tokens: list[int]
    start: int  # logical key position of the first new token (= context length before this chunk)
    table: list[int]  # the sequence's block table
    positions: list[int] | None = None  # RoPE positions; default start, start+1, ...
    window: torch.Tensor | None = None  # [q, w] bool, None = causal


def slot_of(table: list[int], pos: int, block_size: int) -> int:
    return table[pos // block_size] * block_size + pos % block_size


def make_batch(chunks: list[Chunk], block_size: int) -> ForwardBatch:
    ids, positions, slots, qsl, kv_lens = [], [], [], [0], []
    for c in chunks:
        q = len(c.tokens)
        ids += c.tokens
        positions += c.positions if c.positions is not None else list(range(c.start, c.start + q))
        slots += [slot_of(c.table, c.start + i, block_size) for i in range(q)]
        qsl.append(qsl[-1] + q)
        kv_lens.append(c.start + q)
    width = max(len(c.table) for c in chunks)
    tables = [c.table + [0] * (width - len(c.table)) for c in chunks]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(input_ids=t(ids), positions=t(positions), slot_mapping=t(slots), query_start_loc=t(qsl),
                        kv_lens=t(kv_lens), block_tables=t(tables), block_size=block_size,
                        window_masks=[c.window for c in chunks])


def random_tables(num_seqs: int, blocks_per_seq: int, num_blocks: int, seed: int = 0) -> list[list[int]]:
    """Disjoint, shuffled (non-contiguous) block tables drawn from blocks 1..num_blocks-1."""
    perm = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    assert num_seqs * blocks_per_seq <= len(perm)
    return [perm[i * blocks_per_seq:(i + 1) * blocks_per_seq] for i in range(num_seqs)]


@functools.lru_cache(maxsize=16)
def hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                attn_implementation="eager").eval()


def hf_logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """Full-sequence logits [len(ids), V] from transformers."""
    with torch.no_grad():
        return hf_model(model_dir)(torch.tensor([ids])).logits[0].float()


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
