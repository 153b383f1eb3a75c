"""gRPC ingress (``specray.v1.Generation``) on the same replica as the HTTP routes.

Ray Serve's gRPC proxy routes a call by its ``application`` metadata to the deployment method named
like the RPC (``Generate``, ``GenerateStream``). ``GrpcGenerationMixin`` gives the deployment those
methods. They turn the proto request into the HTTP side's request model and go through the same
``OpenAIServer.start``, so validation, defaults, admission control and error messages are one code
path for both protocols; the engine's ``RequestOutput``s then become protobufs directly
(``to_response``, ``to_chunks``). An ``APIError`` becomes a gRPC status (``grpc_code_of``) whose
details are the same message that names the bad field and value.
"""
from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, AsyncIterator

import grpc
from pydantic import ValidationError

from cluster.outputs import RequestOutput
from cluster.request import RequestError
from deployments.http_guard import bearer_matches
from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest, checked_logprobs_k
from deployments.openai_logprobs import LogprobFormatter
from deployments.openai_responses import finish_reason_of, prediction_counts, total_speculation, total_usage
from deployments.openai_tools import CallStream, answer_calls, calls_finish_reason
from deployments.protos import specray_pb2 as pb

if TYPE_CHECKING:
    from ray.serve.grpc_util import RayServegRPCContext

    from deployments.openai_server import Generation, OpenAIServer

SERVICER = "deployments.grpc_cancel.add_generation_servicer"

_GRPC_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.INVALID_ARGUMENT,
               422: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
               401: grpc.StatusCode.UNAUTHENTICATED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
               503: grpc.StatusCode.UNAVAILABLE, 500: grpc.StatusCode.INTERNAL}
_OPTIONAL_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "spec_tokens", "min_tokens",
                    "presence_penalty", "frequency_penalty", "repetition_penalty")


def grpc_options(port: int) -> dict:
    """``serve.start(grpc_options=...)`` that serves ``specray.v1.Generation`` on ``port`` (all interfaces:
    Serve's gRPC proxy has no host option)."""
    return {"port": port, "grpc_servicer_functions": [SERVICER]}


def grpc_code_of(status: int) -> grpc.StatusCode:
    """The gRPC status code for an HTTP status of ``APIError`` (UNKNOWN for one not in the table)."""
    return _GRPC_CODES.get(status, grpc.StatusCode.UNKNOWN)


def to_openai_request(msg: pb.GenerateRequest, stream: bool) -> tuple[CompletionRequest | ChatCompletionRequest, bool]:
    """The HTTP request model for a proto request, and whether it is a chat request. Token ids are
    always asked for; a stream always ends with usage."""
    if msg.HasField("prompt") == bool(msg.messages):
        which = "both" if msg.messages else "neither"
        raise APIError(400, f"prompt/messages: {which} given; give exactly one of prompt and messages",
                       param="prompt")
    fields: dict = {name: getattr(msg, name) for name in _OPTIONAL_FIELDS if msg.HasField(name)}
    fields.update(ignore_eos=msg.ignore_eos, include_stop_str_in_output=msg.include_stop_str_in_output,
                  return_token_ids=True)
    if msg.model:
        fields["model"] = msg.model
    if msg.stop:
        fields["stop"] = list(msg.stop)
    if msg.stop_token_ids:
        fields["stop_token_ids"] = list(msg.stop_token_ids)
    if msg.HasField("logprobs"):  # HTTP's two shapes of one ask: completions' k, chat's flag and k
        k = checked_logprobs_k(msg.logprobs, "logprobs")
        fields.update({"logprobs": True, "top_logprobs": k} if msg.messages else {"logprobs": k})
    if msg.HasField("prediction"):
        fields["prediction"] = {"type": "content", "content": msg.prediction}
    if msg.HasField("response_format"):
        fields["response_format"] = _json_field(msg.response_format, "response_format")
    fields.update(_tool_fields(msg))
    if stream:
        fields.update(stream=True, stream_options={"include_usage": True})
    try:
        if msg.messages:
            return ChatCompletionRequest(messages=[_message(m, i) for i, m in enumerate(msg.messages)], **fields), True
        return CompletionRequest(prompt=msg.prompt, **fields), False
    except ValidationError as e:
        err = RequestError.from_validation(e)
        raise APIError(400, str(err), param=err.field) from None


def _tool_fields(msg: pb.GenerateRequest) -> dict:
    """tools / tool_choice / parallel_tool_calls as HTTP chat's fields (400 naming the field when
    given without messages or not JSON)."""
    fields = {}
    if msg.HasField("tools"):
        fields["tools"] = _json_field(msg.tools, "tools")
    if msg.HasField("tool_choice"):
        mode = msg.tool_choice.strip()
        if mode not in ("none", "auto", "required") and not mode.startswith("{"):
            raise APIError(400, f"tool_choice={msg.tool_choice!r}: use none, auto, required or a JSON object naming "
                                'a function ({"type": "function", "function": {"name": ...}})', param="tool_choice")
        fields["tool_choice"] = mode if mode in ("none", "auto", "required") else _json_field(mode, "tool_choice")
    if msg.HasField("parallel_tool_calls"):
        fields["parallel_tool_calls"] = msg.parallel_tool_calls
    if fields and not msg.messages:
        name = next(iter(fields))
        raise APIError(400, f"{name}: tool calling needs messages (a chat request), not prompt", param=name)
    return fields


def _message(m: pb.ChatMessage, index: int) -> dict:
    """One proto chat message as HTTP's: its calls parsed (an assistant's empty content then absent)."""
    out = {"role": m.role, "content": m.content}
    if m.HasField("tool_calls"):
        out["tool_calls"] = _json_field(m.tool_calls, f"messages[{index}].tool_calls")
        out["content"] = m.content or None
    if m.HasField("tool_call_id"):
        out["tool_call_id"] = m.tool_call_id
    return out


def _calls(calls: list[dict] | None) -> list[pb.ToolCall]:
    return [pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in calls or ()]


def _json_field(text: str, name: str):
    """A string field that carries JSON, parsed (400 naming the field when it is not JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(400, f"{name}: not valid JSON ({e})", param=name) from None


def _usage(outs: list[RequestOutput]) -> pb.Usage:
    return pb.Usage(**total_usage(outs), **prediction_counts(outs))


def _speculation(outs: list[RequestOutput]) -> pb.Speculation:
    spec = total_speculation(outs)
    return pb.Speculation(num_drafts=spec["num_drafts"], num_draft_tokens=spec["num_draft_tokens"],
                          num_accepted_tokens=spec["num_accepted_tokens"],
                          accepted_per_pos=spec["accepted_per_pos"], acceptance_rate=spec["acceptance_rate"])


def to_response(rid: str, model: str, outs: list[RequestOutput], logprobs: list | None = None,
                fmt: LogprobFormatter | None = None, tools: frozenset[str] = frozenset()) -> pb.GenerateResponse:
    """The proto response from the final output of the request's (one) choice; ``logprobs``: its
    tokens' ``TokenLogprob``s when the request asked (``fmt`` names their tokens); ``tools``: the
    functions whose calls the answer is parsed for."""
    out = outs[0]
    calls = answer_calls(out.text, tools, out.finish_reason)
    return pb.GenerateResponse(id=rid, model=model, text="" if calls else out.text, token_ids=list(out.token_ids),
                               finish_reason=calls_finish_reason(calls, finish_reason_of(out)) or "",
                               usage=_usage(outs), speculation=_speculation(outs),
                               logprobs=fmt.by_id(logprobs) if logprobs else [], tool_calls=_calls(calls))


async def to_chunks(gen: Generation, model: str, fmt: LogprobFormatter | None = None,
                    tools: frozenset[str] = frozenset()) -> AsyncIterator[pb.GenerateChunk]:
    """Proto chunks from the engine's outputs as they arrive: one per output with new text or token
    ids (and their logprobs when the request asked; ``fmt`` names their tokens); the one with the
    finish reason is held back and also carries usage and speculation, so the last chunk has all
    three. With ``tools`` text that may still become calls is held (CallStream) and an answer of
    calls ends with them. A failed engine ends the stream with APIError (500, or 503 when the
    engine loop stopped)."""
    finals, held = list(gen.choices.firsts), None
    calling = CallStream(tools) if tools else None
    try:
        async with contextlib.aclosing(gen.choices.merged()) as merged:
            async for i, out in merged:
                finals[i] = out
                if out.finish_reason == "error":
                    raise APIError(500, f"generation failed: {out.error}")
                text, calls = out.delta_text or "", None
                if calling is not None:
                    text, calls = calling.step(text, out.finished, out.finish_reason)
                chunk = pb.GenerateChunk(id=gen.rid, model=model, delta_text=text,
                                         delta_token_ids=out.delta_token_ids or [],
                                         delta_logprobs=fmt.by_id(out.delta_logprobs) if out.delta_logprobs else [],
                                         tool_calls=_calls(calls))
                reason = calls_finish_reason(calls, finish_reason_of(out))
                if reason is not None:
                    chunk.finish_reason = reason
                    held = chunk
                elif chunk.delta_text or chunk.delta_token_ids:
                    yield chunk
    except RuntimeError as e:  # the engine loop failed or stopped under this request
        raise APIError(503, f"generation failed: {e}") from None
    last = held or pb.GenerateChunk(id=gen.rid, model=model)
    last.usage.CopyFrom(_usage(finals))
    last.speculation.CopyFrom(_speculation(finals))
    yield last


class GrpcGenerationMixin:
    """The ``specray.v1.Generation`` methods of the ingress deployment (needs ``self.server``)."""

    server: OpenAIServer

    async def Generate(self, request: pb.GenerateRequest,
                       grpc_context: RayServegRPCContext | None = None) -> pb.GenerateResponse:
        with _grpc_status(grpc_context):
            gen, tools = await self._start(request, grpc_context, stream=False)
            outs, logprobs = await gen.finish()
            return to_response(gen.rid, self.server.model_name, outs, logprobs[0], self.server.logprobs, tools)

    async def GenerateStream(self, request: pb.GenerateRequest,
                             grpc_context: RayServegRPCContext | None = None) -> AsyncIterator[pb.GenerateChunk]:
        with _grpc_status(grpc_context):
            gen, tools = await self._start(request, grpc_context, stream=True)
            # aclosing: a client that goes away aborts the engine request (frees its KV) at once
            async with contextlib.aclosing(gen):
                async for chunk in to_chunks(gen, self.server.model_name, self.server.logprobs, tools):
                    yield chunk

    async def _start(self, request: pb.GenerateRequest, grpc_context: RayServegRPCContext | None,
                     stream: bool) -> tuple[Generation, frozenset[str]]:
        """The started generation and the tools whose calls its answer is parsed for."""
        self._check_grpc_auth(grpc_context)
        req, chat = to_openai_request(request, stream=stream)
        gen = await self.server.start(req, chat)
        return gen, frozenset(req.tool_use().names)

    def _check_grpc_auth(self, grpc_context: RayServegRPCContext | None) -> None:
        """With an API key configured, the ``authorization: Bearer <key>`` metadata must match it."""
        key = self.server.api_key
        if key is None or grpc_context is None:
            return
        if not bearer_matches(dict(grpc_context.invocation_metadata()).get("authorization"), key):
            raise APIError(401, "authorization: missing or wrong API key; send the metadata "
                                "'authorization: Bearer <key>'", param="authorization", code="invalid_api_key")


class GrpcCallError(Exception):
    """Ends a gRPC call whose status is already set on its context. Ray pickles it on its way to the
    proxy, so it holds only the message (an ``APIError`` does not survive the round trip)."""


@contextlib.contextmanager
def _grpc_status(grpc_context: RayServegRPCContext | None):
    """Sets the gRPC status of an ``APIError`` on the call; Serve's proxy then answers with that code
    and the message as details."""
    try:
        yield
    except APIError as e:
        if grpc_context is None:  # called through a Serve handle, not the gRPC proxy
            raise
        grpc_context.set_code(grpc_code_of(e.status))
        grpc_context.set_details(e.message)
        raise GrpcCallError(e.message) from None
