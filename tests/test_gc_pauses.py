"""Python's garbage collector in a serving process (actors/gc_pauses.py): every collection's pause
is recorded by generation and exported as a Prometheus histogram, and ``freeze_loaded`` moves the
loaded objects out of the collector's full passes (checked in a child process: a freeze is
process-wide, and the test process must not keep its engines' garbage)."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from actors import gc_pauses
from actors.gc_pauses import BUCKETS, PauseRecorder
from cluster.metrics import EngineMetrics
from cluster.metrics_merge import merge_snapshots

ROOT = Path(__file__).resolve().parents[1]


def _samples(families) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in families for s in fam.samples}


def test_pauses_land_in_their_buckets_cumulatively_per_generation():
    rec = PauseRecorder()
    for g, s in ((0, 0.0002), (0, 0.003), (2, 0.2), (2, 5.0)):
        rec.observe(g, s)
    got = _samples(rec.families("x"))
    assert got[("x_bucket", (("generation", "0"), ("le", "0.0005")))] == 1
    assert got[("x_bucket", (("generation", "0"), ("le", "0.005")))] == 2
    assert got[("x_count", (("generation", "0"),))] == 2
    assert got[("x_bucket", (("generation", "2"), ("le", "0.1")))] == 0
    assert got[("x_bucket", (("generation", "2"), ("le", "0.25")))] == 1
    assert got[("x_bucket", (("generation", "2"), ("le", str(BUCKETS[-1]))))] == 1  # 5 s is above every bucket
    assert got[("x_bucket", (("generation", "2"), ("le", "+Inf")))] == 2
    assert abs(got[("x_sum", (("generation", "2"),))] - 5.2) < 1e-9
    assert got[("x_count", (("generation", "1"),))] == 0


def test_a_real_collection_is_timed_once_under_its_generation():
    rec = PauseRecorder()
    rec.install()
    rec.install()  # idempotent: one callback, so one count per collection
    try:
        before = rec.collections(2)
        gc.collect()
        assert rec.collections(2) == before + 1 and rec.sums[2] > 0
        gc.collect(1)
        assert rec.collections(1) >= 1
    finally:
        gc.callbacks.remove(rec._callback)
    assert rec._callback not in gc.callbacks


def test_engine_metrics_export_the_pauses_and_frozen_objects_and_replicas_sum():
    engines = [EngineMetrics() for _ in range(2)]  # the first installs PAUSES in this process
    gc.collect()  # so this full collection is recorded
    snaps = [m.snapshot() for m in engines]
    fams = {f.name: f for f in snaps[0]}
    assert fams["specray:gc_pause_seconds"].type == "histogram"
    assert fams["specray:gc_frozen_objects"].type == "gauge"
    counts = {dict(lab)["generation"]: v for n, lab, v in fams["specray:gc_pause_seconds"].samples
              if n.endswith("_count")}
    assert set(counts) == {"0", "1", "2"} and counts["2"] >= 1
    merged = {f.name: f for f in merge_snapshots(snaps)}["specray:gc_pause_seconds"]
    total = {dict(lab)["generation"]: v for n, lab, v in merged.samples if n.endswith("_count")}
    assert total["2"] == 2 * counts["2"]
    assert gc_pauses.PAUSES._callback in gc.callbacks


CHILD = """
import gc, json, time
from actors.gc_pauses import freeze_loaded
keep = [[i] for i in range(300_000)]  # long-lived containers, as a loaded model's libraries leave
t = time.perf_counter(); gc.collect(); before = time.perf_counter() - t
frozen = freeze_loaded()
t = time.perf_counter(); gc.collect(); after = time.perf_counter() - t
garbage = []; garbage.append(garbage); del garbage  # a cycle made after the freeze is still collected
print(json.dumps({"frozen": frozen, "count": gc.get_freeze_count(), "before": before, "after": after,
                  "collected": gc.collect()}))
"""


def _child(env_freeze: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPECRAY_GC_FREEZE"}
    if env_freeze is not None:
        env["SPECRAY_GC_FREEZE"] = env_freeze
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freeze_moves_the_loaded_objects_out_of_full_collections():
    got = _child(None)
    assert got["frozen"] == got["count"] >= 300_000
    assert got["after"] < got["before"] / 3  # the full pass no longer walks them
    assert got["collected"] >= 1  # objects made afterwards are collected as before


def test_the_freeze_can_be_turned_off():
    got = _child("0")
    assert got["frozen"] == got["count"] == 0
