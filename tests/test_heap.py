"""cluster/heap.py: the trimmer trims only after work and its interval, gives freed heap pages
back to the OS (glibc), and the engine's step loop runs it."""
from __future__ import annotations

import asyncio
import ctypes

import pytest

from actors.sampling_params import SamplingParams
from cluster import heap
from cluster.async_engine import AsyncLLMEngine
from cluster.heap import HeapTrimmer
from tests.tiny import random_prompts, tiny_engine

needs_trim = pytest.mark.skipif(not heap.AVAILABLE, reason="the C library has no malloc_trim (not glibc)")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


@needs_trim
def test_trims_after_work_and_the_interval_only():
    clock = _Clock()
    h = HeapTrimmer(interval_s=10, clock=clock)
    clock.t += 60
    assert not h.maybe_trim()  # no work since the start
    h = HeapTrimmer(interval_s=10, clock=clock)
    h.note_work()
    clock.t += 5
    assert not h.maybe_trim()  # work, but the interval has not passed
    clock.t += 6
    assert h.maybe_trim() and h.num_trims == 1 and not h.dirty
    clock.t += 60
    assert not h.maybe_trim()  # no work since the last trim
    h.note_work()
    assert h.maybe_trim() and h.num_trims == 2


@needs_trim
def test_trim_gives_freed_heap_pages_back():
    """Chunks below the mmap threshold live in the heap; one still in use above them pins its top,
    so freeing the rest shrinks nothing until trimmed."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 3000  # ~190 MB
    chunks = [libc.malloc(size) for _ in range(count)]
    pin = libc.malloc(size)
    try:
        for p in chunks:
            ctypes.memset(p, 1, size)
        for p in chunks:
            libc.free(p)
        before = _rss_mb()
        assert heap.trim()
        assert before - _rss_mb() > 100, (before, _rss_mb())
    finally:
        libc.free(pin)


def test_step_loop_trims_between_steps(tiny_target_dir):
    aeng = AsyncLLMEngine(tiny_engine(tiny_target_dir), trim_interval_s=0.0)

    async def main():
        async for _ in aeng.generate(random_prompts(1, seed=5)[0], SamplingParams(max_tokens=8, ignore_eos=True)):
            pass
        for _ in range(200):  # the loop trims once more when it finds nothing left to run
            if aeng.heap.num_trims and not aeng.heap.dirty:
                return
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
        assert aeng.heap.num_trims >= (1 if heap.AVAILABLE else 0) and not (heap.AVAILABLE and aeng.heap.dirty)
    finally:
        aeng.shutdown()
