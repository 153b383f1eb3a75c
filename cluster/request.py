"""From an external request to what the engine takes: a prompt and its ``SamplingParams``.

Every edge names its fields its own way (an OpenAI body, a gRPC message, a batch line, command-line
flags) and checks what only it has (``n``, ``echo``, ``stream_options``, strict JSON types, ...).
Then it hands the common fields to this one mapping:

- ``prompt`` (text or token ids) or ``messages`` (chat: ``[{"role", "content"}]``), exactly one;
- the sampling fields (``SAMPLING_FIELDS``), where None means "not given": SamplingParams' default
  applies, and ``max_tokens`` gets the edge's own default (the context, a ``--max-tokens`` flag).
  Generation also stops where the context ends; an edge that must refuse a prompt + max_tokens over
  the context instead (OpenAI's rule) asks the engine to (``add_request(..., fit_max_tokens=True)``).

A message's ``content`` is text, or a list of content parts of which only ``{"type": "text"}`` ones
are accepted (OpenAI's form; joined with newlines, as vLLM does for text-only models).

A bad value raises ``RequestError``, a ValueError whose message names the field and the value (the
request style of ``cluster.validation``) and whose ``field`` is OpenAI's ``param``; each edge turns it
into its own answer (HTTP 400, a gRPC status, an error line, exit code 2).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from actors.sampling_params import SamplingParams
from actors.structured_output import StructuredOutput
from cluster.validation import REQUEST, first_field, format_validation_error

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "ignore_eos",
                   "spec_tokens", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
                   "logit_bias", "min_tokens", "prompt_logprobs", "stop_token_ids", "include_stop_str_in_output",
                   "prediction", "structured")

Prompt = str | list[int] | list[dict]


class RequestError(ValueError):
    """A bad request field: the message names it and its value, ``field`` is the field's name."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field

    @classmethod
    def from_validation(cls, err: ValidationError) -> RequestError:
        return cls(format_validation_error(err, REQUEST), first_field(err))


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """What ``LLMEngine.add_request`` takes for one external request."""

    prompt: Prompt
    params: SamplingParams

    @property
    def chat(self) -> bool:
        return is_chat(self.prompt)

    @property
    def field(self) -> str:
        """The request field the prompt came from (errors about the prompt name it)."""
        return "messages" if self.chat else "prompt"


def is_chat(prompt: Prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def chat_messages(messages: Sequence) -> list[dict]:
    """``[{"role", "content"}]`` from messages given as mappings or as objects with ``role`` and
    ``content`` (pydantic models, protobuf messages); mappings keep their other keys."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise RequestError(f"messages={messages!r}: must be a list of {{role, content}} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping):
            msg = dict(m)
        elif hasattr(m, "role") and hasattr(m, "content"):
            msg = {"role": m.role, "content": m.content}
        else:
            raise RequestError(f"messages: {m!r} is not a {{role, content}} object", "messages")
        if isinstance(msg.get("content"), (list, tuple)):
            msg["content"] = content_text(msg["content"], f"messages[{i}]")
        out.append(msg)
    return out


def content_text(parts: Sequence, where: str, field: str = "messages") -> str:
    """The text of a message's content parts (mappings or objects with ``type`` and ``text``): the
    ``text`` parts joined with newlines; any other kind (image, audio, file) is refused, naming
    ``field``."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
        if kind != "text":
            raise RequestError(f"{where}.content[{j}]: content parts of type {kind!r} are not supported (this "
                               f"server reads text only); send {{\"type\": \"text\", \"text\": ...}} parts", field)
        if not isinstance(text, str):
            raise RequestError(f"{where}.content[{j}]: a 'text' part needs a string 'text', got {text!r}", field)
        texts.append(text)
    return "\n".join(texts)


def engine_prompt(fields: Mapping[str, Any]) -> Prompt:
    """The prompt of ``fields``: exactly one of ``prompt`` (text or token ids) and ``messages``
    (chat), not empty."""
    prompt, messages = fields.get("prompt"), fields.get("messages")
    if (prompt is None) == (messages is None):
        got = "both" if prompt is not None else "neither"
        raise RequestError(f"give exactly one of 'prompt' (text) or 'messages' (chat), got {got}", "prompt")
    if messages is None:
        if isinstance(prompt, (str, list)) and not prompt:
            raise RequestError("prompt is empty: give at least one token", "prompt")
        return prompt  # any other type: the engine's encoder names it
    if isinstance(messages, (list, tuple)) and not messages:
        raise RequestError("messages=[]: give at least one message", "messages")
    return chat_messages(messages)


def sampling_params(fields: Mapping[str, Any], default_max_tokens: int) -> SamplingParams:
    """SamplingParams from the sampling fields of ``fields`` that are given (not None); other keys
    are ignored. ``max_tokens`` not given: ``default_max_tokens``."""
    given = {k: fields[k] for k in SAMPLING_FIELDS if fields.get(k) is not None}
    given.setdefault("max_tokens", default_max_tokens)
    try:
        return SamplingParams(**given)
    except ValidationError as e:
        raise RequestError.from_validation(e) from None


STRUCTURED_TYPES = ("json_schema", "regex", "grammar", "choice")  # response_format types with a field of their own


def structured_output(fmt: Any) -> StructuredOutput | None:
    """The engine's constraint for an OpenAI-shaped ``response_format`` object: ``{"type": "text"}``
    (None), ``json_object``, ``json_schema`` (``{"name", "schema"}``; without a schema any JSON
    object) and the extensions ``regex``, ``grammar`` (Lark) and ``choice``, each type's value in the
    field named after it. RequestError naming response_format for a wrong shape or value."""
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "json_object", *STRUCTURED_TYPES):
        raise RequestError(f"response_format={fmt!r}: must be an object with type text, json_object, json_schema, "
                           f"regex, grammar or choice", "response_format")
    kind = fmt["type"]
    given = [k for k in STRUCTURED_TYPES if fmt.get(k) is not None]
    if kind in STRUCTURED_TYPES and kind not in given:
        raise RequestError(f"response_format: type {kind!r} needs its {kind!r} field", "response_format")
    extra = [k for k in given if k != kind]
    if extra:
        raise RequestError(f"response_format: type {kind!r} takes no {extra[0]!r} field", "response_format")
    if kind == "text":
        return None
    value = fmt.get(kind)
    if kind == "json_schema":
        if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
            raise RequestError("response_format.json_schema: must be an object with a string 'name' and an "
                               "optional 'schema'", "response_format")
        value = value.get("schema")
    if kind == "json_object" or value is None:
        return StructuredOutput(kind="json_object")
    try:
        return StructuredOutput(kind=kind, value=value)
    except ValidationError as e:
        msg = e.errors()[0]["msg"].removeprefix("Value error, ")
        raise RequestError(f"response_format ({kind}): {msg}", "response_format") from None


def engine_request(fields: Mapping[str, Any], default_max_tokens: int) -> EngineRequest:
    """The prompt, then the sampling parameters, of one external request (RequestError on the first
    bad field)."""
    return EngineRequest(engine_prompt(fields), sampling_params(fields, default_max_tokens))
