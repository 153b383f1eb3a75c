"""OpenAI conformance (deployments/openai_fields.py): every field of OpenAI's chat and completions
requests is implemented, accepted and ignored, or refused with a 400 naming it; the README's table
says what the code's says, and the code's covers every field of the official SDK.

The behaviour is checked with the official `openai` client against the real FastAPI app of
deployments/app.py, in-process: the Serve routes get the replica object they run on directly
(``serve.get_replica_context`` patched), over the default model with a short context (256 tokens)
so that context-overflow cases are cheap. Over Serve and HTTP: tests/test_openai_http.py."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace

import httpx2 as httpx
import openai
import pytest

from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest
from deployments.openai_fields import BY_NAME, FIELDS, Status

MODEL = "smollm2-135m"
CONTEXT = 256
MESSAGES = [{"role": "user", "content": "Name three colours."}]
README = Path(__file__).resolve().parents[1] / "README.md"


# ---- the table -------------------------------------------------------------------------------
def _names(chat: bool, top_level: bool = True) -> set[str]:
    return {f.name for f in FIELDS if (f.chat if chat else f.completions) and f.top_level == top_level}


def test_every_field_of_the_openai_sdk_has_a_row():
    """A field the installed SDK sends that the table does not know fails here: decide its row."""
    from openai.types import completion_create_params as completions
    from openai.types.chat import ChatCompletionStreamOptionsParam
    from openai.types.chat import completion_create_params as chat
    from openai.types.chat import (ChatCompletionAssistantMessageParam, ChatCompletionDeveloperMessageParam,
                                   ChatCompletionSystemMessageParam, ChatCompletionToolMessageParam,
                                   ChatCompletionUserMessageParam)

    sdk_chat = set(chat.CompletionCreateParamsBase.__annotations__) | {"stream"}
    sdk_completions = set(completions.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert sdk_chat - _names(chat=True) == set()
    assert sdk_completions - _names(chat=False) == set()
    nested = _names(chat=True, top_level=False)
    assert {f"stream_options.{k}" for k in ChatCompletionStreamOptionsParam.__annotations__} <= nested
    for message in (ChatCompletionAssistantMessageParam, ChatCompletionDeveloperMessageParam,
                    ChatCompletionSystemMessageParam, ChatCompletionToolMessageParam, ChatCompletionUserMessageParam):
        keys = set(message.__annotations__) - {"role"}
        assert {f"messages[].{k}" for k in keys} <= nested, message.__name__


@pytest.mark.parametrize("model, chat", [(ChatCompletionRequest, True), (CompletionRequest, False)])
def test_the_request_models_declare_exactly_the_table(model, chat):
    assert set(model.model_fields) == _names(chat)


def _readme_rows() -> list[tuple[str, ...]]:
    text = README.read_text()
    section = text[text.index("### OpenAI conformance"):]
    section = section[:section.index("\n### ", 1)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append((cells[0].strip("`"), *cells[1:]))
    return rows


def test_readme_table_is_the_code_table():
    """Regenerate README's table with ``python -m deployments.openai_fields`` after changing a row."""
    mark = {True: "✓", False: "—"}
    want = [(f.name, mark[f.chat], mark[f.completions], f.status.value, f.note) for f in FIELDS]
    assert _readme_rows() == want


# Values that ask for something this server cannot do, per rejected top-level field.
REJECTED = {
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "auto", "functions": [{"name": "f"}], "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"}, "web_search_options": {}, "reasoning_effort": "high",
    "verbosity": "low", "moderation": {"model": "omni-moderation-latest"}, "response_format": {"type": "json_object"},
    "suffix": "!", "echo": True, "best_of": 2,
}
NEUTRAL = {"tools": [], "tool_choice": "none", "functions": [], "function_call": "none", "modalities": ["text"],
           "reasoning_effort": "none", "verbosity": "medium", "response_format": {"type": "text"}, "suffix": "",
           "echo": False, "best_of": 1}
IGNORED = {"user": "u-1", "safety_identifier": "s-1", "metadata": {"k": "v"}, "store": True, "service_tier": "auto",
           "prompt_cache_key": "k", "prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": "1h"},
           "parallel_tool_calls": False}


def test_every_rejected_and_ignored_field_has_an_example():
    top = {f.name: f for f in FIELDS if f.top_level}
    assert {n for n, f in top.items() if f.status is Status.REJECTED} == set(REJECTED)
    assert {n for n, f in top.items() if f.status is Status.IGNORED} == set(IGNORED)
    assert set(NEUTRAL) <= set(REJECTED)


def _request(name: str, value):
    f = BY_NAME[name]
    if f.chat:
        return ChatCompletionRequest(messages=MESSAGES, **{name: value})
    return CompletionRequest(prompt="hi", **{name: value})


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_a_rejected_field_is_a_400_naming_it_and_its_neutral_value_is_not(name):
    with pytest.raises(APIError) as e:
        _request(name, REJECTED[name]).to_engine(CONTEXT)
    assert e.value.status == 400 and e.value.param == name
    assert e.value.message.startswith(f"{name}=") and "not supported" in e.value.message
    if name in NEUTRAL:
        _request(name, NEUTRAL[name]).to_engine(CONTEXT)


@pytest.mark.parametrize("message, words", [
    ({"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}, "messages[0].tool_calls="),
    ({"role": "assistant", "content": "x", "function_call": {"name": "f"}}, "messages[0].function_call="),
    ({"role": "assistant", "content": "x", "audio": {"id": "a"}}, "messages[0].audio="),
    ({"role": "assistant", "content": "x", "refusal": "no"}, "messages[0].refusal="),
    ({"role": "function", "content": "x", "name": "f"}, "messages[0].role='function'"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
     "messages[0].content[0]: content parts of type 'image_url'"),
    ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0]: a 'text' part needs a string"),
])
def test_a_rejected_message_field_is_a_400_naming_it(message, words):
    with pytest.raises(APIError) as e:
        ChatCompletionRequest(messages=[message]).to_engine(CONTEXT)
    assert e.value.status == 400 and e.value.param == "messages" and e.value.message.startswith(words)


def test_accepted_message_fields():
    msgs = [{"role": "system", "content": "Be brief.", "name": "sys"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
             "tool_calls": [], "refusal": None},
            {"role": "tool", "content": "42", "tool_call_id": "call-1"}]
    prompt, _ = ChatCompletionRequest(messages=msgs).to_engine(CONTEXT)
    assert prompt == [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi\nthere"},
                      {"role": "tool", "content": "42"}]


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": [True, False]}, "prompt", "prompt: true is not a token id"),
    ({"prompt": [[5, 6], [7]]}, "prompt", "prompt: a list of 2 prompts"),
    ({"prompt": "x", "temperature": 1e308}, "temperature", "temperature=1e+308: must be between 0 and 2"),
    ({"prompt": "x", "temperature": 2.01}, "temperature", "temperature=2.01: must be between 0 and 2"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature", "temperature=nan: must be between 0 and 2"),
    ({"prompt": "x", "top_p": float("nan")}, "top_p", "top_p=nan: Input should be"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty", "presence_penalty=2.5: Input should be less"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias", "logit_bias="),
    ({"prompt": "x", "min_tokens": 9, "max_tokens": 4}, "min_tokens", "min_tokens=9: must be at most max_tokens=4"),
])
def test_bad_values_are_400s_naming_the_field(body, param, words):
    with pytest.raises(APIError) as e:
        CompletionRequest(**body).to_engine(CONTEXT)
    assert (e.value.status, e.value.param) == (400, param) and e.value.message.startswith(words), e.value.message


def test_a_boolean_is_not_a_number():
    from pydantic import ValidationError

    for field in ("max_tokens", "n", "seed", "temperature", "top_k"):
        with pytest.raises(ValidationError, match="must be a number, not a boolean"):
            CompletionRequest(prompt="x", **{field: True})
    assert CompletionRequest(prompt=[[5, 6]]).to_engine(CONTEXT)[0] == [5, 6]
    assert CompletionRequest(prompt="x", temperature=2, top_p=1).to_engine(CONTEXT)[1][0].temperature == 2.0


# ---- the official client against the real app, in-process ------------------------------------
@pytest.fixture(scope="module")
def app(default_model):
    """deployments.app's FastAPI app with its routes bound to an in-process replica stand-in."""
    from ray import serve

    from cluster.async_engine import AsyncLLMEngine
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine
    from deployments.admission import Admission
    from deployments.app import app
    from deployments.openai_server import OpenAIServer

    config = EngineConfig(num_kv_blocks=64, num_threads=1, max_model_len=CONTEXT,
                          speculative=SpeculativeConfig.from_draft_arg("ngram", 4))
    engine = LLMEngine(config, loaded=default_model)
    server = OpenAIServer(AsyncLLMEngine(engine), MODEL, engine.max_model_len, Admission(4, 8, 1, 30))
    replica = SimpleNamespace(server=server)
    patch = pytest.MonkeyPatch()
    patch.setattr(serve, "get_replica_context", lambda: SimpleNamespace(servable_object=replica))
    yield app
    patch.undo()
    server.aeng.shutdown()


def _call(app, fn, raw: bool = False):
    """Run ``fn(client)`` (a coroutine function) with an AsyncOpenAI client over the app in-process
    (``raw``: with the plain httpx client)."""
    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            if raw:
                return await fn(http)
            client = openai.AsyncOpenAI(base_url="http://app/v1", api_key="none", http_client=http, max_retries=0)
            return await fn(client)

    return asyncio.run(main())


def _chat(app, **kw):
    async def fn(client):
        return await client.chat.completions.create(model=MODEL, max_tokens=kw.pop("max_tokens", 8), temperature=0,
                                                    **{"messages": MESSAGES, **kw})
    return _call(app, fn)


def _counts(usage) -> dict:
    """Token counts of a usage object; cached_tokens depends on what the prefix cache held, so an
    identical request answered later may report more of them."""
    return usage.model_dump(exclude={"prompt_tokens_details"})


def test_content_parts_are_the_text_they_hold(app):
    parts = [{"type": "text", "text": "Name three"}, {"type": "text", "text": "colours."}]
    as_parts = _chat(app, messages=[{"role": "user", "content": parts}])
    as_text = _chat(app, messages=[{"role": "user", "content": "Name three\ncolours."}])
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert _counts(as_parts.usage) == _counts(as_text.usage)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(app, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert e.value.body["param"] == "messages" and "image_url" in e.value.body["message"]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_continuous_usage_stats_put_usage_on_every_chunk(app, chat):
    opts = {"include_usage": True, "continuous_usage_stats": True}

    async def fn(client):
        if chat:
            stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, n=2,
                                                          temperature=0, stream=True, stream_options=opts)
        else:
            stream = await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=10, temperature=0,
                                                     stream=True, stream_options=opts)
        return [c async for c in stream]

    async def whole(client):
        if chat:
            return await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, n=2,
                                                        temperature=0)
        return await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=10, temperature=0)

    chunks, reply = _call(app, fn), _call(app, whole)
    assert all(c.usage is not None for c in chunks)
    usages = [(c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) for c in chunks]
    assert len({u[0] for u in usages}) == 1 and all(u[2] == u[0] + u[1] for u in usages)
    assert [u[1] for u in usages] == sorted(u[1] for u in usages) and usages[-1][1] > usages[0][1]
    final = chunks[-1]
    assert not final.choices and usages[-2] == usages[-1]  # the last content chunk already had it all
    assert _counts(final.usage) == _counts(reply.usage)  # the same counts as the answer without streaming
    if chat:
        assert usages[0][1] == 0  # the role chunks come before any token


def test_without_include_usage_continuous_stats_add_nothing(app):
    async def fn(client):
        stream = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, stream=True,
                                                 stream_options={"continuous_usage_stats": True})
        return [c async for c in stream]

    assert all(c.usage is None for c in _call(app, fn))


def test_ignored_fields_and_neutral_values_change_nothing(app):
    plain = _chat(app)
    extra = {k: v for k, v in IGNORED.items() if k not in ("prompt_cache_options", "safety_identifier")}
    body = {"prompt_cache_options": IGNORED["prompt_cache_options"], "safety_identifier": "s-1"}
    neutral = {k: v for k, v in NEUTRAL.items() if BY_NAME[k].chat}
    reply = _chat(app, **extra, **neutral, extra_body=body,
                  messages=[{**MESSAGES[0], "name": "alice"}])
    assert reply.choices[0].message.content == plain.choices[0].message.content
    assert _counts(reply.usage) == _counts(plain.usage)

    async def fn(client):
        return await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0,
                                               user="u", echo=False, best_of=1, suffix="")
    assert _call(app, fn).usage.completion_tokens >= 1


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_the_client_gets_a_400_naming_each_rejected_field(app, name):
    async def fn(client):
        if BY_NAME[name].chat:
            return await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                                        extra_body={name: REJECTED[name]})
        return await client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                               extra_body={name: REJECTED[name]})

    with pytest.raises(openai.BadRequestError) as e:
        _call(app, fn)
    assert e.value.body["param"] == name and "not supported" in e.value.body["message"]


def test_extensions_and_penalties_through_the_client(app):
    long = _chat(app, max_tokens=12, extra_body={"min_tokens": 12, "ignore_eos": True, "top_k": 1,
                                                 "repetition_penalty": 1.0})
    assert long.usage.completion_tokens == 12 and long.choices[0].finish_reason == "length"

    async def fn(client):
        prompt = "one two one two one two one two"
        base = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        pen = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                              frequency_penalty=2.0, presence_penalty=2.0)
        rep = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                              extra_body={"repetition_penalty": 2.0})
        return base, pen, rep

    base, pen, rep = _call(app, fn)
    assert pen.choices[0].text != base.choices[0].text and rep.choices[0].text != base.choices[0].text
    async def biased(client):
        return await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0,
                                               logit_bias={"28": 100}, extra_body={"return_token_ids": True})
    out = _call(app, biased)
    assert out.choices[0].model_extra["token_ids"] == [28, 28, 28, 28]
    with pytest.raises(openai.BadRequestError) as e:
        _call(app, lambda c: c.completions.create(model=MODEL, prompt="x", logit_bias={"49152": 1}))
    assert e.value.body["param"] == "logit_bias" and "outside the vocabulary" in e.value.body["message"]


def test_prompt_and_max_tokens_over_the_context_is_a_400_naming_the_numbers(app):
    prompt = list(range(1000, 1200))  # 200 tokens of a 256-token context

    async def over(client):
        return await client.completions.create(model=MODEL, prompt=prompt, max_tokens=100)
    with pytest.raises(openai.BadRequestError) as e:
        _call(app, over)
    msg = e.value.body["message"]
    assert "200 tokens" in msg and "max_tokens=100" in msg and "context of 256" in msg and "max_tokens=56" in msg
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"

    async def until_the_end(client):
        return await client.completions.create(model=MODEL, prompt=prompt, extra_body={"ignore_eos": True})
    out = _call(app, until_the_end)  # max_tokens left out: until the context ends
    assert out.usage.completion_tokens == CONTEXT - 200 and out.choices[0].finish_reason == "length"


def test_raw_json_edge_cases(app):
    async def fn(http):
        nan = await http.post("/v1/completions", content=b'{"prompt": "x", "temperature": NaN}',
                              headers={"content-type": "application/json"})
        bools = await http.post("/v1/completions", json={"prompt": [True, False]})
        return nan, bools

    nan, bools = _call(app, fn, raw=True)
    assert nan.status_code == 400 and nan.json()["error"]["param"] == "temperature"
    assert bools.status_code == 400 and bools.json()["error"]["param"] == "prompt"


# ---- the OpenAPI document declares what the routes answer; 405 says what is allowed -------------
def _validator(doc: dict, name: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


def test_openapi_declares_the_real_answers_and_they_validate(app):
    async def fn(http):
        doc = (await http.get("/openapi.json")).json()
        chat = await http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, "logprobs": True,
                                                             "top_logprobs": 2, "return_token_ids": True})
        comp = await http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "logprobs": 1})
        stream = await http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3, "stream": True,
                                                               "stream_options": {"include_usage": True}})
        bad = await http.post("/v1/completions", json={"prompt": "x", "tools": []})
        models, health = await http.get("/v1/models"), await http.get("/health")
        return doc, chat, comp, stream, bad, models, health

    doc, chat, comp, stream, bad, models, health = _call(app, fn, raw=True)
    for path, method, body in [("/v1/completions", "post", "Completion"),
                               ("/v1/chat/completions", "post", "ChatCompletion")]:
        responses = doc["paths"][path][method]["responses"]
        assert set(responses) == {"200", "400", "401", "404", "413", "422", "429", "500", "503"}
        assert responses["200"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{body}")
        assert "text/event-stream" in responses["200"]["content"]
        assert responses["429"]["headers"]["Retry-After"] and responses["503"]["headers"]["Retry-After"]
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "HTTPValidationError" not in json.dumps(doc)
    _validator(doc, "ChatCompletion").validate(chat.json())
    _validator(doc, "Completion").validate(comp.json())
    events = [e.removeprefix("data: ") for e in stream.text.split("\n\n") if e]
    assert stream.headers["content-type"].startswith("text/event-stream") and events[-1] == "[DONE]"
    for event in events[:-1]:
        _validator(doc, "ChatCompletionChunk").validate(json.loads(event))
    assert bad.status_code == 422  # `tools` is a chat field: on completions it is an unknown one
    _validator(doc, "ErrorResponse").validate(bad.json())
    _validator(doc, "ModelList").validate(models.json())
    _validator(doc, "Health").validate(health.json())
    with pytest.raises(Exception):  # the schemas are strict: an undeclared key fails
        _validator(doc, "Completion").validate({**comp.json(), "surprise": 1})


def test_405_names_the_allowed_methods(app):
    async def fn(http):
        return await http.get("/v1/chat/completions"), await http.delete("/v1/models")

    for r, allowed in zip(_call(app, fn, raw=True), ("POST", "GET")):
        assert r.status_code == 405 and r.headers["allow"] == allowed
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
