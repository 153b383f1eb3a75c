"""OpenAI-compatible request models, response builders and the error body.

Requests are pydantic models with unknown fields forbidden (a typo such as ``max_token`` is an
error, not silently ignored). Value ranges are checked when a request becomes the engine's prompt
and ``SamplingParams`` (``to_engine``: the OpenAI-only checks, then the one request mapping of
``cluster.request``, one SamplingParams per choice), so a bad value is answered 400 with the field
and value named; schema errors (wrong type, missing or unknown field) are FastAPI's 422, in the
OpenAI error body. An omitted ``max_tokens`` means "until the context ends" (OpenAI's chat
semantics; vLLM does the same), capped by the model's context.
"""
from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from actors.sampling_params import MAX_LOGPROBS, SamplingParams
from cluster.outputs import RequestOutput
from cluster.request import SAMPLING_FIELDS, Prompt, RequestError, engine_prompt, sampling_params


MAX_N = 16  # choices per request


class APIError(Exception):
    """An error answered with the OpenAI error body; ``retry_after_s`` (overload, draining) becomes
    HTTP's Retry-After header."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None, retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or _ERROR_TYPES.get(status, "invalid_request_error")
        self.retry_after_s = retry_after_s


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
                500: "internal_server_error", 503: "service_unavailable_error"}


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# ---- requests ------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str
    name: str | None = None


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False  # extension
    spec_tokens: int | None = None  # extension: None = engine policy, 0 = no speculation, K = chain length
    return_token_ids: bool = False  # extension (as vLLM): output token ids in each choice / chunk
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def to_engine(self, max_model_len: int) -> tuple[Prompt, list[SamplingParams]]:
        """The engine prompt and one SamplingParams per choice (choice i gets seed + i when a seed is
        given), after every check (APIError 400 naming the field). Without max_tokens a choice runs
        until EOS, a stop string or the context end."""
        with _as_api_error():
            prompt = engine_prompt(self.prompt_fields())
            self.check_supported(max_model_len)
            fields = self.model_dump(include=set(SAMPLING_FIELDS))
            fields.update(max_tokens=self.requested_max_tokens, logprobs=self.logprobs_k())
            base = sampling_params(fields, default_max_tokens=max_model_len)
        if self.seed is None:
            return prompt, [base] * self.n
        return prompt, [base.model_copy(update={"seed": self.seed + i}) for i in range(self.n)]

    def prompt_fields(self) -> dict:
        """``{"prompt": ...}`` or ``{"messages": ...}`` (checked per subclass)."""
        raise NotImplementedError

    def logprobs_k(self) -> int | None:
        """Alternatives per token the request asks for, None = no logprobs (checked per subclass)."""
        return None

    def check_supported(self, max_model_len: int) -> None:
        if not 1 <= self.n <= MAX_N:
            raise APIError(400, f"n={self.n}: must be between 1 and {MAX_N} choices per request", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise APIError(400, f"{name}={getattr(self, name)}: only 0 is supported", param=name)
        if self.requested_max_tokens is not None and self.requested_max_tokens > max_model_len:
            raise APIError(400, f"max_tokens={self.requested_max_tokens} exceeds the model's context of {max_model_len} "
                                f"tokens", param="max_tokens")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int]
    echo: bool = False
    logprobs: int | None = Field(None, strict=True)  # alternatives per token; the chosen one always comes too

    def logprobs_k(self) -> int | None:
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"logprobs={self.logprobs}: must be between 0 and {MAX_LOGPROBS}", param="logprobs")
        return self.logprobs

    def prompt_fields(self) -> dict:
        p = self.prompt
        if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            if len(p) != 1:
                raise APIError(400, f"prompt: a list of {len(p)} prompts; only one prompt per request is "
                                    f"supported", param="prompt")
            p = p[0]
        if self.echo:
            raise APIError(400, "echo=true is not supported", param="echo")
        return {"prompt": p}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def logprobs_k(self) -> int | None:
        k = self.top_logprobs
        if k is not None and not self.logprobs:
            raise APIError(400, f"top_logprobs={k}: needs logprobs=true", param="top_logprobs")
        if k is not None and not 0 <= k <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs={k}: must be between 0 and {MAX_LOGPROBS}", param="top_logprobs")
        return (k or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def prompt_fields(self) -> dict:
        return {"messages": self.messages}


@contextmanager
def _as_api_error():
    """A bad field found by the request mapping, answered 400 naming it."""
    try:
        yield
    except RequestError as e:
        raise APIError(400, str(e), param=e.field) from None


# ---- responses -----------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_of(out: RequestOutput) -> dict:
    return {"prompt_tokens": out.num_prompt_tokens, "completion_tokens": out.num_output_tokens,
            "total_tokens": out.num_prompt_tokens + out.num_output_tokens}


def speculation_of(out: RequestOutput) -> dict:
    rate = out.num_accepted_tokens / out.num_draft_tokens if out.num_draft_tokens else None
    return {"num_drafts": out.num_drafts, "num_draft_tokens": out.num_draft_tokens,
            "num_accepted_tokens": out.num_accepted_tokens, "acceptance_rate": rate,
            "accepted_per_pos": list(out.accepted_per_pos)}


def total_usage(outs: list[RequestOutput]) -> dict:
    """Usage of a request with ``len(outs)`` choices: the shared prompt counted once."""
    prompt, completion = outs[0].num_prompt_tokens, sum(o.num_output_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def total_speculation(outs: list[RequestOutput]) -> dict:
    """Speculation counters summed over the choices (one choice: that choice's own)."""
    if len(outs) == 1:
        return speculation_of(outs[0])
    per_pos = [0] * max(len(o.accepted_per_pos) for o in outs)
    for o in outs:
        for i, count in enumerate(o.accepted_per_pos):
            per_pos[i] += count
    drafted, accepted = sum(o.num_draft_tokens for o in outs), sum(o.num_accepted_tokens for o in outs)
    return {"num_drafts": sum(o.num_drafts for o in outs), "num_draft_tokens": drafted,
            "num_accepted_tokens": accepted, "acceptance_rate": accepted / drafted if drafted else None,
            "accepted_per_pos": per_pos}


def finish_reason_of(out: RequestOutput) -> str | None:
    if not out.finished:
        return None
    return {"abort": "abort", "error": "error"}.get(out.finish_reason, out.finish_reason)


def choice_body(index: int, out: RequestOutput, chat: bool, logprobs: dict | None = None,
                token_ids: bool = False) -> dict:
    """One choice of a non-streaming answer."""
    if chat:
        choice = {"index": index, "message": {"role": "assistant", "content": out.text},
                  "logprobs": logprobs, "finish_reason": finish_reason_of(out)}
    else:
        choice = {"index": index, "text": out.text, "logprobs": logprobs, "finish_reason": finish_reason_of(out)}
    if token_ids:
        choice["token_ids"] = list(out.token_ids)
    return choice


def completion_response(rid: str, model: str, choices: list[dict], outs: list[RequestOutput], chat: bool) -> dict:
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": total_usage(outs), "speculation": total_speculation(outs)}


def stream_chunk(rid: str, model: str, chat: bool, index: int = 0, text: str | None = None,
                 finish_reason: str | None = None, role: bool = False, created: int | None = None,
                 token_ids: list[int] | None = None, logprobs: dict | None = None) -> dict:
    """One SSE chunk with one choice, ``index`` (``text`` None and ``role`` set: the chat opening chunk)."""
    if chat:
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created or int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(rid: str, model: str, chat: bool, outs: list[RequestOutput], created: int | None = None) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, usage and speculation."""
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created or int(time.time()), "model": model, "choices": [],
            "usage": total_usage(outs), "speculation": total_speculation(outs)}


def models_response(model: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "specray"}]}
