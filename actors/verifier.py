"""The verifier: the target model with its paged KV cache, one forward per step for the whole
batch (prefill chunks, decode tokens and token-tree nodes together).

In-process this is the whole model (TP=1); the Ray cluster runs one ``Verifier`` per TP shard.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from actors.kv_host_pool import HostKVPool
from actors.kv_host_tier import BlockCopy
from actors.model.attention import allocate_kv_cache, copy_kv_slots
from actors.model.batch import ForwardBatch


@dataclass(slots=True)
class SeqChunk:
    """The tokens one sequence contributes to a forward."""

    token_ids: list[int]
    positions: list[int]  # RoPE positions
    slots: list[int]  # flat KV slots written by these tokens
    kv_len: int  # key positions [0, kv_len) visible after the write
    block_table: list[int]
    window_mask: torch.Tensor | None = None  # [q, w] bool; None = causal over the new tokens


def build_forward_batch(chunks: list[SeqChunk], block_size: int, device: torch.device) -> ForwardBatch:
    """Flatten per-sequence chunks into one ForwardBatch (small host lists -> tensors once)."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    qsl = [0]
    for c in chunks:
        ids += c.token_ids
        pos += c.positions
        slots += c.slots
        qsl.append(qsl[-1] + len(c.token_ids))
    width = max(len(c.block_table) for c in chunks)
    tables = [c.block_table + [0] * (width - len(c.block_table)) for c in chunks]
    i64 = dict(dtype=torch.int64, device=device)
    return ForwardBatch(
        input_ids=torch.tensor(ids, **i64),
        positions=torch.tensor(pos, **i64),
        slot_mapping=torch.tensor(slots, **i64),
        query_start_loc=torch.tensor(qsl, **i64),
        kv_lens=torch.tensor([c.kv_len for c in chunks], **i64),
        block_tables=torch.tensor(tables, **i64),
        block_size=block_size,
        window_masks=[None if c.window_mask is None else c.window_mask.to(device) for c in chunks],
    )


class Verifier:
    """Target model + its KV cache. ``forward_logits`` runs one forward and returns only the
    logits rows that verification and sampling need (never the whole vocabulary for every token)."""

    def __init__(self, model: torch.nn.Module, num_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype, num_host_blocks: int = 0):
        """num_host_blocks > 0: a host KV tier of that many blocks (actors/kv_host_pool.py)."""
        cfg = model.config
        self.model = model
        self.num_layers = cfg.num_layers
        self.block_size = block_size
        self.device = device
        self.num_blocks = num_blocks
        self.kv_caches = allocate_kv_cache(
            cfg.num_layers, num_blocks, block_size, model.num_kv_heads_per_rank, cfg.head_dim, dtype, device
        )
        self.host_pool = HostKVPool(self.kv_caches, num_host_blocks) if num_host_blocks else None

    @torch.inference_mode()
    def forward_logits(self, chunks: list[SeqChunk], logit_rows: list[int],
                       num_layers: int | None = None) -> torch.Tensor:
        """chunks: one per sequence; logit_rows: flat token indices needing logits -> [M, V] fp32."""
        return self.forward_logits_and_hidden(chunks, logit_rows, num_layers)[0]

    @torch.inference_mode()
    def forward_logits_and_hidden(self, chunks: list[SeqChunk], logit_rows: list[int],
                                  num_layers: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As forward_logits, plus the final-normed hidden states of every token [N, hidden]:
        the features an EAGLE-style draft head reads (computed anyway, so they cost nothing)."""
        batch = build_forward_batch(chunks, self.block_size, self.device)
        hidden = self.model(batch, self.kv_caches, num_layers=num_layers)  # [N, hidden]
        rows = torch.tensor(logit_rows, dtype=torch.int64, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, rows)).float(), hidden

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Move K/V of accepted tree nodes to their sequence's logical positions (all layers)."""
        if not src:
            return
        i64 = dict(dtype=torch.int64, device=self.device)
        copy_kv_slots(self.kv_caches, torch.tensor(src, **i64), torch.tensor(dst, **i64))

    def apply_block_copies(self, copies: list[BlockCopy]) -> None:
        """Execute the allocator's tier moves (evict device -> host, load host -> device), in order,
        before the step's forward."""
        if not copies:
            return
        if self.host_pool is None:
            raise RuntimeError(f"{len(copies)} KV tier copies but this verifier has no host tier")
        self.host_pool.execute(self.kv_caches, copies)

    def warmup(self) -> None:
        n = min(4, self.block_size * self.num_blocks)
        batch = ForwardBatch.make_dummy(n, self.block_size, self.device)
        with torch.inference_mode():
            self.model.compute_logits(self.model(batch, self.kv_caches)[-1:])
