"""Count every HTTP answer of the ingress by route template and status (``specray:http_requests_total``).

A pure ASGI middleware (not ``BaseHTTPMiddleware``): it only watches the ``http.response.start``
message, so streaming answers and client disconnects (which cancel the handler and abort the
request) behave exactly as without it. Registered outside the other middleware (only the replica
header is outside it), it also sees the answers they give before any route runs (401, 413, 429,
503), and 500s from unhandled errors.

The route label is the route template (``/v1/completions``), never the raw path, so scanners cannot
blow up the number of series; paths that match no route count as ``other``. A client that goes away
before any answer was started counts as status 499 (nginx's "client closed request").

Serve runs a frozen copy of the FastAPI app in each replica, so the middleware cannot be handed the
replica's metrics object itself: it gets a function that returns it (``metrics=``; the ingress passes
``deployments.replica_state.http_metrics``, which reads what the replica bound), None: not counted.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from starlette.routing import compile_path

from cluster.metrics import EngineMetrics


class HTTPCountMiddleware:
    """``app.add_middleware(HTTPCountMiddleware, metrics=callable returning EngineMetrics or None)``."""

    def __init__(self, app, metrics: Callable[[], EngineMetrics | None]):
        self.app, self.metrics = app, metrics
        self._templates: list[tuple[str, re.Pattern]] | None = None  # the app's routes, read once

    async def __call__(self, scope, receive, send):
        metrics = self.metrics() if scope["type"] == "http" else None
        if metrics is None:
            return await self.app(scope, receive, send)
        status = None

        async def watch(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except asyncio.CancelledError:
            status = status or 499
            raise
        except Exception:
            status = status or 500
            raise
        finally:
            metrics.record_http(self.route_of(scope), status or 500)

    def route_of(self, scope) -> str:
        """The template of the route the path matches (also for answers given before routing), its
        prefix included when the route sits in an included router; ``other`` when none matches."""
        if self._templates is None:
            templates = route_templates(getattr(scope.get("app"), "routes", ()))
            self._templates = [(t, compile_path(t)[0]) for t in templates]
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        matches = [t for t, regex in self._templates if regex.match(path)]
        routed = getattr(scope.get("route"), "path", None)  # the route that answered, without prefixes
        if routed is not None:
            return next((t for t in matches if t.endswith(routed)), routed)
        return matches[0] if matches else "other"


def route_templates(routes, prefix: str = "") -> list[str]:
    """Path templates of ``routes`` in matching order, through mounts and included routers (Serve
    re-mounts the deployment's routes in an included FastAPI router)."""
    out: list[str] = []
    for r in routes:
        inner = getattr(r, "routes", None)  # a Mount or Router
        included = getattr(r, "original_router", None)  # FastAPI's included-router node
        if inner is None and included is not None:
            inner = included.routes
            sub = getattr(getattr(r, "include_context", None), "prefix", "") or ""
        else:
            sub = getattr(r, "path", "") or ""
        if inner is not None:
            out += route_templates(inner, prefix + sub)
        elif getattr(r, "path", None):
            out.append(prefix + r.path)
    return out
