"""What the ingress middleware needs from the Serve replica it runs in, handed over explicitly.

Serve freezes a copy of the FastAPI app, middleware included, when the deployment class is
decorated: before any replica exists, so a replica cannot pass its API key, body limit or metrics
to the middleware's constructor. Instead each middleware is given a function of this module that
reads the state, and the replica binds its state here once, in ``__init__`` (``bind``; Serve runs
every replica in a process of its own). Unbound (outside a replica, or before ``__init__`` ran),
the middleware lets requests through untouched.

``serve_replica_draining`` is the one place that reads Serve's replica internals (see there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.metrics import EngineMetrics
    from deployments.http_guard import GuardSettings


@dataclass(frozen=True, slots=True)
class ReplicaState:
    guard: GuardSettings | None = None  # API key and body limit (deployments.http_guard)
    metrics: EngineMetrics | None = None  # where HTTP answers are counted (deployments.http_metrics)


_bound = ReplicaState()


def bind(state: ReplicaState) -> None:
    """This process's replica state from now on (``ReplicaState()``: none)."""
    global _bound
    _bound = state


def guard_settings() -> GuardSettings | None:
    """``RequestGuard``'s settings source."""
    return _bound.guard


def http_metrics() -> EngineMetrics | None:
    """``HTTPCountMiddleware``'s metrics source."""
    return _bound.metrics


def serve_replica_draining() -> bool:
    """Whether Serve has begun this replica's graceful shutdown (delete, redeploy, downscale).

    Serve 2.60 has no public hook for it: its replica sets ``_shutting_down`` when the drain
    starts, and the replica context's handle-registration callback closes over that replica. False
    when that layout is not there (outside a replica, another Serve version); tests/test_http_ops.py
    checks it against the installed Serve."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        ctx = serve.get_replica_context()
    except RayServeException:  # not in a replica
        return False
    callback = getattr(ctx, "_handle_registration_callback", None)
    for cell in getattr(callback, "__closure__", None) or ():
        try:
            flag = getattr(cell.cell_contents, "_shutting_down", None)
        except ValueError:  # an empty cell
            continue
        if isinstance(flag, bool):
            return flag
    return False
