"""Metrics as plain data, summable across replicas: ``snapshot`` turns a registry into picklable
tuples, ``merge_snapshots`` sums several (counters, histogram buckets/sum/count and count-like gauges;
the KV usage ratio is recomputed from the summed used/total blocks, the ``MEAN_GAUGES`` averaged) and
``render`` writes Prometheus text from a snapshot. ``deployments.metrics_hub`` uses them to show every
replica's totals on any replica; ``cluster.metrics`` defines the series.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

P = "specray:"
KV_USED, KV_TOTAL, KV_USAGE = P + "kv_blocks_used", P + "kv_blocks_total", P + "kv_cache_usage_perc"
SPEEDUP = P + "spec_decode_estimated_speedup"
# merged as the mean over the replicas that report them (ratios, and the one shared tier's figures, do not sum)
MEAN_GAUGES = (SPEEDUP, P + "kv_shared_tier_capacity_bytes", P + "kv_shared_tier_bytes", P + "kv_shared_tier_blocks")


class Family(NamedTuple):
    name: str
    type: str  # counter | gauge | histogram
    documentation: str
    samples: tuple[tuple[str, tuple[tuple[str, str], ...], float], ...]  # (sample name, labels, value)


Snapshot = list[Family]


def snapshot(registry) -> Snapshot:
    """The registry's current samples as picklable tuples (``_created`` timestamps dropped: they
    cannot be summed)."""
    out = []
    for m in registry.collect():
        samples = tuple((s.name, tuple(sorted(s.labels.items())), float(s.value))
                        for s in m.samples if not s.name.endswith("_created"))
        out.append(Family(m.name, m.type, m.documentation, samples))
    return out


def merge_snapshots(live: Iterable[Snapshot], retired: Iterable[Snapshot] = ()) -> Snapshot:
    """Sum snapshots sample by sample. ``retired`` ones (replicas that left) contribute their
    counters and histograms only, so totals never go backwards; their gauges are gone with them.
    The KV usage ratio is recomputed from the summed used and total blocks; ``MEAN_GAUGES`` are
    averaged over the snapshots that report them."""
    acc: dict[str, tuple[str, str, dict]] = {}
    reports: dict[tuple, int] = {}  # (family, sample, labels) of MEAN_GAUGES -> snapshots reporting it
    for snaps, with_gauges in ((live, True), (retired, False)):
        for snap in snaps:
            for fam in snap:
                if fam.type == "gauge" and not with_gauges:
                    continue
                _, _, values = acc.setdefault(fam.name, (fam.type, fam.documentation, {}))
                for name, labels, value in fam.samples:
                    values[(name, labels)] = values.get((name, labels), 0.0) + value
                    if fam.name in MEAN_GAUGES:
                        reports[(fam.name, name, labels)] = reports.get((fam.name, name, labels), 0) + 1
    for (fam_name, name, labels), n in reports.items():
        acc[fam_name][2][(name, labels)] /= n
    if KV_USAGE in acc:
        used, total = (_single(acc, n) for n in (KV_USED, KV_TOTAL))
        acc[KV_USAGE][2].clear()
        acc[KV_USAGE][2][(KV_USAGE, ())] = used / total if total else 0.0
    return [Family(name, typ, doc, tuple((n, labels, v) for (n, labels), v in values.items()))
            for name, (typ, doc, values) in acc.items()]


def _single(acc: dict, name: str) -> float:
    return sum(acc[name][2].values()) if name in acc else 0.0


class _SnapshotCollector:
    def __init__(self, snap: Snapshot):
        self.snap = snap

    def collect(self) -> Iterable[Metric]:
        for fam in self.snap:
            m = Metric(fam.name, fam.documentation, fam.type)
            for name, labels, value in fam.samples:
                m.add_sample(name, dict(labels), value)
            yield m


def render(snap: Snapshot) -> bytes:
    """Prometheus text exposition (serve with ``prometheus_client.CONTENT_TYPE_LATEST``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap))
    return generate_latest(registry)
