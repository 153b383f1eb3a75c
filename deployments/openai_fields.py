"""The OpenAI conformance table: what this server does with every field of OpenAI's chat and
completions requests (and the extensions OpenAI-compatible servers commonly accept).

Each field is **implemented**, **accepted and ignored** (metadata that cannot change the output),
or **rejected (400)**: a request that gives it a value this server cannot honour is refused with a
400 naming the field, rather than answered as if the field were not there. A rejected field still
accepts its neutral values (``tools: []``, ``response_format: {"type": "text"}``, ...), which ask
for nothing. Unknown fields stay errors (422), so a typo is never silently ignored.

The request models (``deployments.openai_api``) declare the ignored and rejected top-level fields
from this table (``policy_fields``), and check them (``check_policy``, ``check_message``); the
README's table is tested against it (tests/test_openai_conformance.py); ``python -m
deployments.openai_fields`` prints it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import Field

from cluster.request import RequestError


class Status(str, Enum):
    IMPLEMENTED = "implemented"
    IGNORED = "accepted and ignored"
    REJECTED = "rejected (400)"


@dataclass(frozen=True, slots=True)
class FieldPolicy:
    name: str  # top level (``tools``), or a nested path (``stream_options.include_usage``, ``messages[].audio``)
    status: Status
    chat: bool  # a field of chat completions requests
    completions: bool  # a field of (legacy) completions requests
    note: str  # README's note; for a rejected field also the 400's reason
    neutral: Callable[[Any], bool] | None = None  # rejected fields: values that ask for nothing (accepted)

    @property
    def top_level(self) -> bool:
        return "." not in self.name and "[" not in self.name

    def accepts(self, value: Any) -> bool:
        """Whether a given value is answered (not a 400)."""
        return self.status is not Status.REJECTED or value is None or bool(self.neutral and self.neutral(value))


IMPL, IGN, REJ = Status.IMPLEMENTED, Status.IGNORED, Status.REJECTED


def _empty(v) -> bool:
    return v in ([], {}, "")


def _is(*values) -> Callable[[Any], bool]:
    """Exactly one of ``values`` (``1`` is not ``true``)."""
    return lambda v: any(type(v) is type(x) and v == x for x in values)


def _short(v: Any, limit: int = 80) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."


FIELDS: tuple[FieldPolicy, ...] = (
    # ---- the prompt -------------------------------------------------------------------------
    FieldPolicy("messages", IMPL, True, False, "roles system, developer, user, assistant, tool"),
    FieldPolicy("messages[].content", IMPL, True, False,
                "a string, or a list of `{\"type\": \"text\"}` parts (joined with newlines)"),
    FieldPolicy("messages[].content[] of type image_url, input_audio, file, refusal", REJ, True, False,
                "this server reads text only"),
    FieldPolicy("messages[].role function", REJ, True, False, "deprecated function messages are not supported"),
    FieldPolicy("messages[].name", IGN, True, False, "not passed to the chat template"),
    FieldPolicy("messages[].tool_call_id", IGN, True, False, "a tool message is rendered as a `tool` turn holding "
                "its result, in the order given"),
    FieldPolicy("messages[].tool_calls", IMPL, True, False, "an assistant's earlier calls, rendered in the call "
                "format (`<tool_call>` blocks); its `content` may then be null"),
    FieldPolicy("messages[].function_call", REJ, True, False, "function calling is not implemented"),
    FieldPolicy("messages[].audio", REJ, True, False, "audio is not supported"),
    FieldPolicy("messages[].refusal", REJ, True, False, "refusals in the history are not supported"),
    FieldPolicy("prompt", IMPL, False, True,
                "a string, token ids, or a list of either: n choices each, prompt i's at indices i*n .. i*n+n-1"),
    FieldPolicy("suffix", REJ, False, True, "insertion (fill in the middle) is not supported; `\"\"` accepted",
                _empty),
    FieldPolicy("echo", IMPL, True, True, "completions: the prompt before each choice's text; with logprobs, its "
                "tokens' too (the first one's null); with max_tokens 0 the prompt alone (not streamed). Chat "
                "(vLLM): a last assistant message's content before each choice's content"),
    FieldPolicy("add_generation_prompt", IMPL, True, False,
                "extension (vLLM): default true; false renders the messages without opening an assistant turn"),
    FieldPolicy("continue_final_message", IMPL, True, False,
                "extension (vLLM): the answer continues the last message, the assistant's (with "
                "add_generation_prompt false)"),
    FieldPolicy("model", IMPL, True, True, "must be the served model's name (404 otherwise); may be left out"),
    # ---- length, choices, streaming ---------------------------------------------------------
    FieldPolicy("max_tokens", IMPL, True, True,
                "prompt + max_tokens over the context: 400; left out: until EOS, a stop or the context end"),
    FieldPolicy("max_completion_tokens", IMPL, True, False, "as max_tokens (max_tokens wins when both are given)"),
    FieldPolicy("n", IMPL, True, True, "1 to 16 choices"),
    FieldPolicy("best_of", REJ, False, True, "server-side best-of is not supported; `1` accepted", _is(1)),
    FieldPolicy("stop", IMPL, True, True, "a string or a list of strings"),
    FieldPolicy("stream", IMPL, True, True, "SSE `data:` chunks, then `data: [DONE]`"),
    FieldPolicy("stream_options", IMPL, True, True, "with stream: true only; its fields below"),
    FieldPolicy("stream_options.include_usage", IMPL, True, True, "a last chunk with usage (and speculation)"),
    FieldPolicy("stream_options.continuous_usage_stats", IMPL, True, True,
                "extension (vLLM): with include_usage, usage so far on every chunk"),
    FieldPolicy("stream_options.include_obfuscation", IGN, True, True, "no obfuscation padding is added"),
    # ---- sampling ---------------------------------------------------------------------------
    FieldPolicy("temperature", IMPL, True, True, "0 to 2; 0 = greedy"),
    FieldPolicy("top_p", IMPL, True, True, "(0, 1]"),
    FieldPolicy("top_k", IMPL, True, True, "extension: 0 = off"),
    FieldPolicy("min_p", IMPL, True, True, "extension (vLLM): [0, 1], 0 = off; relative to the most probable token"),
    FieldPolicy("seed", IMPL, True, True, "choice i samples with seed + i; same output with or without speculation"),
    FieldPolicy("presence_penalty", IMPL, True, True, "-2 to 2; applied per token tree node (lossless)"),
    FieldPolicy("frequency_penalty", IMPL, True, True, "-2 to 2; applied per token tree node (lossless)"),
    FieldPolicy("repetition_penalty", IMPL, True, True, "extension (vLLM): > 0, 1 = off; prompt and output tokens"),
    FieldPolicy("logit_bias", IMPL, True, True, "{token id: -100 to 100}"),
    FieldPolicy("min_tokens", IMPL, True, True, "extension (vLLM): EOS masked until this many tokens (a stop string still ends the text)"),
    FieldPolicy("stop_token_ids", IMPL, True, True,
                "extension (vLLM): token ids that end the choice (in its token ids, not its text)"),
    FieldPolicy("include_stop_str_in_output", IMPL, True, True,
                "extension (vLLM): the text ends after the stop string or stop token that ended it"),
    FieldPolicy("ignore_eos", IMPL, True, True, "extension (vLLM)"),
    FieldPolicy("logprobs", IMPL, True, True, "chat: true/false; completions: 0 to 20 alternatives"),
    FieldPolicy("top_logprobs", IMPL, True, False, "0 to 20, with logprobs: true"),
    FieldPolicy("spec_tokens", IMPL, True, True, "extension: speculation off (0) or a fixed chain length"),
    FieldPolicy("return_token_ids", IMPL, True, True, "extension (vLLM): token ids in each choice / chunk"),
    # ---- output formats and tools -----------------------------------------------------------
    FieldPolicy("response_format", IMPL, True, True,
                "`text`, `json_object`, `json_schema` (the answer always matches the schema; `strict` accepted); "
                "extensions: `regex`, `grammar` (Lark), `choice` (a list of strings); completions: extension. "
                "Every token masked to the grammar, drafted or not"),
    FieldPolicy("tools", IMPL, True, False, "function tools, described to the model in a system message; "
                "calls come back as `tool_calls` (finish_reason `tool_calls`), streamed as one delta"),
    FieldPolicy("tool_choice", IMPL, True, False, "`none`, `auto` (the default with tools: an answer that starts "
                "with a call is parsed as calls), `required` or a named function (the answer is constrained to "
                "calls whose arguments match the tool's parameters)"),
    FieldPolicy("parallel_tool_calls", IMPL, True, False, "with `required` / a named function: false allows "
                "exactly one call (default true: one or more)"),
    FieldPolicy("functions", REJ, True, False, "function calling is not implemented; `[]` accepted", _empty),
    FieldPolicy("function_call", REJ, True, False, "function calling is not implemented; `\"none\"` accepted",
                _is("none")),
    FieldPolicy("audio", REJ, True, False, "audio output is not supported"),
    FieldPolicy("modalities", REJ, True, False, "text output only; `[\"text\"]` accepted", _is(["text"])),
    FieldPolicy("prediction", IMPL, True, True,
                "`{\"type\": \"content\", \"content\": ...}` (completions: extension): prompt lookup drafts from "
                "it too; the answer is the model's own either way"),
    FieldPolicy("web_search_options", REJ, True, False, "web search is not supported"),
    FieldPolicy("reasoning_effort", REJ, True, False, "the served model does not reason; `\"none\"` accepted",
                _is("none")),
    FieldPolicy("verbosity", REJ, True, False, "not supported; `\"medium\"` (OpenAI's default) accepted",
                _is("medium")),
    FieldPolicy("moderation", REJ, True, False, "this server does not moderate"),
    # ---- metadata ---------------------------------------------------------------------------
    FieldPolicy("user", IGN, True, True, "end-user id"),
    FieldPolicy("safety_identifier", IGN, True, False, "end-user id"),
    FieldPolicy("metadata", IGN, True, False, "not stored"),
    FieldPolicy("store", IGN, True, False, "nothing is stored"),
    FieldPolicy("service_tier", IGN, True, False, "one tier"),
    FieldPolicy("prompt_cache_key", IGN, True, False, "the prefix cache is automatic"),
    FieldPolicy("prompt_cache_retention", IGN, True, False, "the prefix cache is automatic"),
    FieldPolicy("prompt_cache_options", IGN, True, False, "the prefix cache is automatic"),
)

BY_NAME = {f.name: f for f in FIELDS}


def applies(f: FieldPolicy, chat: bool) -> bool:
    return f.chat if chat else f.completions


def policy_fields(chat: bool) -> dict[str, tuple[Any, Any]]:
    """Pydantic field definitions of the top-level ignored and rejected fields of one endpoint
    (any JSON value; the implemented ones are typed in the models themselves)."""
    return {f.name: (Any, Field(None, description=f"{f.status.value}: {f.note}"))
            for f in FIELDS if f.top_level and f.status is not Status.IMPLEMENTED and applies(f, chat)}


def check_policy(values: dict[str, Any], chat: bool) -> None:
    """RequestError (400) naming the first rejected top-level field given a value this server
    cannot honour. ``values``: the request's fields."""
    for f in FIELDS:
        if f.top_level and applies(f, chat) and not f.accepts(values.get(f.name)):
            raise RequestError(f"{f.name}={_short(values[f.name])} is not supported: {f.note}", f.name)


def check_message(values: dict[str, Any], index: int) -> None:
    """The same for the fields of one chat message (``messages[].tool_calls``, ...)."""
    if values.get("role") == "function":
        raise RequestError(f"messages[{index}].role='function' is not supported: "
                           f"{BY_NAME['messages[].role function'].note}; send role 'tool' or 'user'", "messages")
    for f in FIELDS:
        key = f.name.removeprefix("messages[].")
        if f.name.startswith("messages[].") and key in values and not f.accepts(values[key]):
            raise RequestError(f"messages[{index}].{key}={_short(values[key])} is not supported: {f.note}",
                               "messages")


def markdown_table() -> str:
    """README's table (``python -m deployments.openai_fields`` prints it)."""
    mark = {True: "✓", False: "—"}
    rows = ["| Field | Chat | Completions | Status | Note |", "|---|---|---|---|---|"]
    rows += [f"| `{f.name}` | {mark[f.chat]} | {mark[f.completions]} | {f.status.value} | {f.note} |" for f in FIELDS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
