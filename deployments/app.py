"""OpenAI-compatible HTTP ingress (FastAPI behind Ray Serve) over the in-process async engine.

``build_app(EngineConfig, **deployment_options)`` is the pure function from config to a Serve
application: the replica builds an ``LLMEngine`` from the config and streams from an
``AsyncLLMEngine`` over it. ``OpenAIServer`` holds the request logic and works without Serve.

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions
(``stream: true`` answers SSE: ``data: {chunk}`` lines, then ``data: [DONE]``). Errors use the
OpenAI error body. A client that goes away cancels the handler, which aborts the request and
frees its KV blocks (cancelling the engine's async iterator does that).
"""
# No `from __future__ import annotations` here: FastAPI must see the request model classes, not strings
# (Serve rebuilds the routes on the replica, where string annotations resolve to query parameters).
import json
import logging
import time
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.async_engine import AsyncLLMEngine
from cluster.config import EngineConfig
from cluster.outputs import RequestOutput
from deployments.openai_api import (APIError, ChatCompletionRequest, CompletionRequest, _SamplingRequest,
                                    completion_response, error_body, finish_reason_of, models_response, new_id,
                                    stream_chunk, usage_chunk, validation_message)

log = logging.getLogger("specray.serve")
SSE_DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIServer:
    """Request logic of the ingress: model check, validation, engine call, response shapes."""

    def __init__(self, aeng: AsyncLLMEngine, model_name: str, max_model_len: int):
        self.aeng, self.model_name, self.max_model_len = aeng, model_name, max_model_len
        self.created = int(time.time())

    def models(self) -> dict:
        return models_response(self.model_name, self.created)

    def healthy(self) -> bool:
        return not self.aeng._stopped and self.aeng._thread.is_alive()

    async def handle(self, req: _SamplingRequest, chat: bool):
        """A dict (non-streaming) or an async iterator of SSE lines (``req.stream``)."""
        if req.model is not None and req.model != self.model_name:
            raise APIError(404, f"model {req.model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")
        prompt = req.engine_prompt()
        req.check_supported(self.max_model_len)
        params = req.to_sampling_params()
        rid = new_id("chatcmpl" if chat else "cmpl")
        gen = self.aeng.generate(prompt, params, request_id=rid)
        first = await self._first(gen, "messages" if chat else "prompt")
        if req.stream:
            return self._stream(gen, first, rid, chat, req.include_usage)
        final = first
        async for out in gen:  # a cancelled handler (client gone) aborts the request here
            final = out
        if final.finish_reason == "error":
            raise APIError(500, f"generation failed: {final.error}", code="engine_error")
        return completion_response(rid, self.model_name, final, chat)

    @staticmethod
    async def _first(gen, prompt_field: str) -> RequestOutput:
        """The first output; bad input surfaces here, before any byte of the answer is sent."""
        try:
            return await gen.__anext__()
        except ValueError as e:
            msg = str(e)
            code = "context_length_exceeded" if "context" in msg else None
            raise APIError(400, f"{prompt_field}: {msg}", param=prompt_field, code=code) from None
        except RuntimeError as e:
            raise APIError(503, f"engine unavailable: {e}", code="engine_unavailable") from None

    async def _stream(self, gen, first: RequestOutput, rid: str, chat: bool,
                      include_usage: bool) -> AsyncIterator[str]:
        created = int(time.time())
        chunk = dict(rid=rid, model=self.model_name, chat=chat, created=created)
        out = first
        try:
            if chat:
                yield sse(stream_chunk(role=True, **chunk))
            async for out in _chain(first, gen):
                if out.finish_reason == "error":
                    yield sse(error_body(f"generation failed: {out.error}", "internal_server_error",
                                         code="engine_error"))
                    break
                if out.delta_text or out.finished:
                    yield sse(stream_chunk(text=out.delta_text, finish_reason=finish_reason_of(out), **chunk))
            if include_usage:
                yield sse(usage_chunk(out=out, **chunk))
            yield SSE_DONE
        finally:
            await gen.aclose()  # no-op when finished; aborts the request when the client went away


async def _chain(first: RequestOutput, gen) -> AsyncIterator[RequestOutput]:
    yield first
    if not first.finished:
        async for out in gen:
            yield out


# ---- FastAPI app and its error handlers ------------------------------------------------------
app = FastAPI(title="specray", description="OpenAI-compatible LLM serving with speculative decoding")


def _error_response(status: int, message: str, param=None, code=None, type_=None) -> JSONResponse:
    type_ = type_ or APIError(status, message).type
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


@app.exception_handler(APIError)
async def _api_error(_: Request, e: APIError):
    return _error_response(e.status, e.message, e.param, e.code, e.type)


@app.exception_handler(RequestValidationError)
async def _validation_error(_: Request, e: RequestValidationError):
    errors = list(e.errors())
    if any(err.get("type") == "json_invalid" for err in errors):
        detail = errors[0].get("ctx", {}).get("error", "")
        return _error_response(400, f"malformed JSON body: {detail}".rstrip(": "), code="invalid_json")
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    return _error_response(422, validation_message(errors), param=loc[0] if loc else None, code=first.get("type"))


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, e: StarletteHTTPException):
    return _error_response(e.status_code, str(e.detail))


@app.exception_handler(Exception)
async def _internal_error(_: Request, e: Exception):
    log.exception("unhandled error")
    return _error_response(500, f"internal error: {type(e).__name__}: {e}")


def _respond(result):
    if isinstance(result, dict):
        return JSONResponse(result)
    return StreamingResponse(result, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@serve.deployment(name="OpenAIIngress", health_check_period_s=10, health_check_timeout_s=30)
@serve.ingress(app)
class OpenAIIngress:
    """One replica: an in-process engine (model loaded from the config) behind the HTTP routes."""

    def __init__(self, config: dict):
        from cluster.engine import LLMEngine

        cfg = EngineConfig.model_validate(config)
        engine = LLMEngine(cfg)
        self.server = OpenAIServer(AsyncLLMEngine(engine), cfg.model, engine.max_model_len)

    @app.get("/health")
    async def health(self):
        if not self.server.healthy():
            return _error_response(503, "engine is not running", code="engine_unavailable")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(self):
        return self.server.models()

    @app.post("/v1/completions")
    async def completions(self, req: CompletionRequest):
        return _respond(await self.server.handle(req, chat=False))

    @app.post("/v1/chat/completions")
    async def chat_completions(self, req: ChatCompletionRequest):
        return _respond(await self.server.handle(req, chat=True))

    def engine_stats(self) -> dict:
        """For tests and operators through a Serve handle: unfinished requests and free KV blocks."""
        eng = self.server.aeng.engine
        alloc = eng.allocator
        return {"has_unfinished": eng.has_unfinished(),
                "num_free_blocks": None if alloc is None else alloc.num_free_blocks,
                "num_blocks": None if alloc is None else alloc.num_blocks}

    def check_health(self):
        """Serve's replica health check: the engine thread must be alive."""
        if not self.server.healthy():
            raise RuntimeError("engine loop is not running")

    def __del__(self):
        server = getattr(self, "server", None)
        if server is not None:
            server.aeng.shutdown(timeout=5.0)


def build_app(config: EngineConfig, **deployment_options) -> serve.Application:
    """Config to Serve application (pure): ``serve.run(build_app(EngineConfig(...)))``."""
    dep = OpenAIIngress.options(**deployment_options) if deployment_options else OpenAIIngress
    return dep.bind(config.model_dump(mode="json"))
