"""What the ingress middleware needs from the Serve replica it runs in, handed over explicitly.

Serve freezes a copy of the FastAPI app, middleware included, when the deployment class is
decorated: before any replica exists, so a replica cannot pass its API key, body limit or metrics
to the middleware's constructor. Instead each middleware is given a function of this module that
reads the state, and the replica binds its state here once, in ``__init__`` (``bind``; Serve runs
every replica in a process of its own). Unbound (outside a replica, or before ``__init__`` ran),
the middleware lets requests through untouched.

``ReplicaHeader`` names the replica in every HTTP answer it gives (``x-specray-replica``).
``serve_replica_draining`` is the one place that reads Serve's replica internals (see there).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.metrics import EngineMetrics
    from deployments.http_guard import GuardSettings


@dataclass(frozen=True, slots=True)
class ReplicaState:
    guard: GuardSettings | None = None  # API key and body limit (deployments.http_guard)
    metrics: EngineMetrics | None = None  # where HTTP answers are counted (deployments.http_metrics)
    replica_id: str | None = None  # Serve's id of this replica (``ReplicaHeader``)


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


def replica_id() -> str | None:
    """``ReplicaHeader``'s source: this replica's Serve id."""
    return _bound.replica_id


REPLICA_HEADER = "x-specray-replica"


class ReplicaHeader:
    """Pure ASGI middleware: every HTTP answer of a replica, errors and streams included, names it in
    ``x-specray-replica``: Serve's replica id, the one in Serve's logs (``replica_<app>_<deployment>_<id>.log``,
    its lines) and in the replica's ``/metrics`` push (deployments.metrics_hub), so an operator can
    tell which replica answered a request (a slow one, an error, a prefix-cache hit or miss). Unbound:
    no header."""

    def __init__(self, app, replica_id: Callable[[], str | None]):
        self.app, self.replica_id = app, replica_id

    async def __call__(self, scope, receive, send):
        rid = self.replica_id() if scope["type"] == "http" else None
        if rid is None:
            return await self.app(scope, receive, send)
        header = (REPLICA_HEADER.encode(), rid.encode("latin-1"))

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await self.app(scope, receive, named)


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
