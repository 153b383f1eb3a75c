"""The response bodies of the OpenAI routes, declared in the OpenAPI document.

FastAPI only knows that the routes return "something" (they answer JSONResponse or an SSE stream),
so its document had empty 200 bodies and FastAPI's own 422 shape, which this server never sends.
``openapi_document(app)`` (``app.openapi``) generates the document as usual, then gives each route
its real answers: the completion / chat completion body, the SSE stream (``text/event-stream``,
each ``data:`` line one chunk of ``x-sse-data``'s schema, then ``data: [DONE]``), and the OpenAI
error body for every error status the route can answer, with ``Retry-After`` where it is sent.
Generated clients and API fuzzers can then check responses. The models here describe what
``deployments.openai_responses`` builds; tests validate real answers against the document.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Body):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Body):
    error: ErrorDetail


class PromptTokensDetails(_Body):
    cached_tokens: int  # prompt tokens served from the prefix cache (device or host KV tier)


class CompletionTokensDetails(_Body):
    """Requests with a ``prediction`` (OpenAI's predicted outputs): its tokens that the answer
    repeats and those it does not."""
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(_Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # answers and the final usage chunk
    completion_tokens_details: CompletionTokensDetails | None = None  # requests with a prediction


class Speculation(_Body):
    """Extension: speculative decoding counters of the request (all choices)."""
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float | None
    accepted_per_pos: list[int]


class CompletionLogprobs(_Body):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(_Body):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Body):
    content: list[TokenLogprob]
    refusal: None


class CompletionChoice(_Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    token_ids: list[int] | None = None  # extension: with return_token_ids


class Completion(_Body):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    speculation: Speculation


class AssistantMessage(_Body):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Body):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    token_ids: list[int] | None = None


class ChatCompletion(_Body):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculation: Speculation


class CompletionChunk(_Body):
    """One SSE ``data:`` line of a streamed completion; the last (with include_usage) has no choices."""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None  # the last chunk, or every chunk with continuous_usage_stats
    speculation: Speculation | None = None


class ChatDelta(_Body):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Body):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Body):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculation: Speculation | None = None


class Model(_Body):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Body):
    object: Literal["list"]
    data: list[Model]


class Health(_Body):
    status: Literal["ok"]


_ERRORS = {
    400: "bad value, unsupported field, context exceeded or malformed JSON",
    401: "missing or wrong API key (when the server has one)",
    404: "unknown model",
    413: "request body larger than max_request_bytes",
    422: "wrong type, missing or unknown field",
    429: "the replica is full; retry after Retry-After seconds",
    500: "generation failed",
    503: "draining or engine down; retry after Retry-After seconds",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}

# (path, method) -> (JSON body of a 200, SSE chunk of a 200 or None, error statuses)
ROUTES: dict[tuple[str, str], tuple[type[BaseModel], type[BaseModel] | None, tuple[int, ...]]] = {
    ("/v1/completions", "post"): (Completion, CompletionChunk, (400, 401, 404, 413, 422, 429, 500, 503)),
    ("/v1/chat/completions", "post"): (ChatCompletion, ChatCompletionChunk, (400, 401, 404, 413, 422, 429, 500, 503)),
    ("/v1/models", "get"): (ModelList, None, (401,)),
    ("/v1/models/{model}", "get"): (Model, None, (401, 404)),
    ("/health", "get"): (Health, None, (503,)),
}


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _responses(body: type[BaseModel], chunk: type[BaseModel] | None, errors: tuple[int, ...]) -> dict:
    ok: dict[str, Any] = {"description": "the answer", "content": {"application/json": {"schema": _ref(body)}}}
    if chunk is not None:
        ok["description"] = "the answer; with stream: true, server-sent events"
        ok["content"]["text/event-stream"] = {
            "schema": {"type": "string", "description": f"`data: <{chunk.__name__} JSON>` lines (an error body "
                                                        f"if generation fails mid-stream), then `data: [DONE]`"},
            "x-sse-data": _ref(chunk)}
    out = {"200": ok}
    for status in errors:
        out[str(status)] = {"description": _ERRORS[status],
                            "content": {"application/json": {"schema": _ref(ErrorResponse)}}}
        if status in (429, 503):
            out[str(status)]["headers"] = _RETRY_AFTER
    return out


def openapi_document(app) -> dict:
    """``app.openapi``: FastAPI's document with the routes' real responses (built once, cached)."""
    from fastapi.openapi.utils import get_openapi

    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        models = {m for body, chunk, _ in ROUTES.values() for m in (body, chunk) if m is not None} | {ErrorResponse}
        _, defs = models_json_schema([(m, "serialization") for m in sorted(models, key=lambda m: m.__name__)],
                                     ref_template="#/components/schemas/{model}")
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(defs["$defs"])
        for (path, method), spec in ROUTES.items():
            op = doc.get("paths", {}).get(path, {}).get(method)
            if op is not None:
                op["responses"] = _responses(*spec)
        for unused in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 shape: never sent
            if f"#/components/schemas/{unused}\"" not in json.dumps(doc["paths"]):
                schemas.pop(unused, None)
        app.openapi_schema = doc
    return app.openapi_schema
