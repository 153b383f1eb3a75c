"""Host KV pool: the tensors of the host tier and the copies between it and the device KV cache.

The allocator (actors/kv_allocator.py, actors/kv_host_tier.py) decides the moves; this executes
them, in their order, before the step's forward: an EVICT copies a device block out before the
block is reused, a LOAD copies a host slot in before its K/V are read. Consecutive moves of one kind
touching distinct blocks and slots run as one gather/scatter per layer and K/V.

Slice 1: synchronous copies (on CUDA from pinned host memory, no side stream yet).
"""
from __future__ import annotations

import torch

from actors.kv_host_tier import EVICT, BlockCopy

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each [blocks, bs, kvh, d]


class HostKVPool:
    def __init__(self, device_caches: KVCaches, num_host_blocks: int):
        """Host twins of ``device_caches``: per layer (k, v), each [num_host_blocks, bs, kvh, d]."""
        if num_host_blocks < 1:
            raise ValueError(f"num_host_blocks must be >= 1, got {num_host_blocks!r}")
        k0 = device_caches[0][0]
        shape = (num_host_blocks,) + tuple(k0.shape[1:])
        pin = k0.device.type == "cuda"
        self.num_blocks = num_host_blocks
        self.caches: KVCaches = [
            (torch.zeros(shape, dtype=k0.dtype, pin_memory=pin), torch.zeros(shape, dtype=k0.dtype, pin_memory=pin))
            for _ in device_caches]
        self.block_bytes = 2 * len(device_caches) * k0[0].numel() * k0.element_size()
        self.bytes_out = 0  # device -> host
        self.bytes_in = 0  # host -> device

    def execute(self, device_caches: KVCaches, copies: list[BlockCopy]) -> None:
        """Run ``copies`` in order against ``device_caches``."""
        for kind, dev, host in _runs(copies):
            d = torch.tensor(dev, dtype=torch.int64, device=device_caches[0][0].device)
            h = torch.tensor(host, dtype=torch.int64)
            for dev_kv, host_kv in zip(device_caches, self.caches):
                for dc, hc in zip(dev_kv, host_kv):
                    if kind == EVICT:
                        hc.index_copy_(0, h, dc.index_select(0, d).to("cpu"))
                    else:
                        dc.index_copy_(0, d, hc.index_select(0, h).to(dc.device, non_blocking=True))
            if kind == EVICT:
                self.bytes_out += len(dev) * self.block_bytes
            else:
                self.bytes_in += len(dev) * self.block_bytes


def _runs(copies: list[BlockCopy]) -> list[tuple[str, list[int], list[int]]]:
    """Split ``copies`` into maximal runs of one kind whose device blocks and host slots are all
    distinct (so a run can be one batched copy without reordering dependent moves)."""
    runs: list[tuple[str, list[int], list[int]]] = []
    for c in copies:
        if runs:
            kind, dev, host = runs[-1]
            if kind == c.kind and c.device_block not in dev and c.host_slot not in host:
                dev.append(c.device_block)
                host.append(c.host_slot)
                continue
        runs.append((c.kind, [c.device_block], [c.host_slot]))
    return runs
