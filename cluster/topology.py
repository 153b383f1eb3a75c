"""Where one engine replica's actors run: a placement group with one bundle per tensor-parallel
rank (STRICT_PACK, so a TP group never spans nodes) and the drafter bundles beside them; plus the
checks that a TP size fits the model. (The TP group's rendezvous is rank 0's TCPStore on a port the OS
picks, at the node IP that ``actors.verifier_shard`` finds: see ``VerifierShard.rendezvous``.)

Bundle order: ``[verifier rank 0, ..., rank tp-1, drafter 0, ..., drafter d-1]``.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PlacementError(RuntimeError):
    """The cluster cannot place a replica's actors (within the allowed wait)."""


class ReplicaTopology(BaseModel):
    """Resources of one engine replica. On CPU the bundles hold fractional CPUs (several actors
    share a core); with ``use_gpu`` every verifier rank gets ``gpus_per_verifier`` GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp_size: int = Field(1, ge=1)
    num_drafters: int = Field(0, ge=0)
    use_gpu: bool = False
    cpus_per_verifier: float = Field(0.5, gt=0)
    cpus_per_drafter: float = Field(0.25, gt=0)
    gpus_per_verifier: float = Field(1.0, gt=0)

    def verifier_bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_verifier}
        if self.use_gpu:
            bundle["GPU"] = self.gpus_per_verifier
        return bundle

    def drafter_bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_drafter}

    def bundles(self) -> list[dict[str, float]]:
        return [self.verifier_bundle() for _ in range(self.tp_size)] + \
               [self.drafter_bundle() for _ in range(self.num_drafters)]

    def verifier_bundle_index(self, rank: int) -> int:
        if not 0 <= rank < self.tp_size:
            raise ValueError(f"rank {rank} is outside tp_size={self.tp_size}")
        return rank

    def drafter_bundle_index(self, i: int) -> int:
        if not 0 <= i < self.num_drafters:
            raise ValueError(f"drafter {i} is outside num_drafters={self.num_drafters}")
        return self.tp_size + i

    def describe(self) -> str:
        """e.g. 'tp=4 needs 4 GPUs and 2 CPUs in one node (+ 2 drafters: 0.5 CPUs)'."""
        need = _sum_bundles([self.verifier_bundle()] * self.tp_size)
        text = f"tp={self.tp_size} needs {_fmt(need)} in one node"
        if self.num_drafters:
            text += f" (+ {self.num_drafters} drafters: {_fmt(_sum_bundles([self.drafter_bundle()] * self.num_drafters))})"
        return text


def _sum_bundles(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _fmt(resources: dict[str, Any]) -> str:
    order = sorted(resources, key=lambda k: (k not in ("GPU", "CPU"), k != "GPU", k))
    return " and ".join(f"{resources[k]:g} {k}s" for k in order)


def unplaceable_reason(replica: dict[str, float], group: list[dict[str, float]], replicas: int,
                       nodes: list[dict[str, float]]) -> str | None:
    """Why ``replicas`` replicas, each an actor of ``replica`` resources plus a STRICT_PACK placement
    group of ``group`` bundles, cannot be placed on ``nodes`` (each node's total resources), or None.
    A check before Serve deploys: a replica that cannot be placed otherwise fails only after its
    placement timeout, deep in Ray's controller log."""
    need_group = _sum_bundles(group)
    if group and not any(all(n.get(k, 0) >= v for k, v in need_group.items()) for n in nodes):
        largest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
        return (f"its actors' placement group needs {_fmt(need_group)} in one node (STRICT_PACK), "
                f"the largest node has {_fmt({k: largest.get(k, 0) for k in need_group})}")
    per_replica = {k: v for k, v in _sum_bundles([replica, *group]).items() if v}
    total = {k: v * replicas for k, v in per_replica.items()}
    have = _sum_bundles(nodes)
    if any(have.get(k, 0) < v for k, v in total.items()):
        return (f"{replicas} replica(s) of {_fmt(per_replica)} each need {_fmt(total)}, the cluster has "
                f"{_fmt({k: have.get(k, 0) for k in total})}")
    return None


def cluster_summary() -> str:
    """e.g. '0 GPUs, 8 CPUs in total; largest node: 8 CPUs' from the live Ray cluster."""
    import ray

    total = ray.cluster_resources()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    largest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
    pick = lambda r: {k: r.get(k, 0) for k in ("GPU", "CPU")}  # noqa: E731
    return f"the cluster has {_fmt(pick(total))} in total over {len(nodes)} node(s); largest node: {_fmt(pick(largest))}"


def create_placement_group(topology: ReplicaTopology, name: str = "", timeout_s: float = 30.0):
    """Reserve the replica's bundles (STRICT_PACK). Not ready within ``timeout_s``: the request is
    withdrawn and PlacementError says what was asked and what the cluster has (never hangs)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(topology.bundles(), strategy="STRICT_PACK", name=name)
    try:
        ready = pg.wait(timeout_seconds=timeout_s)
    except BaseException:
        remove_placement_group(pg)
        raise
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"placement group {name or '(unnamed)'} not ready after {timeout_s:g} s: "
                             f"{topology.describe()}; {cluster_summary()}. Lower --tp / --drafters, "
                             "free resources, or add nodes")
    return pg


def valid_tp_sizes(model_config) -> list[int]:
    """TP sizes the model supports: divisors of its KV heads that also divide its query heads and
    MLP width (the vocabulary is padded to a multiple of tp; the hidden size is never split)."""
    c = model_config
    return [t for t in range(1, c.num_kv_heads + 1)
            if c.num_kv_heads % t == 0 and c.num_heads % t == 0 and c.intermediate_size % t == 0]


def validate_tp(model_config, tp_size: int, model_name: str = "the model") -> None:
    """ValueError naming tp and the head counts when ``tp_size`` does not fit the model.
    TP must divide the KV heads (each rank holds whole KV heads; replication is not used here)."""
    c = model_config
    if tp_size < 1:
        raise ValueError(f"tp={tp_size} must be at least 1")
    ok = valid_tp_sizes(c)
    if tp_size in ok:
        return
    if tp_size > c.num_kv_heads:
        why = f"exceeds num_kv_heads={c.num_kv_heads}"
    elif c.num_kv_heads % tp_size:
        why = f"does not divide num_kv_heads={c.num_kv_heads}"
    elif c.num_heads % tp_size:
        why = f"does not divide num_heads={c.num_heads}"
    else:
        why = f"does not divide intermediate_size={c.intermediate_size}"
    raise ValueError(f"tp={tp_size} {why} of {model_name} (num_heads={c.num_heads}, "
                     f"num_kv_heads={c.num_kv_heads}); use tp in {ok}")
