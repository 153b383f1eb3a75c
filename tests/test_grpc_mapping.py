"""The gRPC ingress's pieces that need no server: proto requests become the HTTP request models
(same checks, same engine parameters, logprobs in both shapes), engine outputs become proto chunks
and responses, the stubs regenerate identically, the HTTP->gRPC status table and the serve command's
gRPC port. The calls through Serve's gRPC proxy are in tests/test_grpc.py."""
from __future__ import annotations

import json

import pytest

from deployments.protos import specray_pb2 as pb

MESSAGES = [("user", "Name three colours.")]


def chat_request(**fields) -> pb.GenerateRequest:
    return pb.GenerateRequest(messages=[pb.ChatMessage(role=r, content=c) for r, c in MESSAGES], **fields)


# ---- no server needed ---------------------------------------------------------------------------
def test_regenerated_stubs_are_identical(tmp_path):
    from deployments.protos.generate import REPO_ROOT, generate

    for fresh in generate(tmp_path):
        committed = REPO_ROOT / fresh.relative_to(tmp_path)
        assert fresh.read_bytes() == committed.read_bytes(), (
            f"{committed.name} is stale: run python -m deployments.protos.generate")


def test_status_table():
    from deployments.grpc_ingress import grpc_code_of

    codes = {400: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 404: "NOT_FOUND",
             401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE", 500: "INTERNAL",
             418: "UNKNOWN"}
    assert {status: grpc_code_of(status).name for status in codes} == codes


def test_request_conversion_shares_the_http_models():
    from deployments.grpc_ingress import to_openai_request
    from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest

    req, chat = to_openai_request(pb.GenerateRequest(prompt="hi", max_tokens=5, temperature=0.5, stop=["\n"],
                                                     spec_tokens=0), stream=True)
    assert isinstance(req, CompletionRequest) and not chat
    assert (req.prompt, req.max_tokens, req.temperature, req.stop, req.spec_tokens) == ("hi", 5, 0.5, ["\n"], 0)
    assert req.stream and req.include_usage and req.return_token_ids
    assert req.top_p is None and req.seed is None  # absent stays absent: the HTTP side's defaults apply
    req, chat = to_openai_request(chat_request(top_k=3, min_p=0.25, seed=7, ignore_eos=True), stream=False)
    assert isinstance(req, ChatCompletionRequest) and chat and not req.stream
    assert (req.top_k, req.min_p, req.seed, req.ignore_eos, req.messages[0].content) == (3, 0.25, 7, True,
                                                                                        MESSAGES[0][1])
    # the logits-processing and stop fields reach the engine's SamplingParams
    req, _ = to_openai_request(chat_request(stop_token_ids=[9, 5], min_tokens=2, presence_penalty=0.5,
                                            frequency_penalty=0.25, repetition_penalty=1.1,
                                            include_stop_str_in_output=True, max_tokens=8), stream=False)
    params = req.to_engine(64)[1][0]
    assert (params.stop_token_ids, params.min_tokens, params.presence_penalty, params.frequency_penalty,
            params.repetition_penalty, params.include_stop_str_in_output) == ((5, 9), 2, 0.5, 0.25, 1.1, True)
    plain = to_openai_request(chat_request(max_tokens=8), stream=False)[0].to_engine(64)[1][0]
    assert (plain.stop_token_ids, plain.min_tokens, plain.repetition_penalty, plain.include_stop_str_in_output) == (
        (), 0, 1.0, False)  # absent fields keep the engine's defaults
    with pytest.raises(APIError, match="repetition_penalty") as e:
        to_openai_request(chat_request(repetition_penalty=0.0, max_tokens=8), stream=False)[0].to_engine(64)
    assert e.value.status == 400 and e.value.param == "repetition_penalty"
    with pytest.raises(APIError, match="neither given"):
        to_openai_request(pb.GenerateRequest(max_tokens=3), stream=False)
    assert to_openai_request(chat_request(max_tokens=8), stream=False)[0].to_engine(64)[1][0].logprobs is None
    with pytest.raises(APIError, match="both given"):
        to_openai_request(chat_request(prompt="hi"), stream=False)
    with pytest.raises(APIError, match="messages.0.role='robot'") as e:
        to_openai_request(pb.GenerateRequest(messages=[pb.ChatMessage(role="robot", content="hi")]), stream=False)
    assert e.value.status == 400 and e.value.param == "messages"


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_logprobs_map_to_each_http_shape(kind):
    """One proto field, HTTP's two shapes (completions' k, chat's flag + top_logprobs); the engine
    gets k either way, and a bad k is answered naming the proto field."""
    from deployments.grpc_ingress import to_openai_request
    from deployments.openai_api import APIError

    def request(k):
        return pb.GenerateRequest(prompt="hi", logprobs=k) if kind == "completion" else chat_request(logprobs=k)

    for k in (0, 3, 20):
        req, _ = to_openai_request(request(k), stream=False)
        assert (req.logprobs, getattr(req, "top_logprobs", None)) == ((True, k) if kind == "chat" else (k, None))
        assert req.to_engine(64)[1][0].logprobs == k
    for k in (-1, 21):
        with pytest.raises(APIError, match=f"logprobs={k}: must be between 0 and 20") as e:
            to_openai_request(request(k), stream=False)
        assert (e.value.status, e.value.param) == (400, "logprobs")


def test_logprobs_become_proto_messages():
    from actors.logprobs import TokenLogprob
    from deployments.grpc_ingress import to_response
    from deployments.openai_logprobs import LogprobFormatter
    from tests.tiny import ByteTokenizer

    entries = [TokenLogprob(7, -0.25, ((7, -0.25), (3, -2.0))), TokenLogprob(9, float("-inf"), ((4, -0.1), (9, -1e30)))]
    fmt = LogprobFormatter(ByteTokenizer())  # token i's text: chr(i)
    r = to_response("cmpl-3", "m", [_out("ab", [7, 9], True, "stop")], entries, fmt)
    got = [(e.token_id, e.token, e.logprob, [(t.token_id, t.token, t.logprob) for t in e.top_logprobs])
           for e in r.logprobs]
    assert got == [(7, "\x07", -0.25, [(7, "\x07", -0.25), (3, "\x03", -2.0)]),
                   (9, "\t", -9999.0, [(4, "\x04", -0.1), (9, "\t", -9999.0)])]  # -inf floored as over HTTP
    assert not to_response("cmpl-4", "m", [_out("ab", [7, 9], True, "stop")]).logprobs  # not asked: none
    outs = [_out("a", [7]), _out("b", [9], True, "stop")]
    outs[0].delta_logprobs, outs[1].delta_logprobs = entries[:1], entries[1:]
    chunks = _chunks(outs, fmt=fmt)
    assert [[e.token_id for e in c.delta_logprobs] for c in chunks] == [[7], [9]]
    assert [len(e.top_logprobs) for c in chunks for e in c.delta_logprobs] == [2, 2]


def test_serve_command_grpc_port():
    import argparse

    from cluster.cli import BadInput
    from cluster.serve_cli import add_serve_parser, cmd_serve, grpc_usage_text

    sub = argparse.ArgumentParser(prog="specray").add_subparsers(dest="command")
    add_serve_parser(sub)
    assert sub.choices["serve"].parse_args([]).grpc_port is None  # gRPC is off unless asked for
    args = sub.choices["serve"].parse_args(["--grpc-port", "70000"])
    with pytest.raises(BadInput, match="--grpc-port 70000"):
        cmd_serve(args)  # rejected before Ray or Serve start
    text = grpc_usage_text("0.0.0.0", 9000)
    assert "grpcurl -plaintext -H 'application: specray'" in text and "127.0.0.1:9000" in text
    assert "specray.v1.Generation/Generate" in text and "GenerationStub" in text



def _out(text="", ids=(), finished=False, reason=None, error=None, drafts=(0, 0, 0), per_pos=()):
    from cluster.outputs import RequestOutput

    return RequestOutput("r", text, list(ids), text, list(ids), finished, reason, 4, len(ids), *drafts,
                         accepted_per_pos=list(per_pos), error=error)


class _FakeChoices:
    """One choice's outputs as OpenAIServer's ChoiceStreams hands them over (the first one apart)."""

    def __init__(self, outs, fail=None):
        self.firsts, self._rest, self._fail = outs[:1], outs[1:], fail

    async def merged(self):
        for out in self.firsts + self._rest:
            yield 0, out
        if self._fail is not None:
            raise self._fail


def _chunks(outs, fail=None, fmt=None) -> list:
    import asyncio

    from deployments.grpc_ingress import to_chunks
    from deployments.openai_server import Generation

    async def main():
        gen = Generation("cmpl-1", _FakeChoices(outs, fail), None)
        return [c async for c in to_chunks(gen, "m", fmt)]

    return asyncio.run(main())


def test_outputs_become_chunks_directly():
    chunks = _chunks([_out(), _out("He", [7]), _out("", [8]), _out(), _out("llo", [9, 10], True, "length",
                                                                           drafts=(2, 4, 3), per_pos=(2, 1))])
    assert [(c.delta_text, list(c.delta_token_ids)) for c in chunks] == [("He", [7]), ("", [8]), ("llo", [9, 10])]
    assert all((c.id, c.model) == ("cmpl-1", "m") for c in chunks)
    assert [c.HasField("finish_reason") for c in chunks] == [False, False, True]
    last = chunks[-1]
    assert last.finish_reason == "length" and not chunks[0].HasField("usage")
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (4, 2, 6)
    s = last.speculation
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, list(s.accepted_per_pos)) == (2, 4, 3, [2, 1])
    assert s.acceptance_rate == 0.75
    plain = _chunks([_out("a", [5], True, "stop")])[-1]
    assert plain.finish_reason == "stop" and not plain.speculation.HasField("acceptance_rate")


def test_a_failure_after_the_first_chunk_is_a_status():
    from deployments.openai_api import APIError

    with pytest.raises(APIError) as e:
        _chunks([_out("a", [5]), _out("", [], True, "error", error="boom")])
    assert (e.value.status, e.value.message) == (500, "generation failed: boom")
    with pytest.raises(APIError) as e:
        _chunks([_out("a", [5])], fail=RuntimeError("engine shut down"))
    assert (e.value.status, e.value.message) == (503, "generation failed: engine shut down")


def test_final_output_becomes_the_response_directly():
    from deployments.grpc_ingress import to_response

    r = to_response("cmpl-2", "m", [_out("Hello", [1, 2, 3], True, "abort", drafts=(1, 2, 1), per_pos=(1,))])
    assert (r.id, r.model, r.text, list(r.token_ids), r.finish_reason) == ("cmpl-2", "m", "Hello", [1, 2, 3], "abort")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (4, 3, 7)
    assert (r.speculation.num_drafts, r.speculation.acceptance_rate) == (1, 0.5)


def test_prediction_maps_for_both_kinds_and_its_counts_reach_the_usage():
    from deployments.grpc_ingress import to_openai_request, to_response

    for request in (pb.GenerateRequest(prompt="hi", prediction="Hello there"),
                    chat_request(prediction="Hello there")):
        req, _ = to_openai_request(request, stream=False)
        assert req.to_engine(64)[1][0].prediction == "Hello there"
    assert to_openai_request(chat_request(), stream=False)[0].to_engine(64)[1][0].prediction is None
    out = _out("Hello", [1, 2, 3], True, "stop")
    out.num_prediction_tokens, out.num_accepted_prediction_tokens = 5, 3
    usage = to_response("cmpl-5", "m", [out]).usage
    assert (usage.accepted_prediction_tokens, usage.rejected_prediction_tokens) == (3, 2)
    assert not to_response("cmpl-6", "m", [_out("Hello", [1, 2, 3], True, "stop")]).usage.HasField(
        "accepted_prediction_tokens")  # no prediction: no counts
    outs = [_out("a", [7]), _out("b", [9], True, "stop")]
    outs[1].num_prediction_tokens, outs[1].num_accepted_prediction_tokens = 4, 4
    assert _chunks(outs)[-1].usage.rejected_prediction_tokens == 0


def test_response_format_maps_for_both_kinds_and_bad_json_is_a_400_naming_it():
    from actors.structured_output import StructuredOutput
    from deployments.grpc_ingress import to_openai_request
    from deployments.openai_api import APIError

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = json.dumps({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    for request in (pb.GenerateRequest(prompt="hi", response_format=fmt), chat_request(response_format=fmt)):
        params = to_openai_request(request, stream=False)[0].to_engine(64)[1][0]
        assert params.structured == StructuredOutput(kind="json_schema", value=schema)
    choice = chat_request(response_format='{"type": "choice", "choice": ["a", "b"]}')
    assert to_openai_request(choice, stream=False)[0].to_engine(64)[1][0].structured.value == ("a", "b")
    assert to_openai_request(chat_request(), stream=False)[0].to_engine(64)[1][0].structured is None
    for bad, says in (("{type: json", "not valid JSON"), ('{"type": "xml"}', "response_format.type")):
        with pytest.raises(APIError, match=says) as e:
            to_openai_request(chat_request(response_format=bad), stream=False)[0].to_engine(64)
        assert e.value.status == 400 and e.value.param == "response_format"


WEATHER = json.dumps([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}])
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tools_map_to_http_chat_and_bad_ones_are_400s_naming_the_field():
    from deployments.grpc_ingress import to_openai_request
    from deployments.openai_api import APIError

    req, chat = to_openai_request(chat_request(tools=WEATHER, tool_choice="required", parallel_tool_calls=False),
                                  stream=False)
    params = req.to_engine(64)[1][0]
    assert chat and req.tool_use().names == {"get_weather"} and params.structured.kind == "tool_calls"
    named = '{"type": "function", "function": {"name": "get_weather"}}'
    assert to_openai_request(chat_request(tools=WEATHER, tool_choice=named), stream=False)[0].tool_use().mode == "named"
    history = pb.GenerateRequest(tools=WEATHER, messages=[
        pb.ChatMessage(role="user", content="Weather in Paris?"),
        pb.ChatMessage(role="assistant", tool_calls=json.dumps([{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}])),
        pb.ChatMessage(role="tool", content="18 C", tool_call_id="call_1")])
    prompt = to_openai_request(history, stream=False)[0].prompt_fields()[0]["messages"]
    assert any(CALL in m["content"] for m in prompt) and prompt[0]["role"] == "system"
    for request, param, says in (
            (pb.GenerateRequest(prompt="hi", tools=WEATHER), "tools", "needs messages"),
            (chat_request(tools="[{"), "tools", "not valid JSON"),
            (chat_request(tools=WEATHER, tool_choice="{name"), "tool_choice", "not valid JSON"),
            (chat_request(tools=WEATHER, tool_choice="maybe"), "tool_choice", "'maybe': use none, auto, required"),
            (chat_request(tools=WEATHER, tool_choice='{"type": "function", "function": {"name": "x"}}'),
             "tool_choice", "'x'"),
            (pb.GenerateRequest(messages=[pb.ChatMessage(role="assistant", tool_calls="nope")]),
             "messages[0].tool_calls", "not valid JSON")):
        with pytest.raises(APIError, match=says) as e:
            to_openai_request(request, stream=False)[0].to_engine(64)
        assert (e.value.status, e.value.param) == (400, param)


def test_an_answer_of_calls_becomes_proto_tool_calls():
    from deployments.grpc_ingress import to_response

    tools = frozenset({"get_weather"})
    r = to_response("cmpl-7", "m", [_out(CALL, [1, 2], True, "stop")], tools=tools)
    assert (r.text, r.finish_reason) == ("", "tool_calls")
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert r.tool_calls[0].id.startswith("call_")
    for text, reason, names in (("Sunny.", "stop", tools), (CALL[:30], "length", tools), (CALL, "stop", frozenset())):
        r = to_response("cmpl-8", "m", [_out(text, [1], True, reason)], tools=names)
        assert (r.text, r.finish_reason, len(r.tool_calls)) == (text, reason, 0)
    cut = to_response("cmpl-9", "m", [_out(CALL + "\n" + CALL[:30], [1], True, "length")], tools=tools)
    assert (cut.text, cut.finish_reason, [c.name for c in cut.tool_calls]) == ("", "length", ["get_weather"])


def test_streamed_calls_are_held_then_come_whole_in_the_last_chunk():
    import asyncio

    from deployments.grpc_ingress import to_chunks
    from deployments.openai_server import Generation

    def chunks(outs):
        async def main():
            gen = Generation("cmpl-9", _FakeChoices(outs), None)
            return [c async for c in to_chunks(gen, "m", None, frozenset({"get_weather"}))]
        return asyncio.run(main())

    calls = chunks([_out(CALL[:12], [1]), _out(CALL[12:], [2], True, "stop")])
    assert [c.delta_text for c in calls] == ["", ""] and [list(c.delta_token_ids) for c in calls] == [[1], [2]]
    assert calls[-1].finish_reason == "tool_calls" and [c.name for c in calls[-1].tool_calls] == ["get_weather"]
    text = chunks([_out("<to", [1]), _out("ast> Sunny", [2]), _out(".", [3], True, "stop")])
    assert "".join(c.delta_text for c in text) == "<toast> Sunny." and text[0].delta_text == ""
    assert text[-1].finish_reason == "stop" and not text[-1].tool_calls
