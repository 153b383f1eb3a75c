"""Host KV pool: the tensors of the host tier and the executor of a step's copy plan.

The allocator (actors/kv_allocator.py, actors/kv_tiers.py) decides the moves; this executes them,
in their order, before the step's forward: an EVICT copies a device block out before the block is
reused, a LOAD copies a host slot in before its K/V are read; with a disk tier
(actors/kv_disk_pool.py) a SPILL copies a host slot to disk before the slot is refilled and a
DISK_LOAD copies a disk slot into a device block. Consecutive moves of one kind touching distinct
sources and destinations run as one batched copy.

Slice 1: synchronous copies (on CUDA from pinned host memory, no side stream yet). ``moved`` counts
bytes and host seconds per direction (the copy-seconds metric; synchronous, so wall time is copy time).
"""
from __future__ import annotations

from time import perf_counter

import torch

from actors.kv_disk_pool import DiskKVPool, DiskTierSpec
from actors.kv_host_tier import DISK_LOAD, EVICT, LOAD, SPILL, BlockCopy

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each [blocks, bs, kvh, d]
DIRECTIONS = {EVICT: "device_to_host", LOAD: "host_to_device", SPILL: "host_to_disk", DISK_LOAD: "disk_to_device"}


class HostKVPool:
    def __init__(self, device_caches: KVCaches, num_host_blocks: int, disk: DiskTierSpec | None = None):
        """Host twins of ``device_caches``: per layer (k, v), each [num_host_blocks, bs, kvh, d];
        ``disk``: a disk tier below (its file is created and locked here)."""
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
        self.disk = DiskKVPool(disk, device_caches) if disk is not None else None
        self.moved: dict[str, list[float]] = {d: [0, 0.0] for d in DIRECTIONS.values()}  # [bytes, seconds]

    @property
    def bytes_out(self) -> int:  # device -> host
        return self.moved["device_to_host"][0]

    @property
    def bytes_in(self) -> int:  # host -> device
        return self.moved["host_to_device"][0]

    def execute(self, device_caches: KVCaches, copies: list[BlockCopy]) -> None:
        """Run ``copies`` in order against ``device_caches``."""
        for kind, src, dst in _runs(copies):
            t0 = perf_counter()
            if kind in (SPILL, DISK_LOAD) and self.disk is None:
                raise RuntimeError(f"a {kind} copy but this host pool has no disk tier")
            if kind == SPILL:
                self.disk.spill(self.caches, src, dst)
            elif kind == DISK_LOAD:
                self.disk.load(device_caches, src, dst)
            else:
                self._host_copy(kind, device_caches, src, dst)
            moved = self.moved[DIRECTIONS[kind]]
            moved[0] += len(src) * self.block_bytes
            moved[1] += perf_counter() - t0

    def _host_copy(self, kind: str, device_caches: KVCaches, src: list[int], dst: list[int]) -> None:
        dev, host = (src, dst) if kind == EVICT else (dst, src)
        d = torch.tensor(dev, dtype=torch.int64, device=device_caches[0][0].device)
        h = torch.tensor(host, dtype=torch.int64)
        for dev_kv, host_kv in zip(device_caches, self.caches):
            for dc, hc in zip(dev_kv, host_kv):
                if kind == EVICT:
                    hc.index_copy_(0, h, dc.index_select(0, d).to("cpu"))
                else:
                    dc.index_copy_(0, d, hc.index_select(0, h).to(dc.device, non_blocking=True))

    def close(self) -> None:
        """Release the disk tier's file and directory (if any)."""
        if self.disk is not None:
            self.disk.close()


def _runs(copies: list[BlockCopy]) -> list[tuple[str, list[int], list[int]]]:
    """Split ``copies`` into maximal runs of one kind whose sources and destinations are all
    distinct (so a run can be one batched copy without reordering dependent moves)."""
    runs: list[tuple[str, list[int], list[int]]] = []
    for c in copies:
        s, d = c.ends()
        if runs:
            kind, src, dst = runs[-1]
            if kind == c.kind and s not in src and d not in dst:
                src.append(s)
                dst.append(d)
                continue
        runs.append((c.kind, [s], [d]))
    return runs
