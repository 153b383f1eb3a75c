"""The verifier: the target model with its paged KV cache, one forward per step for the whole
batch (prefill chunks, decode tokens and token-tree nodes together).

In-process this is the whole model (TP=1); the Ray cluster runs one ``Verifier`` per TP shard.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from actors.kv_disk_pool import DiskTierSpec
from actors.kv_host_pool import HostKVPool
from actors.kv_host_tier import BlockCopy
from actors.model.attention import allocate_kv_cache, copy_kv_slots
from actors.model.batch import ForwardBatch, HostMeta, rows_of, to_device
from actors.model.weight_offload import offload_weights
from kernels import cpu_native


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
    if len(chunks) == 1:  # one sequence (every draft-head step at c=1, a lone decode): its lists as they are
        c = chunks[0]
        ids, pos, slots, qsl, tables, width = c.token_ids, c.positions, c.slots, [0, len(c.token_ids)], c.block_table, \
            len(c.block_table)
    else:
        ids, pos, slots, qsl = [], [], [], [0]
        for c in chunks:
            ids += c.token_ids
            pos += c.positions
            slots += c.slots
            qsl.append(qsl[-1] + len(c.token_ids))
        width = max(len(c.block_table) for c in chunks)
        tables = []
        for c in chunks:
            tables += c.block_table
            tables += [0] * (width - len(c.block_table))
    kv_lens = [c.kv_len for c in chunks]
    host_tables = np.array(tables, dtype=np.int64).reshape(len(chunks), width)
    device = torch.device(device)
    on_host = device.type == "cpu"  # to_device's check, once per batch rather than once per tensor
    return ForwardBatch(
        input_ids=to_device(ids, device, on_host),
        positions=to_device(pos, device, on_host),
        slot_mapping=to_device(slots, device, on_host),
        query_start_loc=to_device(qsl, device, on_host),
        kv_lens=to_device(kv_lens, device, on_host),
        block_tables=to_device(tables, device, on_host).view(len(chunks), width),
        block_size=block_size,
        window_masks=[None if c.window_mask is None else c.window_mask if on_host and c.window_mask.device.type == "cpu"
                      else c.window_mask.to(device, non_blocking=True) for c in chunks],
        host=HostMeta(qsl, kv_lens, host_tables),
    )


def graphs_usable(model: torch.nn.Module, device: torch.device) -> str | None:
    """Why this model cannot run as CUDA graphs on ``device`` (None: it can). Graphs capture the
    Triton backend with its fused ops: the torch reference reads batch lengths on the host."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type}"
    attn = next((m for m in model.modules() if hasattr(m, "rope_write_kv")), None)
    if attn is None or attn.rope_write_kv is None:
        return "CUDA graphs need the triton attention backend with fused ops (--attention-backend auto|triton)"
    return None


class Verifier:
    """Target model + its KV cache. ``forward_logits`` runs one forward and returns only the
    logits rows that verification and sampling need (never the whole vocabulary for every token).
    On CUDA the decode and verify steps replay CUDA graphs (actors/model/graph_runner.py) unless
    ``enforce_eager``."""

    def __init__(self, model: torch.nn.Module, num_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype, num_host_blocks: int = 0,
                 enforce_eager: bool = False, max_num_seqs: int = 64, max_model_len: int | None = None,
                 kv_disk: DiskTierSpec | None = None, offload_layers: int = 0):
        """num_host_blocks > 0: a host KV tier of that many blocks (actors/kv_host_pool.py), with
        ``kv_disk`` a disk tier below it (actors/kv_disk_pool.py);
        max_num_seqs / max_model_len size the graphs' static inputs (default: the whole KV cache);
        offload_layers > 0: the last that many decoder layers' weights live in host memory and
        stream in per forward (actors/model/weight_offload.py; the model may be staged on the host,
        the rest moves to ``device``; no CUDA graphs then)."""
        cfg = model.config
        self.model = model
        self.weight_offload = offload_weights(model, offload_layers, device)
        self.num_layers = cfg.num_layers
        self.block_size = block_size
        self.device = device
        self.num_blocks = num_blocks
        self.kv_caches = allocate_kv_cache(
            cfg.num_layers, num_blocks, block_size, model.num_kv_heads_per_rank, cfg.head_dim, dtype, device
        )
        if kv_disk is not None and not num_host_blocks:
            raise ValueError(f"a disk KV tier ({kv_disk.directory!r}) needs a host tier: num_host_blocks >= 1")
        self.host_pool = HostKVPool(self.kv_caches, num_host_blocks, kv_disk) if num_host_blocks else None
        # accepted tree nodes' K/V moved by one native op (its K and V lists made once), else the torch copy
        self.native_kv_copies = (([k for k, _ in self.kv_caches], [v for _, v in self.kv_caches])
                                 if torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16)
                                 and cpu_native.load() else None)
        self.graphs = None
        if not enforce_eager and self.weight_offload is None and graphs_usable(model, torch.device(device)) is None:
            from actors.model.graph_runner import CudaGraphRunner

            self.graphs = CudaGraphRunner(model, self.kv_caches, block_size, max_num_seqs,
                                          min(max_model_len or num_blocks * block_size, num_blocks * block_size))

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
        n = sum(len(c.token_ids) for c in chunks)
        hidden = self.graphs.run(chunks) if self.graphs is not None and num_layers is None else None
        if hidden is None:
            batch = build_forward_batch(chunks, self.block_size, self.device)
            hidden = self.model(batch, self.kv_caches, num_layers=num_layers)  # [N, hidden]
        else:  # a graph's static output [N_pad, hidden]: this step's rows, kept past the next replay
            hidden = hidden[:n].clone()
        logits = self.model.compute_logits(rows_of(hidden, logit_rows))
        return (logits if logits.dtype is torch.float32 else logits.float()), hidden  # .float() is an op

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Move K/V of accepted tree nodes to their sequence's logical positions (all layers)."""
        if not src:
            return
        src_t, dst_t = to_device(src, self.device), to_device(dst, self.device)
        if self.native_kv_copies is not None:  # one op, not two per cache (120 for the default model)
            cpu_native.copy_kv_slots(*self.native_kv_copies, src_t, dst_t)
        else:
            copy_kv_slots(self.kv_caches, src_t, dst_t)

    def apply_block_copies(self, copies: list[BlockCopy]) -> None:
        """Execute the allocator's tier moves (evict device -> host, load host -> device, spill host
        -> disk, load disk -> device), in order, before the step's forward."""
        if not copies:
            return
        if self.host_pool is None:
            raise RuntimeError(f"{len(copies)} KV tier copies but this verifier has no host tier")
        self.host_pool.execute(self.kv_caches, copies)

    def kv_copy_stats(self) -> dict[str, tuple[int, float]]:
        """Bytes and seconds copied between KV tiers, per direction (empty without tiers)."""
        pool = self.host_pool
        return {d: (int(b), s) for d, (b, s) in pool.moved.items()} if pool is not None else {}

    def close_kv_tiers(self) -> None:
        """Release the disk tier's file and directory lock (engine shutdown)."""
        if self.host_pool is not None:
            self.host_pool.close()

    def warmup(self) -> None:
        n = min(4, self.block_size * self.num_blocks)
        batch = ForwardBatch.make_dummy(n, self.block_size, self.device)
        with torch.inference_mode():
            self.model.compute_logits(self.model(batch, self.kv_caches)[-1:])
