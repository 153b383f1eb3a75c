"""OpenAI-compatible HTTP ingress (FastAPI behind Ray Serve) over the in-process async engine.

``build_app(ServeArgs)`` is the pure function from config to a Serve application, its deployment
options derived from ``ServeArgs``; ``app_builder(dict)`` is the same for Serve config files
(``import_path: deployments.app:app_builder``). The replica builds an ``LLMEngine`` from the config
and streams from an ``AsyncLLMEngine`` over it; ``OpenAIServer`` (``deployments.openai_server``)
holds the request logic and works without Serve.

Endpoints: GET /health, GET /v1/models, GET /v1/models/{model}, POST /v1/completions, POST /v1/chat/completions
(``stream: true`` answers SSE: ``data: {chunk}`` lines, then ``data: [DONE]``). Errors use the
OpenAI error body. A client that goes away cancels the handler, which aborts the request and
frees its KV blocks (cancelling the engine's async iterator does that).

Operations: the API key and the body size are checked before the body is read
(``deployments.http_guard``); overload is answered 429 by the replica's admission control (never
by Serve's queue, see ``deployment_options``), 503 while the engine loop is dead or the replica
drains, both with Retry-After. On delete or redeploy
Serve stops routing to the replica and waits up to ``graceful_shutdown_timeout_s`` for requests in
flight, so streams end normally with their finish reason and ``data: [DONE]``.
"""
# No `from __future__ import annotations` here: FastAPI must see the request model classes, not strings
# (Serve rebuilds the routes on the replica, where string annotations resolve to query parameters).
import asyncio
import functools
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.async_engine import AsyncLLMEngine
from cluster.validation import REQUEST, first_field, format_validation_error
from deployments import replica_state
from deployments.admission import Admission
from deployments.grpc_ingress import GrpcGenerationMixin
from deployments.http_guard import BodyTooLarge, GuardSettings, RequestGuard
from deployments.http_metrics import HTTPCountMiddleware
from deployments.metrics_hub import ReplicaMetricsPublisher
from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest, error_body
from deployments.openai_schema import openapi_document
from deployments.openai_server import EventStream, OpenAIServer
from deployments.replica_state import ReplicaHeader, ReplicaState
from deployments.serve_config import ServeArgs

log = logging.getLogger("specray.serve")


# ---- FastAPI app and its error handlers ------------------------------------------------------
app = FastAPI(title="specray", description="OpenAI-compatible LLM serving with speculative decoding")
app.openapi = functools.partial(openapi_document, app)  # the real response bodies (deployments.openai_schema)


def _error_response(status: int, message: str, param=None, code=None, type_=None,
                    retry_after_s: int | None = None) -> JSONResponse:
    type_ = type_ or APIError(status, message).type
    headers = None if retry_after_s is None else {"Retry-After": str(retry_after_s)}
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


@app.exception_handler(APIError)
async def _api_error(_: Request, e: APIError):
    return _error_response(e.status, e.message, e.param, e.code, e.type, e.retry_after_s)


@app.exception_handler(BodyTooLarge)
async def _body_too_large(_: Request, e: BodyTooLarge):
    return _error_response(413, str(e.detail), code="request_too_large")


@app.exception_handler(RequestValidationError)
async def _validation_error(_: Request, e: RequestValidationError):
    errors = list(e.errors())
    if any(err.get("type") == "json_invalid" for err in errors):
        detail = errors[0].get("ctx", {}).get("error", "")
        return _error_response(400, f"malformed JSON body: {detail}".rstrip(": "), code="invalid_json")
    code = errors[0].get("type") if errors else None
    return _error_response(422, format_validation_error(errors, REQUEST), param=first_field(errors), code=code)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, e: StarletteHTTPException):
    response = _error_response(e.status_code, str(e.detail))
    response.headers.update(e.headers or {})  # 405: Allow
    return response


@app.exception_handler(Exception)
async def _internal_error(_: Request, e: Exception):
    log.exception("unhandled error")
    return _error_response(500, f"internal error: {type(e).__name__}: {e}")


class _SSEResponse(StreamingResponse):
    """Closes its EventStream however the response ends (done, client gone, handler cancelled),
    so the engine requests are aborted and the admission room comes back."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def _respond(result: dict | EventStream):
    if isinstance(result, dict):
        return JSONResponse(result)
    return _SSEResponse(result, media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# The middleware reads the replica's state that OpenAIIngress.__init__ binds (deployments.replica_state).
# Inside the metrics middleware (added after it), so its 401/413 answers are counted too.
app.add_middleware(RequestGuard, settings=replica_state.guard_settings)


# Outside the guard: it counts the guard's answers too (401/413), besides the routes' (429/503 included).
# Must stay above @serve.ingress, which freezes a copy of the app.
app.add_middleware(HTTPCountMiddleware, metrics=replica_state.http_metrics)

# Outermost: every answer of the replica names it (x-specray-replica), the guard's refusals included.
app.add_middleware(ReplicaHeader, replica_id=replica_state.replica_id)


@serve.deployment(name="OpenAIIngress")  # options: deployment_options(ServeArgs)
@serve.ingress(app)
class OpenAIIngress(GrpcGenerationMixin):
    """One replica behind the HTTP and gRPC routes: an in-process engine (the model in the replica),
    or, with tensor_parallel_size > 1 / drafters, the step loop over verifier-shard and drafter
    actors (deployments/engine_factory.py)."""

    def __init__(self, args: dict, kv_tier=None):
        """kv_tier: the application's SharedKVTierHost (bound so that Serve starts it with the app;
        the engine finds the tier actor by name)."""
        from actors.gc_pauses import freeze_loaded
        from deployments.engine_factory import build_engine

        sargs = ServeArgs.model_validate(args)
        api_key = sargs.resolved_api_key()
        if sargs.api_key_env and api_key is None:
            raise ValueError(f"api_key_env={sargs.api_key_env!r}: that environment variable is not set on the "
                             f"replica; set it there (e.g. runtime_env env_vars) or leave api_key_env out")
        ctx = serve.get_replica_context()
        engine, self._stop_actors = build_engine(sargs, ctx.replica_id.unique_id, ctx.app_name)
        admission = Admission(sargs.max_ongoing_requests, sargs.max_queued_requests, sargs.retry_after_s,
                              sargs.queue_timeout_s)
        self.server = OpenAIServer(AsyncLLMEngine(engine), sargs.model_name, engine.max_model_len, admission,
                                   api_key, draining=replica_state.serve_replica_draining)
        engine.metrics.watch_queue(lambda: admission.num_waiting)  # specray:num_requests_queued / _waiting
        replica_state.bind(ReplicaState(GuardSettings(api_key, sargs.max_request_bytes), engine.metrics,
                                        ctx.replica_id.unique_id))
        self.metrics_publisher = ReplicaMetricsPublisher.for_current_replica(engine.metrics)
        freeze_loaded()  # the replica's loaded objects out of the garbage collector's full passes

    @app.get("/health")
    async def health(self):
        """200 while the replica takes requests; 503 when its engine loop is dead or it drains."""
        reason = self.server.unavailable_reason()
        if reason is not None:
            return _error_response(503, reason, code="service_unavailable",
                                   retry_after_s=self.server.admission.retry_after_s)
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics(self):
        """Prometheus text: the totals of all replicas of this deployment (no API key needed)."""
        return Response(await asyncio.to_thread(self.metrics_publisher.render), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(self):
        return self.server.models()

    @app.get("/v1/models/{model:path}")
    async def model(self, model: str):
        return self.server.model(model)

    @app.post("/v1/completions")
    async def completions(self, req: CompletionRequest):
        return _respond(await self.server.handle(req, chat=False))

    @app.post("/v1/chat/completions")
    async def chat_completions(self, req: ChatCompletionRequest):
        return _respond(await self.server.handle(req, chat=True))

    def engine_stats(self) -> dict:
        """For tests and operators through a Serve handle: unfinished requests, free KV blocks and
        admission (sequences running, requests waiting)."""
        return self.server.stats()

    def check_health(self):
        """Serve's replica health check: the engine thread must be alive (draining is healthy:
        failing it would make Serve kill the streams the drain is waiting for)."""
        if not self.server.engine_alive:
            raise RuntimeError("engine loop is not running")

    def __del__(self):
        publisher = getattr(self, "metrics_publisher", None)
        if publisher is not None:
            publisher.close()
        server = getattr(self, "server", None)
        if server is not None:  # Serve has waited for the requests in flight (graceful_shutdown_timeout_s)
            server.begin_drain()
            server.aeng.shutdown(timeout=5.0)
        stop = getattr(self, "_stop_actors", None)
        if stop is not None:
            stop()


# Room above max_ongoing_requests + max_queued_requests in Serve's per-replica limit for requests
# the replica turns away itself (429 with an OpenAI body and Retry-After): refusals take milliseconds,
# so this many at once keeps Serve's routing moving during a burst.
_REJECT_HEADROOM = 32


def deployment_options(args: ServeArgs) -> dict:
    """Serve options of the ingress deployment. Overload is answered by the replica's ``Admission``
    (429 with an OpenAI body and Retry-After, counted in ``specray:http_requests_total``), never by
    Serve, whose refusals are plain-text 503s written by its proxy, outside the app and its metrics:

    - Serve lets more requests into a replica (``max_ongoing_requests``) than the replica runs or
      queues, so that the extras reach the replica and are refused there;
    - Serve's own queue (per proxy, requests waiting for a replica with room) has no limit
      (``max_queued_requests=-1``). A request waits in it only while every replica holds
      ``serve_limit`` requests, i.e. while ``_REJECT_HEADROOM`` refusals are under way at once, a
      few milliseconds; a limit there refused bursts outright (Serve counts every request as
      queued while it picks a replica: 150 at once got 18-64 plain-text 503s with a limit of 80).
    """
    serve_limit = args.max_ongoing_requests + args.max_queued_requests + _REJECT_HEADROOM
    opts = {"max_ongoing_requests": serve_limit,
            "max_queued_requests": -1,
            "ray_actor_options": {"num_cpus": args.num_cpus, "num_gpus": args.num_gpus},
            "graceful_shutdown_timeout_s": args.graceful_shutdown_timeout_s,
            "health_check_period_s": args.health_check_period_s,
            "health_check_timeout_s": args.health_check_timeout_s}
    if args.autoscaling is not None:
        opts["autoscaling_config"] = args.autoscaling.to_serve()
    else:
        opts["num_replicas"] = args.num_replicas
    return opts


def build_app(args: ServeArgs) -> serve.Application:
    """ServeArgs to Serve application (pure): ``serve.run(build_app(ServeArgs(engine=EngineConfig(...))))``."""
    if not isinstance(args, ServeArgs):
        raise TypeError(f"build_app takes ServeArgs, got {type(args).__name__}; wrap an engine config as "
                        f"ServeArgs(engine=config)")
    tier = args.effective_kv_tier
    host = None
    if tier.enabled:  # one shared KV tier per application, owned by its host deployment
        from deployments.kv_tier import SharedKVTierHost

        host = SharedKVTierHost.bind(tier.capacity_bytes, args.engine.block_size, tier.name)
    return OpenAIIngress.options(**deployment_options(args)).bind(args.model_dump(mode="json"), host)


def app_builder(args: dict) -> serve.Application:
    """Entry point of Serve config files: the application's ``args:`` block, validated as ServeArgs;
    a bad value is one line naming the key, e.g. ``args: engine.max_num_seqs=0: ...``."""
    try:
        sargs = ServeArgs.model_validate(args or {})
    except ValidationError as e:
        raise ValueError(f"args: {format_validation_error(e)}") from None
    return build_app(sargs)
