"""Disk KV pool: the file behind the disk tier, its lock, and the copies into and out of it.

One preallocated file ``specray-kv.blocks`` in the tier's directory holds ``num_slots`` block slots,
mapped into memory (``torch.from_file``, shared): slot s is one contiguous [layers, 2, block elems]
record, so a SPILL writes and a DISK_LOAD reads one stretch per block. The OS page cache makes
recently spilled blocks cheap to read back; the file is scratch space for this engine's life only
(the bookkeeping that gives its bytes meaning lives in memory), and is removed on close.

A directory serves one engine at a time: ``specray-kv.lock`` is held with ``fcntl.flock`` (released
by the kernel if the process dies, so a crash leaves no stale lock behind).
"""
from __future__ import annotations

import errno
import fcntl
import os
import weakref
from dataclasses import dataclass

import torch

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each [blocks, bs, kvh, d]
BLOCKS_FILE = "specray-kv.blocks"
LOCK_FILE = "specray-kv.lock"


@dataclass(slots=True, frozen=True)
class DiskTierSpec:
    """Where the disk tier lives and how many blocks it holds."""

    directory: str
    num_blocks: int


class DiskKVPool:
    def __init__(self, spec: DiskTierSpec, like: KVCaches):
        """``spec.num_blocks`` slots shaped like one block of ``like`` (per layer (k, v), each
        [blocks, bs, kvh, d]) in a file under ``spec.directory``, which this pool locks."""
        if spec.num_blocks < 1:
            raise ValueError(f"disk tier num_blocks must be >= 1, got {spec.num_blocks!r}")
        k0 = like[0][0]
        self.directory, self.num_blocks = spec.directory, spec.num_blocks
        self.block_elems = k0[0].numel()  # of one layer's K (or V) in one block
        self.block_bytes = 2 * len(like) * self.block_elems * k0.element_size()
        self.path = os.path.join(spec.directory, BLOCKS_FILE)
        self._lock_fd = lock_dir(spec.directory)
        self._finalizer = weakref.finalize(self, _release, self._lock_fd, self.path)
        try:
            _preallocate(self.path, spec.num_blocks * self.block_bytes, spec.directory)
            flat = torch.from_file(self.path, shared=True, size=spec.num_blocks * self.block_bytes // k0.element_size(),
                                   dtype=k0.dtype)
        except BaseException:
            self.close()
            raise
        self.slots = flat.view(spec.num_blocks, len(like), 2, self.block_elems)  # [slots, layers, K/V, elems]

    def spill(self, host_caches: KVCaches, host_slots: list[int], disk_slots: list[int]) -> None:
        """Write host slots ``host_slots`` into disk slots ``disk_slots`` (distinct, same length)."""
        h = torch.tensor(host_slots, dtype=torch.int64)
        n = len(host_slots)
        blocks = torch.stack([torch.stack((k.index_select(0, h).reshape(n, -1), v.index_select(0, h).reshape(n, -1)), 1)
                              for k, v in host_caches], 1)  # [n, layers, 2, elems]
        self.slots.index_copy_(0, torch.tensor(disk_slots, dtype=torch.int64), blocks)

    def load(self, device_caches: KVCaches, disk_slots: list[int], device_blocks: list[int]) -> None:
        """Read disk slots ``disk_slots`` into device blocks ``device_blocks`` (distinct, same length)."""
        blocks = self.slots.index_select(0, torch.tensor(disk_slots, dtype=torch.int64))  # [n, layers, 2, elems]
        dev = device_caches[0][0].device
        d = torch.tensor(device_blocks, dtype=torch.int64, device=dev)
        blocks = blocks.to(dev)
        for layer, (k, v) in enumerate(device_caches):
            shape = (len(device_blocks),) + tuple(k.shape[1:])
            k.index_copy_(0, d, blocks[:, layer, 0].reshape(shape))
            v.index_copy_(0, d, blocks[:, layer, 1].reshape(shape))

    def close(self) -> None:
        """Unmap and remove the file and release the directory (idempotent)."""
        self.slots = None
        self._finalizer()


def lock_dir(directory: str) -> int:
    """Create ``directory`` if needed and hold its lock file; ValueError naming it when it cannot be
    written or another engine holds it."""
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ValueError(f"KV disk dir {directory!r} is not writable ({e.strerror or e}): pass a directory this "
                         "process can create and write (--kv-disk-dir / kv_offload.disk_dir)") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise ValueError(f"KV disk dir {directory!r} is in use by another engine (pid {holder}): give each "
                         "engine (each replica) a directory of its own") from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _preallocate(path: str, size: int, directory: str) -> None:
    """Reserve ``size`` bytes for ``path`` now, so a full disk fails here and not mid-step."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno != errno.EOPNOTSUPP:  # e.g. ENOSPC
            raise ValueError(f"KV disk dir {directory!r}: cannot reserve {size / 2**30:.3g} GiB ({e.strerror}): "
                             "free space there or lower --kv-disk-gb") from e
        os.ftruncate(fd, size)  # a file system without fallocate: a sparse file
    finally:
        os.close(fd)


def _release(lock_fd: int, path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(lock_fd)  # closing the descriptor releases the flock
