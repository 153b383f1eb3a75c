"""The OpenAI-compatible HTTP ingress on Ray Serve, called with the official `openai` client (sync and
async, streaming and not): same greedy output as the in-process engine, usage counts right, SSE
chunks well formed, bad input answered with the right status and an OpenAI error body."""
from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
import requests

from cluster.config import EngineConfig
from tests.ports import greedy_reference
from tests.serve_app import ngram_engine, serve_app

pytestmark = [pytest.mark.ray, pytest.mark.model]

MODEL = "smollm2-135m"
PROMPT = "The three primary colours are"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
TOKENS = 16


def _config() -> EngineConfig:
    return ngram_engine(4)


@pytest.fixture(scope="module")
def base_url(ray_cluster):
    with serve_app("specray-test", engine=_config(), num_cpus=1) as url:
        yield url


@pytest.fixture(scope="module")
def reference(default_model):
    """Greedy outputs of the in-process engine for the same prompts (completion, chat)."""
    return greedy_reference(default_model, _config(), PROMPT, MESSAGES, TOKENS)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _check_speculation(extra: dict) -> None:
    spec = extra["speculation"]
    assert 0 <= spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
    if spec["num_draft_tokens"]:
        assert spec["acceptance_rate"] == pytest.approx(spec["num_accepted_tokens"] / spec["num_draft_tokens"])


def test_health_and_models(base_url, client):
    assert requests.get(f"{base_url}/health", timeout=30).json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == [MODEL]
    schema = requests.get(f"{base_url}/openapi.json", timeout=30).json()
    assert "/v1/chat/completions" in schema.get("paths", {}), schema


def test_completion_matches_in_process_engine(client, reference):
    ref = reference["completion"]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TOKENS, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL and r.id
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.completion_tokens == len(ref.token_ids) == ref.num_output_tokens
    assert r.usage.prompt_tokens == ref.num_prompt_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    _check_speculation(r.model_extra)


def test_chat_matches_in_process_engine(client, reference):
    ref = reference["chat"]
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=TOKENS, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.prompt_tokens == ref.num_prompt_tokens
    _check_speculation(r.model_extra)


def test_streamed_completion_with_usage(client, reference):
    ref = reference["completion"]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TOKENS, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == ref.text
    assert text_chunks[-1].choices[0].finish_reason == ref.finish_reason
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1]
    assert not usage.choices and usage.usage.completion_tokens == len(ref.token_ids)
    _check_speculation(usage.model_extra)


def test_async_chat_streaming_and_not(base_url, reference):
    ref = reference["chat"]

    async def main():
        aclient = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)

        async def streamed():
            stream = await aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=TOKENS,
                                                           temperature=0, stream=True)
            return [c async for c in stream]

        whole, chunks = await asyncio.gather(
            aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=TOKENS, temperature=0),
            streamed())
        await aclient.close()
        return whole, chunks

    whole, chunks = asyncio.run(main())
    assert whole.choices[0].message.content == ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason


def test_sse_wire_format(base_url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "stream": True}
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.content.decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for ev in events[:-2]:
        assert ev.startswith("data: ") and "\n" not in ev
        chunk = json.loads(ev.removeprefix("data: "))
        assert chunk["object"] == "text_completion" and len(chunk["choices"]) == 1


BAD = [  # (endpoint, body or raw text, status, field the message and param must name)
    ("completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens"),
    ("chat/completions", {"messages": MESSAGES, "temperature": -1}, 400, "temperature"),
    ("completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("chat/completions", {"messages": MESSAGES, "n": 17}, 400, "n"),
    ("completions", {"prompt": "hi", "model": "gpt-nope"}, 404, "model"),
    ("completions", {"prompt": list(range(5, 20000))}, 400, "prompt"),
    ("completions", {"prompt": "hi", "max_token": 5}, 422, "max_token"),
    ("completions", {"prompt": "hi", "max_tokens": "many"}, 422, "max_tokens"),
    ("chat/completions", {"messages": [{"role": "user"}]}, 400, "messages"),  # content: only tool calls may leave it out
    ("chat/completions", '{"messages": [', 400, None),
]


@pytest.mark.parametrize("endpoint,body,status,field", BAD, ids=[f"{b[2]}-{b[3]}" for b in BAD])
def test_bad_input_gets_openai_error(base_url, endpoint, body, status, field):
    url = f"{base_url}/v1/{endpoint}"
    if isinstance(body, str):
        r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=60)
    else:
        r = requests.post(url, json={"model": MODEL, **body} if "model" not in body else body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if field is not None:
        assert field in err["message"] and err["param"] == field
    if field == "prompt":
        assert "context" in err["message"]
    if body == BAD[-1][1]:
        assert "JSON" in err["message"]


def test_client_errors_and_server_keeps_serving(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=-3)
    with pytest.raises(openai.NotFoundError, match="gpt-nope"):
        client.chat.completions.create(model="gpt-nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=-1, stream=True)
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens >= 1


def _engine_stats() -> dict:
    from ray import serve

    return serve.get_app_handle("specray-test").engine_stats.remote().result(timeout_s=30)


def test_disconnect_mid_stream_aborts_and_frees_kv(base_url, client):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=120) as r:
        lines = r.iter_lines()
        assert next(lines).startswith(b"data: ")
    for _ in range(100):  # the proxy notices the closed socket and cancels the handler
        stats = _engine_stats()
        if not stats["has_unfinished"]:
            break
        time.sleep(0.2)
    assert not stats["has_unfinished"], "the request kept running after the client went away"
    assert stats["num_free_blocks"] == stats["num_blocks"]
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_serve_command_parses_and_rejects_bad_port():
    import argparse

    from cluster.cli import BadInput
    from cluster.serve_cli import add_serve_parser, cmd_serve, usage_text

    sub = argparse.ArgumentParser(prog="specray").add_subparsers(dest="command")
    add_serve_parser(sub)
    args = sub.choices["serve"].parse_args(["--port", "0", "--draft", "ngram", "--spec-tokens", "3"])
    assert (args.host, args.draft, args.spec_tokens) == ("127.0.0.1", "ngram", 3)
    with pytest.raises(BadInput, match="--port 0"):
        cmd_serve(args)  # rejected before Ray or Serve start
    text = usage_text("0.0.0.0", 8000, MODEL)
    assert "curl http://127.0.0.1:8000/v1/chat/completions" in text and "OpenAI(base_url=" in text


def test_conformance_over_serve(base_url, client):
    """The conformance layer through Serve's proxy (in-process in tests/test_openai_conformance.py):
    content parts, usage on every chunk, ignored and rejected fields, the context check, the
    OpenAPI responses and 405's Allow."""
    parts = client.chat.completions.create(model=MODEL, max_tokens=TOKENS, temperature=0, user="u", store=False,
                                           metadata={"k": "v"}, tools=[], response_format={"type": "text"},
                                           messages=[{"role": "user", "content": [
                                               {"type": "text", "text": "Name three colours."}]}])
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=TOKENS, temperature=0)
    assert parts.choices[0].message.content == plain.choices[0].message.content
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage is not None for c in chunks) and chunks[-1].usage.completion_tokens >= 1
    for kwargs, param in [(dict(tools=[{"type": "function", "function": {"name": "f f", "parameters": {}}}]), "tools"),
                          (dict(response_format={"type": "json_schema", "json_schema": {
                              "name": "bad", "schema": {"type": "wat"}}}), "response_format"),
                          (dict(temperature=1e308), "temperature")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, **kwargs)
        assert e.value.body["param"] == param and param in e.value.body["message"]
    r = requests.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": [True, False]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = requests.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": list(range(5, 4005)),
                                                          "max_tokens": 500}, timeout=60)  # the context: 4076
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "4000 tokens and max_tokens=500: 4500 tokens, more than the model's context of" in r.json()["error"]["message"]
    r = requests.get(f"{base_url}/v1/completions", timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["message"]
    doc = requests.get(f"{base_url}/openapi.json", timeout=30).json()
    responses = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "429", "503"} <= set(responses) and "text/event-stream" in responses["200"]["content"]
    assert responses["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
