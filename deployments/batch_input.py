"""Input lines of a batch job: one JSON object per line, validated into engine requests or errors.

A line is ``{"id": ..., "prompt": "..."}`` or ``{"id": ..., "messages": [...]}`` plus optional
sampling fields, ``response_format`` and (messages lines) ``tools`` / ``tool_choice`` /
``parallel_tool_calls`` as HTTP chat takes them. Types are strict (``"max_tokens": "8"`` is an
error, not silently 8) and unknown fields are errors, so a typo never runs with a default; then the
line goes through the one request mapping (``cluster.request``: exactly one of prompt and messages, value ranges).
A bad line becomes an error result naming the field and value, and the job goes on.

Each line has a resume key: its id, or its line number when it has no valid id (so an error line
for unparsable JSON is not redone either). Ids are compared as JSON values: ``1`` and ``"1"`` differ.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pydantic import (BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      field_validator)

from actors.sampling_params import SamplingParams
from cluster.prompt_file import json_lines
from cluster.request import RequestError, engine_request, is_chat
from deployments.openai_api import ChatMessage, ResponseFormat
from deployments.openai_tools import Tool, ToolChoice, ToolUse


class BatchLine(BaseModel):
    """Schema of one input line (types only; ranges are checked by SamplingParams)."""

    model_config = ConfigDict(extra="forbid")

    id: str | int
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool | None = None
    spec_tokens: StrictInt | None = None
    ignore_eos: StrictBool | None = None
    prediction: StrictStr | None = None  # text the answer is expected to repeat: lookup drafts from it
    response_format: ResponseFormat | None = None  # structured output, as HTTP's (json_schema, ...)
    tools: list[Tool] | None = None  # tool calling, as HTTP chat's (messages lines only)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _check_id(cls, v):
        if not is_valid_id(v):
            raise ValueError("must be a non-empty string or an integer")
        return v

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, v):
        strings = isinstance(v, list) and all(isinstance(x, str) for x in v)
        if v is not None and not isinstance(v, str) and not strings:
            raise ValueError("must be a string or a list of strings")
        return v


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """A valid line, ready for ``LLMEngine.add_request``."""

    line: int
    id: str | int
    prompt: str | list[dict]
    params: SamplingParams
    tool_names: frozenset[str] = frozenset()  # the tools whose calls the answer is parsed for

    @property
    def field(self) -> str:
        return "messages" if is_chat(self.prompt) else "prompt"


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    id: str | int | None
    error: str

    def record(self) -> dict:
        return {"id": self.id, "line": self.line, "error": self.error}


def resume_key(id_: str | int | None, line: int) -> tuple[str, str | int]:
    return ("id", json.dumps(id_)) if id_ is not None else ("line", line)


def is_valid_id(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (str, int)) and v != ""


def valid_id(obj) -> str | int | None:
    """The line's id when it is a usable one (a non-empty string or an integer), else None."""
    v = obj.get("id") if isinstance(obj, dict) else None
    return v if is_valid_id(v) else None


class LineReader:
    """Turns input lines into requests or errors, skipping those whose results are already written.

    ``done``: how many results the output already holds per resume key (a Counter, consumed)."""

    def __init__(self, path: Path, done: Counter, default_max_tokens: int):
        self.path, self.done, self.default_max_tokens = path, done, default_max_tokens
        self.seen: dict[str | int, int] = {}  # id -> line it first appeared on (skipped and bad lines too)
        self.num_skipped = 0

    def __iter__(self) -> Iterator[BatchRequest | LineError]:
        for line in json_lines(self.path):
            n, obj, err = line.number, line.value, line.error
            id_ = valid_id(obj)
            key = resume_key(id_, n)
            if self.done[key] > 0:
                self.done[key] -= 1
                self.num_skipped += 1
                if id_ is not None:
                    self.seen.setdefault(id_, n)
                continue
            yield LineError(n, None, err) if err else self.parse(n, obj, id_)

    def parse(self, n: int, obj, id_: str | int | None) -> BatchRequest | LineError:
        if not isinstance(obj, dict):
            return LineError(n, None, f"line must be a JSON object, got {type(obj).__name__}: {_short(obj)}")
        if id_ is not None:  # ids are unique also when a line is bad: one result line per id
            if id_ in self.seen:
                return LineError(n, id_, f"id={id_!r}: duplicate of the id on line {self.seen[id_]}")
            self.seen[id_] = n
        try:
            line = BatchLine.model_validate(obj)
        except ValidationError as e:
            return LineError(n, id_, str(RequestError.from_validation(e)))
        try:
            for i, m in enumerate(line.messages or ()):
                m.check_supported(i)  # e.g. audio: refused, not silently dropped
            tools = ToolUse(tools=line.tools or [], choice=line.tool_choice,
                            parallel=line.parallel_tool_calls is not False).checked()
            fields = dict(line)
            if line.messages is not None:
                fields["messages"] = tools.conversation(line.messages)
            elif tools.tools:
                raise RequestError("tools: a prompt line cannot call tools; give messages", "tools")
            fields["structured"] = tools.constrained(line.response_format)
            req = engine_request(fields, self.default_max_tokens)
        except RequestError as e:
            return LineError(n, line.id, str(e))
        return BatchRequest(n, line.id, req.prompt, req.params, frozenset(tools.names))


def _short(obj, limit: int = 60) -> str:
    s = json.dumps(obj)
    return s if len(s) <= limit else s[:limit] + "..."
