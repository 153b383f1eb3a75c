"""Python's cyclic garbage collector in a serving process: its pauses measured, and the loaded
model's objects moved out of its way.

A collection of generation 2 (a full one) walks every object the collector tracks, and while it
runs nothing else in the process does: every stream the replica is generating stalls. After the
model, its libraries, Ray and Serve are loaded a process tracks ~300k objects, and one full
collection took 237 ms on the project's 2-core CPU box (~40 decode steps of the default model).
Python starts one on its own once enough new objects have survived the younger generations.

``freeze_loaded()``, called where a process starts serving, collects once and moves every object
that survived into the permanent generation (``gc.freeze()``), which later collections skip: the
same full collection then took 0.3-1.5 ms. What the process allocates afterwards is collected as
before. It is called where a process serves for its lifetime: a Serve replica once its engine is
up (deployments/app.py), a verifier shard actor after its setup, a drafter worker actor after
loading; never where engines come and go in one process (tests, in-process CLI calls): frozen
objects that later become cyclic garbage are never freed.

``SPECRAY_GC_FREEZE=0`` in those processes' environment (a Serve config's runtime_env, or the shell
that starts ``specray serve``) turns the freeze off.

``PAUSES`` times every collection, by generation (``gc.callbacks``, installed by ``install()``);
``cluster.metrics`` exports it as the histogram ``specray:gc_pause_seconds{generation}``, and
``specray:gc_frozen_objects``: the objects in the permanent generation (0 until a freeze).
"""
from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterable
from time import perf_counter

from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric

log = logging.getLogger("specray.gc")

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)  # seconds
GENERATIONS = (0, 1, 2)


class PauseRecorder:
    """Counts and sums of the collector's pauses per generation, in ``BUCKETS`` (cumulative on export)."""

    def __init__(self) -> None:
        self.counts = {g: [0] * (len(BUCKETS) + 1) for g in GENERATIONS}  # the last: above every bucket
        self.sums = dict.fromkeys(GENERATIONS, 0.0)
        self._start: float | None = None

    def observe(self, generation: int, seconds: float) -> None:
        i = next((i for i, le in enumerate(BUCKETS) if seconds <= le), len(BUCKETS))
        self.counts[generation][i] += 1
        self.sums[generation] += seconds

    def _callback(self, phase: str, info: dict) -> None:
        # the collector runs under the GIL and never re-enters itself: a start is always followed by its stop
        if phase == "start":
            self._start = perf_counter()
        elif self._start is not None:
            self.observe(info["generation"], perf_counter() - self._start)
            self._start = None

    def install(self) -> None:
        """Start timing the process's collections (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def collections(self, generation: int) -> int:
        return sum(self.counts[generation])

    def families(self, name: str) -> Iterable[Metric]:
        h = HistogramMetricFamily(name, "Pauses of Python's garbage collector in the engine's process, by "
                                  "generation (2: a full collection)", labels=["generation"])
        for g in GENERATIONS:
            total, buckets = 0, []
            for le, n in zip([*map(str, BUCKETS), "+Inf"], self.counts[g]):
                total += n
                buckets.append((le, total))
            h.add_metric([str(g)], buckets, sum_value=self.sums[g])
        yield h


PAUSES = PauseRecorder()


def freeze_loaded() -> int:
    """Collect, then move every surviving object to the permanent generation (nothing when
    ``SPECRAY_GC_FREEZE=0``); returns how many objects are frozen now. Call once what the process
    serves with is loaded and warmed up."""
    if os.environ.get("SPECRAY_GC_FREEZE", "1") == "0":
        log.info("gc: SPECRAY_GC_FREEZE=0, nothing frozen")
        return gc.get_freeze_count()
    t0 = perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("gc: %d objects frozen out of the collector's way (%.0f ms)", frozen, (perf_counter() - t0) * 1e3)
    return frozen


def metric_families(prefix: str) -> Iterable[Metric]:
    """The process's collector pauses (``<prefix>gc_pause_seconds``) and frozen objects
    (``<prefix>gc_frozen_objects``), read when scraped."""
    yield from PAUSES.families(prefix + "gc_pause_seconds")
    yield GaugeMetricFamily(prefix + "gc_frozen_objects", "Objects moved out of the garbage collector's passes "
                            "(gc.freeze) in the engine's process", value=gc.get_freeze_count())
