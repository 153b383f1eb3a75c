"""Tool calling on chat completions: the tools described in a system message, calls parsed from an
answer that starts with ``<tool_call>`` blocks (auto) or constrained to such calls (required, a named
function), returned as OpenAI's ``tool_calls`` (whole, or as one streamed delta); the same on
batch-job lines and their results (gRPC's mapping: tests/test_grpc_mapping.py)."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from actors.sampling_params import SamplingParams
from cluster.outputs import RequestOutput
from cluster.request import RequestError
from deployments import batch_output
from deployments.batch_input import BatchRequest, LineError, LineReader
from deployments.openai_tools import (CallStream, Tool, ToolUse, answer_calls, calls_finish_reason, parse_tool_calls,
                                      render_message)
from tests.test_openai_conformance import _call, _chat, app  # noqa: F401  (app: the in-process server)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _block(name, args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


# ---- pure parts ------------------------------------------------------------------------------
def test_calls_parse_only_from_an_answer_made_of_call_blocks():
    names = {"get_weather", "get_time"}
    one = parse_tool_calls("  " + _block("get_weather", {"city": "Paris"}), names)
    assert [c["function"] for c in one] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert one[0]["type"] == "function" and one[0]["id"].startswith("call_") and len(one[0]["id"]) == 29
    two = parse_tool_calls(_block("get_time", {}) + "\n" + _block("get_weather", {"city": "Rome"}), names)
    assert [c["function"]["name"] for c in two] == ["get_time", "get_weather"] and two[0]["id"] != two[1]["id"]
    for text in ("The weather is fine.", _block("unknown", {}), "<tool_call>\n{not json}\n</tool_call>",
                 _block("get_time", {}) + " and some text", "<tool_call>\n{\"name\": \"get_time\"", "",
                 _block("get_time", []), "Sure: " + _block("get_time", {})):
        assert parse_tool_calls(text, names) is None, text


@pytest.mark.parametrize("tools, choice, says", [
    ([{"type": "function", "function": {"name": "bad name"}}], None, "tools: function name 'bad name'"),
    ([TIME, TIME], None, "tools: function 'get_time' is given twice"),
    ([TIME], {"type": "function", "function": {"name": "nope"}}, "tool_choice names function 'nope'"),
    ([], "required", "tool_choice=\"required\" needs tools"),
])
def test_bad_tools_are_refused_naming_the_field(tools, choice, says):
    with pytest.raises(RequestError, match=says):
        ToolUse(tools=tools, choice=choice).checked()


def test_modes_and_the_system_text():
    tools = [Tool.model_validate(WEATHER), Tool.model_validate(TIME)]
    assert ToolUse(tools=tools).mode == "auto" and ToolUse(tools=tools).constraint() is None
    assert ToolUse(tools=tools, choice="none").names == set()
    named = ToolUse(tools=tools, choice={"type": "function", "function": {"name": "get_time"}})
    assert named.mode == "named" and named.names == {"get_time"} and "get_weather" not in named.constraint().value
    msgs = ToolUse(tools=tools).messages([{"role": "system", "content": "Be brief."}, *ASK])
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.\n\nYou can call functions.")
    assert '"name": "get_weather"' in msgs[0]["content"] and msgs[1:] == ASK
    assert ToolUse(tools=tools, choice="none").messages(ASK) == ASK  # tools not shown


def test_earlier_calls_and_results_are_rendered_in_the_call_format():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert render_message({"role": "assistant", "content": None, "tool_calls": [call]}) == {
        "role": "assistant", "content": _block("get_weather", {"city": "Paris"})}
    assert render_message({"role": "tool", "content": "18 C", "tool_call_id": "call_1"}) == {
        "role": "tool", "content": "18 C"}
    with pytest.raises(RequestError, match="arguments is not JSON"):
        render_message({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]})


def test_a_streamed_answer_is_held_while_it_may_be_calls():
    text = CallStream({"get_time"})
    assert text.step(" <tool", False, None) == ("", None)
    assert text.step("kit is", False, None) == (" <toolkit is", None)  # not a call: everything held, then on
    assert text.step(" here", True, "stop") == (" here", None)
    calls = CallStream({"get_time"})
    block = _block("get_time", {})
    assert calls.step(block[:12], False, None) == ("", None)
    out, made = calls.step(block[12:], True, "stop")
    assert out == "" and [c["function"]["name"] for c in made] == ["get_time"]
    cut = CallStream({"get_time"})  # cut short by max_tokens: the held text is the answer
    assert cut.step("<tool_call>\n{", True, "length") == ("<tool_call>\n{", None)
    repeated = CallStream({"get_time"})  # cut inside a second call: the first, complete, is a call
    out, made = repeated.step(block + "\n" + block[:20], True, "length")
    assert out == "" and [c["function"]["name"] for c in made] == ["get_time"]


def test_calls_of_an_answer_stopped_or_cut():
    names, block = {"get_time"}, _block("get_time", {"zone": "UTC"})
    assert len(answer_calls(block + "\n" + block, names, "stop")) == 2
    assert len(answer_calls(block + "\n" + block + "\n<tool_call>\n{\"na", names, "length")) == 2
    assert answer_calls("<tool_call>\n{\"na", names, "length") is None  # no complete call: text
    assert answer_calls("The time is " + block, names, "length") is None  # text before a call: text
    assert answer_calls(block + "\n" + block[:-3], names, "stop") is None  # stopped mid-call: not calls
    assert answer_calls(block, names, "abort") is None and answer_calls(block, set(), "stop") is None
    made = answer_calls(block, names, "stop")
    assert calls_finish_reason(made, "stop") == "tool_calls" and calls_finish_reason(made, "length") == "length"
    assert calls_finish_reason(None, "stop") == "stop"


# ---- batch-job lines (a job answering one: tests/test_batch_job.py) --------------------------------
def test_a_chat_line_may_call_tools(tmp_path):
    """tools / tool_choice / parallel_tool_calls on a messages line as HTTP chat takes them: the tools
    described in a system message, earlier calls rendered, required / named answers held to the calls'
    grammar; refused naming the field on a prompt line, an unknown function, or with response_format."""
    user = {"role": "user", "content": "Weather in Paris?"}
    paris = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [
        {"id": "a", "messages": [user], "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False},
        {"id": "b", "messages": [user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": paris}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}], "tools": [WEATHER]},
        {"id": "c", "prompt": "Weather in Paris?", "tools": [WEATHER]},
        {"id": "d", "messages": [user], "tools": [WEATHER],
         "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        {"id": "e", "messages": [user], "tools": [WEATHER], "tool_choice": "required",
         "response_format": {"type": "json_object"}},
        {"id": "f", "messages": [user], "tool_choice": "required"},
    ]))
    a, b, *bad = list(LineReader(path, Counter(), default_max_tokens=8))
    assert a.tool_names == b.tool_names == frozenset({"get_weather"})
    assert a.params.structured.kind == "tool_calls" and "get_weather" in a.params.structured.value
    assert "call (NL call)*" not in a.params.structured.value  # parallel_tool_calls false: exactly one call
    assert b.params.structured is None  # auto: free text, parsed afterwards
    assert a.prompt[0]["role"] == "system" and "get_weather" in a.prompt[0]["content"]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert call in b.prompt[2]["content"]
    assert [(e.id, type(e)) for e in bad] == [(x, LineError) for x in "cdef"]
    for e, words in zip(bad, ("tools: a prompt line cannot call tools", "tool_choice names function 'get_time'",
                              "response_format='json_object' and tool_choice='required'",
                              'tool_choice="required" needs tools')):
        assert words in e.error, e


def test_a_result_made_of_calls_carries_them():
    req = BatchRequest(1, "a", [{"role": "user", "content": "hi"}], SamplingParams(), frozenset({"get_weather"}))
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    rec = batch_output.result_record(req, RequestOutput("r", text, [5], "", [], True, "stop", 3, 1, 0, 0, 0))
    assert rec["finish_reason"] == "tool_calls" and rec["text"] == text
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in rec["tool_calls"]] == [
        ("get_weather", {"city": "Paris"})]
    for out_text, reason in (("Sunny.", "stop"), (text[:30], "length")):  # text, or a call cut short: no calls
        rec = batch_output.result_record(req, RequestOutput("r", out_text, [5], "", [], True, reason, 3, 1, 0, 0, 0))
        assert "tool_calls" not in rec and rec["finish_reason"] == reason
    cut = text + "\n" + text[:30]  # max_tokens cut a second call: the first is a call, the answer stays cut
    rec = batch_output.result_record(req, RequestOutput("r", cut, [5], "", [], True, "length", 3, 1, 0, 0, 0))
    assert rec["finish_reason"] == "length" and len(rec["tool_calls"]) == 1


# ---- the official client ---------------------------------------------------------------------
@pytest.mark.model
def test_required_and_named_choices_return_calls_that_match_the_parameters(app):  # noqa: F811
    reply = _chat(app, messages=ASK, max_tokens=60, tools=[WEATHER, TIME], tool_choice="required",
                  parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name in ("get_weather", "get_time")
    if call.function.name == "get_weather":
        args = json.loads(call.function.arguments)
        assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")

    named = _chat(app, messages=ASK, max_tokens=60, tools=[WEATHER, TIME],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = named.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls)
    assert all(isinstance(json.loads(c.function.arguments)["city"], str) for c in calls)

    async def stream(client):
        chunks = await client.chat.completions.create(
            model="smollm2-135m", messages=ASK, max_tokens=60, temperature=0, stream=True, tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        return [c async for c in chunks]
    chunks = _call(app, stream)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == [c.function.name for c in calls]
    assert [json.loads(d.function.arguments) for d in deltas] == [json.loads(c.function.arguments) for c in calls]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


@pytest.mark.model
def test_auto_answers_and_a_conversation_goes_on_after_a_call(app):  # noqa: F811
    auto = _chat(app, messages=ASK, max_tokens=30, tools=[WEATHER])  # the model decides: text or calls
    choice = auto.choices[0]
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"city": "Paris", "unit": "c"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    after = _chat(app, messages=history, max_tokens=30, tools=[WEATHER], tool_choice="none")
    assert after.choices[0].message.content and after.choices[0].message.tool_calls is None


@pytest.mark.model
def test_tool_errors_over_http(app):  # noqa: F811
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        _chat(app, messages=ASK, tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format" and "both constrain" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        _chat(app, messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.UnprocessableEntityError):
        _chat(app, messages=ASK, tools=[{"type": "code_interpreter"}])


def test_constrained_arguments_are_closed_objects_unless_the_schema_opens_them():
    from deployments.openai_tools import closed

    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                                               "c": {"type": "array", "items": {"properties": {"d": {}}}},
                                               "e": {"type": "object", "additionalProperties": True}},
              "$defs": {"x": {"anyOf": [{"type": "object"}, {"type": "string"}]}}}
    out = closed(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["c"]["items"]["additionalProperties"] is False
    assert out["properties"]["e"]["additionalProperties"] is True
    assert out["$defs"]["x"]["anyOf"][0]["additionalProperties"] is False and "additionalProperties" not in \
        out["$defs"]["x"]["anyOf"][1]
    assert "additionalProperties" not in schema  # the request's own is left as it was
