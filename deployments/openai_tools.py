"""Tool calling (OpenAI's ``tools``, ``tool_choice``, ``parallel_tool_calls``) on chat completions.

The served model has no tool-call format of its own in its chat template, so the tools are described
to it in a system message with one format for calls (Hermes-style): each call a line of JSON
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``. Then:

- ``tool_choice: "none"``: the tools are not shown; the answer is text.
- ``"auto"`` (the default when tools are given): the model decides; an answer that starts with a
  ``<tool_call>`` block of a known tool with valid JSON becomes ``tool_calls``, any other answer is
  text (as vLLM's tool parsers do).
- ``"required"`` or a named function: the answer is constrained (actors/structured_output.py) to
  calls in that format whose arguments match each tool's ``parameters`` schema (one call, or one
  or more with ``parallel_tool_calls``), so it always parses; objects in the parameters take no
  keys beyond their ``properties`` unless they say so (``closed``).

Earlier turns are rendered in the same format: an assistant message's ``tool_calls`` as its
``<tool_call>`` blocks, a ``tool`` message as a turn of role ``tool`` holding the result. Answers
with calls end with ``finish_reason: "tool_calls"``; ids are ``call_`` + 24 hex digits.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from actors.structured_output import JSON_OPTIONS, StructuredOutput
from cluster.request import RequestError, chat_messages

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments (left out: no arguments)
    strict: bool | None = None  # accepted: with tool_choice required/named the arguments always match


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolUse(BaseModel):
    """A request's tools and how it wants them used (checked: ``checked``)."""
    tools: list[Tool] = Field(default_factory=list)
    choice: ToolChoice | None = None
    parallel: bool = True

    @property
    def names(self) -> set[str]:
        """The tools an answer may call (empty: tool_choice none, or no tools): whose calls are parsed."""
        return set() if self.mode == "none" else {t.function.name for t in self.called()}

    @property
    def mode(self) -> str:
        """``none``, ``auto``, ``required`` or ``named``."""
        if not self.tools:
            return "none"
        if self.choice is None:
            return "auto"
        return "named" if isinstance(self.choice, NamedToolChoice) else self.choice

    def checked(self) -> ToolUse:
        """RequestError naming ``tools`` / ``tool_choice`` for duplicate or malformed names, or a
        choice that names no given tool or asks for calls without tools."""
        names = [t.function.name for t in self.tools]
        for name in names:
            if not _NAME.match(name):
                raise RequestError(f"tools: function name {name!r} must be 1-64 letters, digits, '_' or '-'", "tools")
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise RequestError(f"tools: function {dup!r} is given twice", "tools")
        if not self.tools and self.choice not in (None, "none"):
            raise RequestError(f"tool_choice={_choice_text(self.choice)} needs tools", "tool_choice")
        if isinstance(self.choice, NamedToolChoice) and self.choice.function.name not in names:
            raise RequestError(f"tool_choice names function {self.choice.function.name!r}, which is not among "
                               f"the tools {names}", "tool_choice")
        return self

    def called(self) -> list[Tool]:
        """The tools a constrained answer may call."""
        if self.mode == "named":
            return [t for t in self.tools if t.function.name == self.choice.function.name]
        return self.tools

    def constraint(self) -> StructuredOutput | None:
        """The grammar of a ``required`` or named answer: ``<tool_call>`` blocks of the allowed tools,
        their arguments held to each tool's parameters (None: not constrained)."""
        if self.mode not in ("required", "named"):
            return None
        empty = {"type": "object", "properties": {}}
        alternatives = [json.dumps({"type": "object", "properties": {
            "name": {"const": t.function.name}, "arguments": closed(t.function.parameters or empty)},
            "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_OPTIONS})
            for t in self.called()]
        calls = "call (NL call)*" if self.parallel else "call"
        lark = (f"start: {calls}\ncall: OPEN NL json NL CLOSE\n"
                f"json: " + " | ".join(f"%json {a}" for a in alternatives) + "\n"
                f"OPEN: {json.dumps(OPEN)}\nCLOSE: {json.dumps(CLOSE)}\nNL: \"\\n\"\n")
        return StructuredOutput(kind="tool_calls", value=lark)

    def constrained(self, fmt) -> StructuredOutput | None:
        """The answer's constraint: the calls' grammar where tool_choice asks for calls, else the
        request's response_format's (``fmt``: a ResponseFormat, or None); RequestError naming
        response_format when both would constrain it."""
        structured, calls = None if fmt is None else fmt.structured(), self.constraint()
        if calls is None:
            return structured
        if structured is not None:
            raise RequestError(f"response_format={fmt.type!r} and tool_choice={self.mode!r} both constrain the "
                               "answer; send one", "response_format")
        return calls

    def conversation(self, messages: list) -> list[dict]:
        """Chat messages (mappings or models with role, content and tool_calls) as the template
        renders them: ``messages`` applied to their role/content text and earlier calls."""
        texts = chat_messages(messages)
        calls = [m.get("tool_calls") if isinstance(m, dict) else getattr(m, "tool_calls", None) for m in messages]
        return self.messages([{**t, "tool_calls": c} for t, c in zip(texts, calls)])

    def system_text(self) -> str:
        """What the model is told about the tools and the call format."""
        specs = "\n".join(json.dumps(t.function.model_dump(exclude_none=True)) for t in self.tools)
        rule = {"required": "You must call at least one function.",
                "named": f"You must call the function {self.choice.function.name if self.mode == 'named' else ''}.",
                "auto": "Call a function only when it helps answer; otherwise answer normally."}[self.mode]
        return (f"You can call functions. Their definitions:\n{specs}\nTo call one, answer with a line "
                f"{OPEN}\n{{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}}\n{CLOSE} "
                f"for each call and nothing else. {rule}")

    def messages(self, messages: list[dict]) -> list[dict]:
        """The conversation as the template renders it: the tools' system text (after a system
        message of the request's own, else first), earlier calls and results in the call format."""
        out = [render_message(m) for m in messages]
        if self.mode == "none":
            return out
        text = self.system_text()
        if out and out[0]["role"] in ("system", "developer"):
            return [{"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{text}"}, *out[1:]]
        return [{"role": "system", "content": text}, *out]


def closed(schema: Any) -> Any:
    """A JSON schema whose objects take no properties beyond those listed unless it says otherwise
    (``additionalProperties``, as OpenAI's strict function calling requires): under a grammar a
    small model otherwise goes on adding keys until max_tokens."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k in _SUBSCHEMAS else v for k, v in schema.items()}
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(schema.get(key), dict):
            out[key] = {name: closed(s) for name, s in schema[key].items()}
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


_SUBSCHEMAS = ("items", "anyOf", "oneOf", "allOf", "not", "if", "then", "else", "prefixItems")


def _choice_text(choice) -> str:
    return json.dumps(choice.model_dump() if isinstance(choice, BaseModel) else choice)


def render_message(m: dict) -> dict:
    """One chat message with its tool calls written in the call format (the rest unchanged)."""
    calls = m.get("tool_calls")
    if not calls:
        return {"role": m["role"], "content": m.get("content") or ""}
    blocks = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"messages: tool_calls[{i}] needs a function with a name", "messages")
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise RequestError(f"messages: tool_calls[{i}].function.arguments is not JSON: {args!r}",
                               "messages") from None
        blocks.append(f"{OPEN}\n{json.dumps({'name': fn['name'], 'arguments': args})}\n{CLOSE}")
    content = m.get("content") or ""
    return {"role": m["role"], "content": "\n".join(([content] if content else []) + blocks)}


def parse_tool_calls(text: str, names: set[str]) -> list[dict] | None:
    """The calls of an answer that starts with ``<tool_call>`` blocks (whitespace between them), each
    holding JSON ``{"name": a known tool, "arguments": an object}``, as OpenAI's ``tool_calls``; None
    when the answer is not such calls (it is text)."""
    rest, calls = text.strip(), []
    while rest.startswith(OPEN):
        match = _BLOCK.match(rest)
        if match is None:
            return None
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or call.get("name") not in names:
            return None
        if not isinstance(call.get("arguments", {}), dict):
            return None
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}})
        rest = rest[match.end():].strip()
    return calls if calls and not rest else None


def answer_calls(text: str, names: set[str], reason: str | None) -> list[dict] | None:
    """The calls an answer of a request with tools (``names``) makes, None when it is text: the whole
    answer when it ended by itself (``reason`` stop); when max_tokens cut it (length), its complete
    call blocks before the cut (a small model may repeat calls until the cut: the calls it finished
    are still calls; the answer's finish_reason stays length)."""
    if not names or reason not in ("stop", "length"):
        return None
    if reason == "length":
        end = text.rfind(CLOSE)
        text = text[: end + len(CLOSE)] if end >= 0 else ""
    return parse_tool_calls(text, names)


def calls_finish_reason(calls: list[dict] | None, reason: str | None) -> str | None:
    """An answer's finish_reason: tool_calls when it ended by itself with calls, else its own."""
    return "tool_calls" if calls and reason == "stop" else reason


def may_become_calls(text: str) -> bool:
    """Whether an answer streamed so far could still turn out to be tool calls: empty, or (after
    leading whitespace) a prefix of ``<tool_call>`` or starting with it. Its text is held back
    until it is known."""
    head = text.lstrip()
    return head.startswith(OPEN) or OPEN.startswith(head)


class CallStream:
    """One streamed choice of a request with tools: its text is held back while it may still turn
    out to be calls (``may_become_calls``), then streamed; at the end, calls come as one delta."""

    def __init__(self, names: set[str]):
        self.names, self.text, self.held = names, "", True

    def step(self, delta: str, finished: bool, reason: str | None) -> tuple[str, list[dict] | None]:
        """(text to stream now, the answer's calls on its last step or None)."""
        self.text += delta
        if not self.held:
            return delta, None
        if finished:
            self.held = False
            calls = answer_calls(self.text, self.names, reason)
            return ("" if calls else self.text), calls
        if may_become_calls(self.text):
            return "", None
        self.held = False
        return self.text, None
