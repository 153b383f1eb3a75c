"""The one mapping from an external request to the engine's prompt and SamplingParams (cluster/request.py),
and each edge calling it: the HTTP models, a batch line, the CLI flags, a gRPC message."""
from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest

from actors.sampling_params import SamplingParams
from cluster.request import (SAMPLING_FIELDS, EngineRequest, RequestError, chat_messages, engine_prompt,
                             engine_request, sampling_params)

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name, value", [
    ("max_tokens", 7), ("temperature", 0.5), ("top_p", 0.9), ("top_k", 3), ("min_p", 0.1), ("seed", 11),
    ("stop", ("a", "b")),
    ("ignore_eos", True), ("spec_tokens", 0), ("logprobs", 2), ("presence_penalty", 0.5), ("frequency_penalty", -1.0),
    ("repetition_penalty", 1.2), ("logit_bias", ((3, -1.0),)), ("min_tokens", 4), ("prompt_logprobs", 2),
    ("stop_token_ids", (3, 9)),
])
def test_each_sampling_field_reaches_sampling_params(name, value):
    params = sampling_params({name: value}, default_max_tokens=99)
    assert getattr(params, name) == value
    others = {k: getattr(params, k) for k in SAMPLING_FIELDS if k != name}
    defaults = SamplingParams(max_tokens=99)
    assert others == {k: getattr(defaults, k) for k in others}


def test_not_given_means_default_and_other_keys_are_ignored():
    params = sampling_params({"temperature": None, "max_tokens": None, "n": 3, "model": "x", "stop": "z"}, 40)
    assert params == SamplingParams(max_tokens=40, stop=("z",))


@pytest.mark.parametrize("name, value, words", [
    ("max_tokens", 0, "max_tokens=0: Input should be greater than or equal to 1"),
    ("temperature", -1.0, "temperature=-1.0: Input should be greater than or equal to 0"),
    ("top_p", 0.0, "top_p=0.0: Input should be greater than 0"),
    ("top_p", 1.5, "top_p=1.5: Input should be less than or equal to 1"),
    ("top_k", -1, "top_k=-1: Input should be greater than or equal to 0"),
    ("min_p", 1.5, "min_p=1.5: Input should be less than or equal to 1"),
    ("stop_token_ids", [5, -1], "stop_token_ids=[5, -1]: must be a list of token ids (non-negative integers)"),
    ("seed", "x", "seed='x': Input should be a valid integer"),
    ("stop", ["a", 1], "stop.1=1: Input should be a valid string"),
    ("ignore_eos", "maybe", "ignore_eos='maybe': Input should be a valid boolean"),
    ("spec_tokens", -2, "spec_tokens=-2: Input should be greater than or equal to 0"),
    ("logprobs", 21, "logprobs=21: Input should be less than or equal to 20"),
])
def test_a_bad_value_is_named_with_its_field(name, value, words):
    with pytest.raises(RequestError) as e:
        sampling_params({name: value}, 16)
    assert e.value.field == name and str(e.value).startswith(words), str(e.value)
    assert isinstance(e.value, ValueError)  # the CLI's main and the batch job catch ValueError


def test_the_first_bad_field_is_the_param_and_all_are_named():
    with pytest.raises(RequestError) as e:
        sampling_params({"top_p": 0.0, "top_k": -1}, 8)
    assert e.value.field == "top_p"
    assert str(e.value) == ("top_p=0.0: Input should be greater than 0; "
                            "top_k=-1: Input should be greater than or equal to 0")


def test_prompt_or_messages():
    assert engine_prompt({"prompt": "text"}) == "text"
    assert engine_prompt({"prompt": [5, 6]}) == [5, 6]
    assert engine_prompt({"messages": MESSAGES}) == MESSAGES
    for fields, words, field in [
        ({"prompt": "x", "messages": MESSAGES}, "give exactly one of 'prompt' (text) or 'messages' (chat), got both",
         "prompt"),
        ({}, "give exactly one of 'prompt' (text) or 'messages' (chat), got neither", "prompt"),
        ({"prompt": ""}, "prompt is empty: give at least one token", "prompt"),
        ({"prompt": []}, "prompt is empty: give at least one token", "prompt"),
        ({"messages": []}, "messages=[]: give at least one message", "messages"),
        ({"messages": "hi"}, "messages='hi': must be a list of {role, content} objects", "messages"),
        ({"messages": [5]}, "messages: 5 is not a {role, content} object", "messages"),
    ]:
        with pytest.raises(RequestError) as e:
            engine_prompt(fields)
        assert (str(e.value), e.value.field) == (words, field)


def test_chat_messages_from_models_protos_and_dicts():
    from deployments.openai_api import ChatMessage
    from deployments.protos import specray_pb2 as pb

    expected = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert chat_messages([ChatMessage(role="user", content="a"), ChatMessage(role="assistant", content="b",
                                                                               name="x")]) == expected
    assert chat_messages(list(pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="a"),
                                                           pb.ChatMessage(role="assistant", content="b")]).messages)) \
        == expected
    mine = [{"role": "user", "content": "a", "name": "n"}]
    assert chat_messages(mine) == mine and chat_messages(mine)[0] is not mine[0]


def test_engine_request():
    req = engine_request({"messages": MESSAGES, "max_tokens": 3, "seed": 1}, 64)
    assert req == EngineRequest(MESSAGES, SamplingParams(max_tokens=3, seed=1))
    assert req.chat and req.field == "messages"
    text = engine_request({"prompt": "x"}, 64)
    assert not text.chat and text.field == "prompt" and text.params.max_tokens == 64
    with pytest.raises(RequestError, match="prompt is empty"):  # the prompt is checked first
        engine_request({"prompt": "", "temperature": -1}, 8)


# ---- each edge calls the mapping -------------------------------------------------------------
def test_http_models_go_through_the_mapping():
    from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest

    prompts, params = CompletionRequest(prompt=["one"], max_tokens=5, temperature=0.5, stop="s", seed=2,
                                        n=2, logprobs=1).to_engine(2048)
    assert prompts == ["one"]
    assert params == [SamplingParams(max_tokens=5, temperature=0.5, stop=("s",), seed=2, logprobs=1),
                      SamplingParams(max_tokens=5, temperature=0.5, stop=("s",), seed=3, logprobs=1)]
    prompts, params = ChatCompletionRequest(messages=MESSAGES, max_completion_tokens=4, logprobs=True,
                                            top_k=2, ignore_eos=True, spec_tokens=0).to_engine(2048)
    assert prompts == [MESSAGES]
    assert params == [SamplingParams(max_tokens=4, top_k=2, ignore_eos=True, spec_tokens=0, logprobs=0)]
    assert CompletionRequest(prompt=[1, 2]).to_engine(100)[1][0].max_tokens == 100  # default: the context
    prompts, params = CompletionRequest(prompt=["a", [5, 6], "c"], n=2, seed=9).to_engine(100)
    assert prompts == ["a", [5, 6], "c"] and [p.seed for p in params] == [9, 10]  # each prompt's n choices
    with pytest.raises(APIError) as e:
        CompletionRequest(prompt="x", top_p=2.0).to_engine(100)
    assert (e.value.status, e.value.param, e.value.message) == (400, "top_p", "top_p=2.0: Input should be less "
                                                                               "than or equal to 1")
    with pytest.raises(APIError) as e:
        ChatCompletionRequest(messages=[]).to_engine(100)
    assert (e.value.status, e.value.param, e.value.message) == (400, "messages", "messages=[]: give at least one "
                                                                                  "message")


def test_a_batch_line_goes_through_the_mapping(tmp_path):
    from deployments.batch_input import BatchRequest, LineError, LineReader

    path = tmp_path / "in.jsonl"
    lines = [{"id": 1, "messages": MESSAGES, "top_k": 4, "spec_tokens": 1}, {"id": 2, "prompt": ""},
             {"id": 3, "prompt": "x", "top_p": 0.0}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    items = list(LineReader(path, Counter(), default_max_tokens=12))
    assert items == [BatchRequest(1, 1, MESSAGES, SamplingParams(max_tokens=12, top_k=4, spec_tokens=1)),
                     LineError(2, 2, "prompt is empty: give at least one token"),
                     LineError(3, 3, "top_p=0.0: Input should be greater than 0")]


def test_cli_flags_go_through_the_mapping():
    from cluster.cli import engine_requests
    from cluster.prompt_file import PromptLine

    args = argparse.Namespace(temperature=0.7, top_p=0.8, top_k=5, min_p=0.05, seed=4, stop=["\n"], max_tokens=9)
    lines = [PromptLine(0, {"prompt": "a"}), PromptLine(1, {"messages": MESSAGES, "prompt": "no", "max_tokens": 2}),
             PromptLine(2, {"messages": [], "prompt": "b"}), PromptLine(3, {"prompt": [5, 6]})]
    flags = dict(temperature=0.7, top_p=0.8, top_k=5, min_p=0.05, seed=4, stop=("\n",))
    assert engine_requests(args, lines) == [
        EngineRequest("a", SamplingParams(max_tokens=9, **flags)),
        EngineRequest(MESSAGES, SamplingParams(max_tokens=2, **flags)),
        EngineRequest("b", SamplingParams(max_tokens=9, **flags)),
        EngineRequest([5, 6], SamplingParams(max_tokens=9, **flags))]
    with pytest.raises(RequestError, match="top_k=-3"):
        engine_requests(argparse.Namespace(**{**vars(args), "top_k": -3}), lines[:1])


def test_a_grpc_message_goes_through_the_same_models():
    from deployments.grpc_ingress import to_openai_request
    from deployments.protos import specray_pb2 as pb

    req, chat = to_openai_request(pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="hi")],
                                                     max_tokens=6, top_k=2), stream=False)
    prompts, params = req.to_engine(64)
    assert chat and prompts == [MESSAGES] and params == [SamplingParams(max_tokens=6, top_k=2)]
