"""One /metrics for all replicas of a Serve deployment: a small hub actor that sums their samples.

Each replica's engine has its own registry (``cluster.metrics.EngineMetrics``), but Prometheus
scrapes ``/metrics`` through the Serve proxy, which hands the scrape to any one replica. So that
every answer shows the deployment's totals:

- ``MetricsHub`` is a named Ray actor (``num_cpus=0``), one per application and deployment
  (``hub_name``), in Serve's namespace (``serve``, where the replicas and the controller live; a
  replica's runtime context reports its driver's namespace instead), created by whichever replica comes first
  (``get_if_exists=True``). It is detached, so it outlives the replica that created it (a
  non-detached actor dies with its owner); the last replica to leave kills it.
- ``ReplicaMetricsPublisher`` (in each replica) pushes a snapshot of its registry every
  ``PUSH_INTERVAL_S`` from a background thread, and once more right before answering /metrics;
  the push returns the merged view: counters and histogram buckets/sum/count summed, count-like
  gauges (requests, KV blocks) summed, the KV usage ratio recomputed from the summed blocks
  (``cluster.metrics_merge.merge_snapshots``), rendered as Prometheus text by ``cluster.metrics_merge.render``
  (a custom Collector + ``generate_latest``).
- So the answering replica's own samples are exact; the others' are at most ``PUSH_INTERVAL_S``
  old.
- A replica that shuts down removes its snapshot; its counters and histograms stay in the totals
  (folded into a retired sum, so totals never go backwards and ``rate()`` sees no false reset), its
  gauges leave with it. A replica silent for ``STALE_AFTER_S`` (crashed) is treated the same way,
  but kept apart so that it rejoins without double counting if it was only slow.
- If the hub cannot be reached, /metrics answers with this replica's samples alone (logged) and
  the next push creates the hub again; series of replicas that left before are then lost, which
  Prometheus sees as one counter reset.
"""
from __future__ import annotations

import logging
import threading
import time

import ray
from ray.serve._private.constants import SERVE_NAMESPACE

from cluster.metrics import EngineMetrics
from cluster.metrics_merge import Snapshot, merge_snapshots, render

log = logging.getLogger("specray.metrics_hub")

PUSH_INTERVAL_S = 2.0
STALE_AFTER_S = 30.0
HUB_CALL_TIMEOUT_S = 5.0


def hub_name(app_name: str, deployment: str) -> str:
    return f"specray-metrics-hub:{app_name}:{deployment}"


class MetricsHub:
    """The replicas' latest snapshots, merged on request (plain class; ``HubActor`` runs it)."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S):
        self.stale_after_s = stale_after_s
        self.live: dict[str, tuple[float, Snapshot]] = {}  # replica id -> (time of last push, snapshot)
        self.stale: dict[str, Snapshot] = {}  # silent replicas: counters kept, may come back
        self.retired: Snapshot = []  # summed counters of replicas that shut down

    def push(self, replica_id: str, snap: Snapshot) -> Snapshot:
        """Store a replica's snapshot; return the merged view of all replicas."""
        self.stale.pop(replica_id, None)
        self.live[replica_id] = (time.monotonic(), snap)
        return self.merged()

    def remove(self, replica_id: str) -> int:
        """A replica shuts down: fold its counters into the retired sum. Returns live replicas left."""
        entry = self.live.pop(replica_id, None)
        snap = entry[1] if entry is not None else self.stale.pop(replica_id, None)
        if snap is not None:
            self.retired = merge_snapshots((), [self.retired, snap])
        return len(self.live)

    def merged(self) -> Snapshot:
        now = time.monotonic()
        for rid in [r for r, (t, _) in self.live.items() if now - t > self.stale_after_s]:
            log.warning("replica %s sent no metrics for %.0f s; keeping only its counters", rid, self.stale_after_s)
            self.stale[rid] = self.live.pop(rid)[1]
        return merge_snapshots([s for _, s in self.live.values()], [self.retired, *self.stale.values()])

    def replicas(self) -> dict[str, Snapshot]:
        """Latest snapshot of each live replica (operators, tests)."""
        return {rid: snap for rid, (_, snap) in self.live.items()}


HubActor = ray.remote(num_cpus=0)(MetricsHub)


class ReplicaMetricsPublisher:
    """Keeps one replica's snapshot in its deployment's hub and renders the merged /metrics."""

    def __init__(self, metrics: EngineMetrics, app_name: str, deployment: str, replica_id: str,
                 interval_s: float = PUSH_INTERVAL_S):
        self.metrics, self.replica_id, self.interval_s = metrics, replica_id, interval_s
        self.name = hub_name(app_name, deployment)
        self.namespace = SERVE_NAMESPACE
        self._hub = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specray-metrics-push", daemon=True)
        self._thread.start()

    @classmethod
    def for_current_replica(cls, metrics: EngineMetrics) -> ReplicaMetricsPublisher:
        from ray import serve

        ctx = serve.get_replica_context()
        return cls(metrics, ctx.app_name, ctx.deployment, ctx.replica_id.unique_id)

    def hub(self):
        if self._hub is None:
            self._hub = HubActor.options(name=self.name, namespace=self.namespace, get_if_exists=True,
                                         lifetime="detached").remote()
        return self._hub

    def exchange(self) -> Snapshot:
        """Push this replica's snapshot and get every replica's merged one back (this replica's
        alone when the hub cannot be reached)."""
        snap = self.metrics.snapshot()
        try:
            return ray.get(self.hub().push.remote(self.replica_id, snap), timeout=HUB_CALL_TIMEOUT_S)
        except Exception as e:
            log.warning("metrics hub %s unreachable (%s); showing this replica's metrics only", self.name, e)
            self._hub = None  # looked up (or created again) on the next push
            return merge_snapshots([snap])

    def render(self) -> bytes:
        """Prometheus text of all replicas (blocking: call it off the event loop)."""
        return render(self.exchange())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.exchange()

    def close(self) -> None:
        """Stop pushing and take this replica out of the hub; the last replica out ends the hub."""
        self._stop.set()
        self._thread.join(timeout=HUB_CALL_TIMEOUT_S)
        try:
            hub = self._hub or ray.get_actor(self.name, namespace=self.namespace)
            if ray.get(hub.remove.remote(self.replica_id), timeout=HUB_CALL_TIMEOUT_S) == 0:
                ray.kill(hub)
        except Exception as e:
            log.warning("could not remove replica %s from metrics hub %s: %s", self.replica_id, self.name, e)
