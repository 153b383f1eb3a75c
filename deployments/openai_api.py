"""OpenAI-compatible request models and the error body (responses: ``deployments.openai_responses``).

Requests are pydantic models with unknown fields forbidden (a typo such as ``max_token`` is an
error, not silently ignored). Every field of OpenAI's requests is in the conformance table
(``deployments.openai_fields``): the implemented ones are typed here, the accepted-and-ignored and
the rejected ones (a 400 naming the field) are declared from the table. Value ranges are checked
when a request becomes the engine's prompts and ``SamplingParams`` (``to_engine``: the OpenAI-only
checks, then the one request mapping of ``cluster.request``: the prompts, and one SamplingParams per
choice of each), so a bad value is answered 400 with the field and value named; schema errors
(wrong type, missing or unknown field) are FastAPI's 422, in the OpenAI error body. An omitted
``max_tokens`` means "until the context ends" (OpenAI's chat semantics; vLLM does the same), capped
by the model's context.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, create_model

from actors.sampling_params import MAX_LOGPROBS, SamplingParams
from actors.structured_output import StructuredOutput
from cluster.request import (SAMPLING_FIELDS, Prompt, RequestError, chat_messages, content_text, engine_prompt,
                             sampling_params, structured_output)
from deployments.openai_fields import check_message, check_policy, policy_fields
from deployments.openai_tools import Tool, ToolChoice, ToolUse

MAX_N = 16  # choices per request
MAX_TEMPERATURE = 2.0  # OpenAI's range: [0, 2]


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
def _not_bool(v):
    if isinstance(v, bool):
        raise ValueError("must be a number, not a boolean")
    return v


Int = Annotated[int, BeforeValidator(_not_bool)]  # JSON true is not 1
Float = Annotated[float, BeforeValidator(_not_bool)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False  # extension (vLLM): with include_usage, usage on every chunk
    include_obfuscation: Any = None  # accepted and ignored


class ContentPart(BaseModel):
    """One part of a message's content; only ``text`` parts are accepted (cluster.request.content_text)."""
    model_config = ConfigDict(extra="allow")
    type: str
    text: Any = None


class Prediction(BaseModel):
    """OpenAI's predicted outputs: text the answer is expected to repeat (lookup drafts from it)."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return content_text(self.content, "prediction", "prediction")


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the answer matches ``schema`` (always strictly)."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # left out: any JSON object
    strict: bool | None = None  # accepted: the answer always matches the schema


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format`` (text, json_object, json_schema) and the structured outputs of
    vLLM and SGLang as extensions: ``{"type": "regex", "regex": ...}``, ``{"type": "grammar",
    "grammar": ...}`` (Lark), ``{"type": "choice", "choice": [...]}``."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema", "regex", "grammar", "choice"]
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None

    def structured(self) -> StructuredOutput | None:
        """The engine's constraint (None: free text), by the one mapping of cluster.request."""
        return structured_output(self.model_dump(by_alias=True, exclude_none=True))


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]  # function: a 400
    content: str | list[ContentPart] | None = None  # None: only an assistant's message with tool_calls
    name: str | None = None  # accepted and ignored (deployments.openai_fields), as the rest below
    tool_call_id: str | None = None
    tool_calls: Any = None
    function_call: Any = None
    audio: Any = None
    refusal: Any = None

    def check_supported(self, index: int) -> None:
        """RequestError naming a field of this message the server cannot honour (``audio``, ...), or
        a message without content that is not an assistant's with tool calls."""
        check_message(dict(self), index)
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise RequestError(f"messages[{index}]: content is missing (only an assistant message with tool_calls "
                               "may leave it out)", "messages")
        if self.tool_calls is not None and not isinstance(self.tool_calls, list):
            raise RequestError(f"messages[{index}].tool_calls must be a list of calls", "messages")
        if self.tool_calls and self.role != "assistant":
            raise RequestError(f"messages[{index}]: only assistant messages carry tool_calls", "messages")


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions; the ignored and rejected ones come from
    the conformance table (``deployments.openai_fields``) through each endpoint's policy base."""

    model_config = ConfigDict(extra="forbid")
    CHAT: ClassVar[bool] = False

    model: str | None = None
    max_tokens: Int | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int | None = None  # extension
    min_p: Float | None = None  # extension (vLLM)
    seed: Int | None = None
    stop: str | list[str] | None = None
    n: Int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension
    spec_tokens: Int | None = None  # extension: None = engine policy, 0 = no speculation, K = chain length
    return_token_ids: bool = False  # extension (as vLLM): output token ids in each choice / chunk
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    repetition_penalty: Float | None = None  # extension (vLLM)
    logit_bias: dict[str, Float] | None = None  # {token id: bias}; ids checked by SamplingParams and the engine
    min_tokens: Int | None = None  # extension (vLLM)
    stop_token_ids: list[Int] | None = None  # extension (vLLM)
    include_stop_str_in_output: bool | None = None  # extension (vLLM)
    prediction: Prediction | None = None  # OpenAI's predicted outputs (chat; completions: extension)
    response_format: ResponseFormat | None = None  # structured output (chat; completions: extension)

    def to_engine(self, max_model_len: int) -> tuple[list[Prompt], list[SamplingParams]]:
        """The engine prompts (one, or a completion request's list) and the SamplingParams of each
        prompt's n choices (choice j gets seed + j when a seed is given), after every check (APIError
        400 naming the field). Choice j of prompt i is the answer's choice i * n + j. Without
        max_tokens a choice runs until EOS, a stop string or the context end."""
        with _as_api_error():
            check_policy(dict(self), self.CHAT)
            prompts = [engine_prompt(fields) for fields in self.prompt_fields()]
            self.check_supported(max_model_len)
            fields = self.model_dump(include=set(SAMPLING_FIELDS))
            fields.update(max_tokens=self.requested_max_tokens, logprobs=self.logprobs_k(),
                          prompt_logprobs=self.prompt_logprobs_k(), prediction=self.prediction_text(),
                          structured=self.tool_use().constrained(self.response_format))
            base = sampling_params(fields, default_max_tokens=max_model_len)
        if self.seed is None:
            return prompts, [base] * self.n
        return prompts, [base.model_copy(update={"seed": self.seed + i}) for i in range(self.n)]

    def prompt_fields(self) -> list[dict]:
        """``[{"prompt": ...}, ...]`` or ``[{"messages": ...}]`` (checked per subclass)."""
        raise NotImplementedError

    def logprobs_k(self) -> int | None:
        """Alternatives per token the request asks for, None = no logprobs (checked per subclass)."""
        return None

    def prompt_logprobs_k(self) -> int | None:
        """The same for the prompt's tokens (completions' echo), None = not computed."""
        return None

    def tool_use(self) -> ToolUse:
        """The request's tools and tool_choice (chat only; none here)."""
        return ToolUse()

    def prediction_text(self) -> str | None:
        """The predicted output's text, None = none."""
        return None if self.prediction is None else self.prediction.text()

    @property
    def prompt_only(self) -> bool:
        """The answer is the echoed prompt alone (completions' echo with max_tokens 0)."""
        return False

    def check_supported(self, max_model_len: int) -> None:
        if not 1 <= self.n <= MAX_N:
            raise APIError(400, f"n={self.n}: must be between 1 and {MAX_N} choices per request", param="n")
        if self.temperature is not None and not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise APIError(400, f"temperature={self.temperature}: must be between 0 and {MAX_TEMPERATURE:g} "
                                f"(0 = greedy)", param="temperature")
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

    @property
    def continuous_usage(self) -> bool:
        """Usage so far on every chunk (``stream_options.continuous_usage_stats`` with include_usage)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


_CompletionPolicy = create_model("_CompletionPolicy", **policy_fields(chat=False))
_ChatPolicy = create_model("_ChatPolicy", **policy_fields(chat=True))


class CompletionRequest(SamplingRequest, _CompletionPolicy):
    prompt: str | list
    logprobs: Int | None = Field(None, strict=True)  # alternatives per token; the chosen one always comes too
    echo: bool = False  # the prompt before the completion (with logprobs: the prompt tokens' too)

    def logprobs_k(self) -> int | None:
        return None if self.logprobs is None else checked_logprobs_k(self.logprobs, "logprobs")

    def prompt_logprobs_k(self) -> int | None:
        return self.logprobs_k() if self.echo else None

    @property
    def prompt_only(self) -> bool:
        return self.echo and self.max_tokens == 0

    @property
    def requested_max_tokens(self) -> int | None:  # the prompt alone: one token is generated and dropped
        return 1 if self.prompt_only else self.max_tokens

    def check_supported(self, max_model_len: int) -> None:
        super().check_supported(max_model_len)
        if self.prompt_only and self.stream:
            raise APIError(400, "max_tokens=0 (the echoed prompt alone) is answered with stream=false only",
                           param="max_tokens")

    def prompt_fields(self) -> list[dict]:
        """Text, token ids, or a list of either (OpenAI's batch forms: each prompt gets its n choices)."""
        p = self.prompt
        several = isinstance(p, list) and bool(p) and all(isinstance(x, (str, list)) for x in p)
        prompts = p if several else [p]
        for i, one in enumerate(prompts):
            where = f"prompt[{i}]" if several else "prompt"
            if isinstance(one, list):
                bad = next((x for x in one if isinstance(x, bool) or not isinstance(x, int)), None)
                if bad is not None:
                    raise APIError(400, f"{where}: {json.dumps(bad)} is not a token id; a prompt is a string, a "
                                        f"list of token ids (integers) or a list of either", param="prompt")
        return [{"prompt": one} for one in prompts]


class ChatCompletionRequest(SamplingRequest, _ChatPolicy):
    CHAT: ClassVar[bool] = True

    messages: list[ChatMessage]
    max_completion_tokens: Int | None = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    # extensions (vLLM): how the chat template renders the messages, and the answer after the last one
    add_generation_prompt: bool = True  # open an assistant turn after the messages
    continue_final_message: bool = False  # the answer continues the last (assistant) message
    echo: bool = False  # a last assistant message's content before each choice's content
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    _tool_use: ToolUse | None = PrivateAttr(None)  # checked once: to_engine, the prompt and the answer read it

    def check_supported(self, max_model_len: int) -> None:
        super().check_supported(max_model_len)
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise APIError(400, "continue_final_message=true: needs add_generation_prompt=false (an answer "
                                    "cannot both continue the last message and open a new turn)",
                               param="continue_final_message")
            if self.messages[-1].role != "assistant":
                raise APIError(400, f"continue_final_message=true: the last message must be the assistant's to "
                                    f"continue, got role {self.messages[-1].role!r}", param="continue_final_message")

    @property
    def template_options(self) -> dict | None:
        """The chat template's options where they differ from the default (None: the default render)."""
        if self.add_generation_prompt and not self.continue_final_message:
            return None
        return {"add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message}

    @property
    def echoed(self) -> str | None:
        """What each choice's content starts with under ``echo``: the last message's, if the assistant's."""
        last = self.messages[-1]
        if not self.echo or last.role != "assistant":
            return None
        return chat_messages([last])[0]["content"]

    def logprobs_k(self) -> int | None:
        k = self.top_logprobs
        if k is not None and not self.logprobs:
            raise APIError(400, f"top_logprobs={k}: needs logprobs=true", param="top_logprobs")
        if k is not None:
            checked_logprobs_k(k, "top_logprobs")
        return (k or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def prompt_fields(self) -> list[dict]:
        for i, m in enumerate(self.messages):
            m.check_supported(i)
        return [{"messages": self.tool_use().conversation(self.messages)}]

    def tool_use(self) -> ToolUse:
        if self._tool_use is None:
            with _as_api_error():
                self._tool_use = ToolUse(tools=self.tools or [], choice=self.tool_choice,
                                         parallel=self.parallel_tool_calls is not False).checked()
        return self._tool_use


def checked_logprobs_k(k: int, field: str) -> int:
    """``k`` alternatives per token, within 0 to MAX_LOGPROBS (else APIError 400 naming ``field``)."""
    if not 0 <= k <= MAX_LOGPROBS:
        raise APIError(400, f"{field}={k}: must be between 0 and {MAX_LOGPROBS}", param=field)
    return k


@contextmanager
def _as_api_error():
    """A bad field found by the request mapping, answered 400 naming it."""
    try:
        yield
    except RequestError as e:
        raise APIError(400, str(e), param=e.field) from None
