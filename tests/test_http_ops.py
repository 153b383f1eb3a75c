"""Serving operations of the OpenAI ingress: admission control (429/503 with Retry-After, never a
hang), draining and graceful shutdown, the API key, the body size limit, n > 1 choices, logprobs,
and the Serve options derived from ServeArgs.

The first part runs ``OpenAIServer`` in-process on a tiny model (protocol-neutral, fast); the second
runs one restrictive Serve application of the default model over HTTP (loaded once for the module;
deleting it is the last test)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time

import pytest
import requests

from cluster.config import EngineConfig, SpeculativeConfig
from deployments.admission import Admission
from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest
from deployments.serve_config import ServeArgs
from tests.ports import free_port

MODEL = "smollm2-135m"
KEY = "sk-test-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The three primary colours are"


# ---- admission, protocol-neutral -------------------------------------------------------------
def test_admission_runs_queues_then_refuses_with_retry_after():
    async def main():
        adm = Admission(max_running=2, max_waiting=1, retry_after_s=3, wait_timeout_s=5)
        a, b = await adm.admit(1), await adm.admit(1)
        waiter = asyncio.create_task(adm.admit(1))
        await asyncio.sleep(0)
        assert adm.num_waiting == 1 and not waiter.done()
        t0 = time.perf_counter()
        with pytest.raises(APIError) as e:
            await adm.admit(1)
        assert time.perf_counter() - t0 < 0.1
        assert e.value.status == 429 and e.value.retry_after_s == 3 and e.value.code == "server_overloaded"
        assert "max_ongoing_requests=2" in e.value.message and "max_queued_requests=1" in e.value.message
        a.release()
        a.release()  # idempotent: every exit path may release
        c = await asyncio.wait_for(waiter, 1)
        assert adm.running == 2 and adm.num_waiting == 0
        b.release(), c.release()
        assert adm.running == 0

    asyncio.run(main())


def test_admission_wait_times_out_and_cancel_leaves_the_line():
    async def main():
        adm = Admission(max_running=1, max_waiting=2, retry_after_s=1, wait_timeout_s=0.2)
        held = await adm.admit(1)
        with pytest.raises(APIError, match="waited 0.2s"):
            await adm.admit(1)
        gone = asyncio.create_task(adm.admit(1))
        await asyncio.sleep(0.01)
        gone.cancel()  # the client went away while waiting
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert adm.num_waiting == 0 and adm.running == 1
        with pytest.raises(APIError, match="n=2") as e:
            await adm.admit(2)  # can never fit: a 400 naming n, not a 429 to retry forever
        assert e.value.status == 400 and e.value.param == "n"
        held.release()
        assert adm.running == 0

    asyncio.run(main())


# ---- OpenAIServer in-process on a tiny model ---------------------------------------------------
@pytest.fixture(scope="module")
def tiny_ngram_engine(tiny_target_dir):
    from tests.tiny import tiny_engine

    return tiny_engine(tiny_target_dir, draft="ngram", k=3)


def _server(engine, max_running=4, max_waiting=2):
    from cluster.async_engine import AsyncLLMEngine
    from deployments.openai_server import OpenAIServer

    return OpenAIServer(AsyncLLMEngine(engine), "tiny", engine.max_model_len,
                        Admission(max_running, max_waiting, retry_after_s=2, wait_timeout_s=5))


def test_n_choices_seeded_usage_counts_prompt_once(tiny_ngram_engine, tiny_prompts):
    async def main():
        server = _server(tiny_ngram_engine)
        try:
            req = CompletionRequest(prompt=tiny_prompts[0], n=3, max_tokens=6, temperature=1.0, seed=5,
                                    ignore_eos=True, logprobs=2)
            body = await server.handle(req, chat=False)
            again = await server.handle(req.model_copy(update={"n": 1, "seed": 6}), chat=False)
            return body, again
        finally:
            server.aeng.shutdown()

    body, again = asyncio.run(main())
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == len(tiny_prompts[0])
    assert body["usage"]["completion_tokens"] == 18
    assert body["usage"]["total_tokens"] == 18 + len(tiny_prompts[0])
    assert body["choices"][1]["text"] == again["choices"][0]["text"]  # choice i samples with seed + i
    for c in body["choices"]:
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
        assert all(2 <= len(top) <= 3 for top in lp["top_logprobs"])  # k alternatives + the chosen token


def test_draining_and_dead_engine_answer_503_with_retry_after(tiny_ngram_engine, tiny_prompts):
    async def main():
        server = _server(tiny_ngram_engine)
        req = CompletionRequest(prompt=tiny_prompts[0], max_tokens=12, ignore_eos=True, stream=True)
        stream = await server.handle(req, chat=False)
        server.begin_drain()
        with pytest.raises(APIError) as drained:
            await server.handle(req, chat=False)
        lines = [line async for line in stream]  # the request in flight runs to its end
        await stream.aclose()
        server.aeng.shutdown()
        with pytest.raises(APIError) as dead:
            await server.handle(req, chat=False)
        return drained.value, dead.value, lines, server

    drained, dead, lines, server = asyncio.run(main())
    assert drained.status == 503 and drained.retry_after_s == 2 and "draining" in drained.message
    assert dead.status == 503 and "engine is not running" in dead.message
    assert lines[-1] == "data: [DONE]\n\n"
    assert json.loads(lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    assert server.admission.running == 0


def test_a_stream_never_read_gives_its_room_back(tiny_ngram_engine, tiny_prompts):
    """A client gone before the first byte: closing the unread stream aborts the engine request."""
    async def main():
        server = _server(tiny_ngram_engine)
        try:
            req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], n=2, max_tokens=400,
                                        ignore_eos=True, stream=True)
            with pytest.raises(APIError, match="chat template"):
                await server.handle(req, chat=True)  # the tiny tokenizer has none: 400, nothing held
            assert server.admission.running == 0
            stream = await server.handle(CompletionRequest(prompt=tiny_prompts[0], n=2, max_tokens=400,
                                                           ignore_eos=True, stream=True), chat=False)
            assert server.admission.running == 2
            await stream.aclose()
            for _ in range(100):
                if not server.aeng.engine.has_unfinished():
                    break
                await asyncio.sleep(0.02)
            return server.admission.running, server.aeng.engine
        finally:
            server.aeng.shutdown()

    running, engine = asyncio.run(main())
    assert running == 0 and not engine.has_unfinished()
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


# ---- Serve options from ServeArgs (pure) -------------------------------------------------------
def test_deployment_options_follow_serve_args():
    from deployments.app import app_builder, deployment_options

    opts = deployment_options(ServeArgs(max_ongoing_requests=4, max_queued_requests=0, retry_after_s=7,
                                        num_cpus=0.5, num_gpus=1, graceful_shutdown_timeout_s=12,
                                        autoscaling={"min_replicas": 1, "max_replicas": 3}))
    assert opts["max_ongoing_requests"] > 4  # the replica's own admission answers overload first
    assert opts["max_queued_requests"] >= opts["max_ongoing_requests"]  # Serve's queue: a backstop only
    assert opts["backpressure_config"] == {"status_code": 503, "retry_after_s": 7}
    assert opts["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 1}
    assert opts["graceful_shutdown_timeout_s"] == 12 and opts["autoscaling_config"]["max_replicas"] == 3
    assert "num_replicas" not in opts
    assert deployment_options(ServeArgs(num_replicas=2))["num_replicas"] == 2
    with pytest.raises(ValueError, match=r"^args: engine\.max_num_seqs=0: .*greater than or equal to 1"):
        app_builder({"engine": {"max_num_seqs": 0}})
    with pytest.raises(ValueError, match="max_ongoing_request"):
        app_builder({"max_ongoing_request": 3})
    app = app_builder({"engine": {"model": MODEL}, "num_cpus": 0.25})
    assert app is not None


# ---- over HTTP: one restrictive Serve application -------------------------------------------
APP = "specray-ops"
OPS_ARGS = dict(max_ongoing_requests=2, max_queued_requests=1, retry_after_s=2, api_key=KEY,
                max_request_bytes=4096, num_cpus=1, graceful_shutdown_timeout_s=60)


@pytest.fixture(scope="module")
def base_url(ray_cluster):
    from ray import serve

    from deployments.app import build_app

    engine = EngineConfig(num_kv_blocks=256, num_threads=1, speculative=SpeculativeConfig.from_draft_arg("ngram", 4))
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_app(ServeArgs(engine=engine, **OPS_ARGS)), name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


def _post(base_url, path, body, headers=AUTH, **kw):
    return requests.post(f"{base_url}/v1/{path}", json=body, headers=headers, timeout=120, **kw)


def _error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def _stats() -> dict:
    from ray import serve

    return serve.get_app_handle(APP).engine_stats.remote().result(timeout_s=30)


def test_api_key_guards_v1_only(base_url):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
        r = requests.get(f"{base_url}/v1/models", headers=headers, timeout=30)
        err = _error(r, 401)
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        assert "Authorization: Bearer" in err["message"] and r.headers["www-authenticate"] == "Bearer"
    r = _post(base_url, "completions", {"prompt": "hi", "max_tokens": 2}, headers={"Authorization": "Bearer x"})
    _error(r, 401)
    assert requests.get(f"{base_url}/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"] == MODEL
    assert requests.get(f"{base_url}/health", timeout=30).json() == {"status": "ok"}  # open, no key


def test_oversized_body_is_refused_before_parsing(base_url):
    big = {"prompt": "x" * 5000, "max_tokens": 2}
    err = _error(_post(base_url, "completions", big), 413)
    assert "4096" in err["message"] and err["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit applies to what arrives
        for _ in range(10):
            yield b" " * 1000
        yield json.dumps(big).encode()

    r = requests.post(f"{base_url}/v1/completions", data=chunks(), timeout=60,
                      headers={**AUTH, "Content-Type": "application/json"})
    err = _error(r, 413)
    assert "max_request_bytes=4096" in err["message"]
    r = _post(base_url, "completions", {"prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


BAD = [  # (endpoint, body, status, field the message and param must name)
    ("completions", {"prompt": "hi", "n": 17}, 400, "n"),
    ("completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("completions", {"prompt": "hi", "n": 3}, 400, "n"),  # more than this replica runs at once (2)
    ("completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("completions", {"prompt": "hi", "logprobs": True}, 422, "logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     400, "top_logprobs"),
]


@pytest.mark.parametrize("endpoint,body,status,field", BAD, ids=[f"{b[2]}-{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_names_the_field(base_url, endpoint, body, status, field):
    err = _error(_post(base_url, endpoint, {"model": MODEL, **body}), status)
    assert err["param"] == field and field in err["message"]


def test_overload_is_answered_fast_and_admitted_requests_complete(base_url):
    """max_ongoing_requests=2, max_queued_requests=1, 10 at once: the extras are refused at once
    (429 or Serve's 503) with Retry-After; every admitted request completes in full."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "ignore_eos": True}

    def call(_):
        t0 = time.perf_counter()
        r = _post(base_url, "completions", body)
        return r, time.perf_counter() - t0

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(pool.map(call, range(10)))
    ok = [r for r, _ in results if r.status_code == 200]
    refused = [(r, dt) for r, dt in results if r.status_code != 200]
    assert 1 <= len(ok) <= 4 and len(refused) >= 6, [r.status_code for r, _ in results]
    for r in ok:
        assert r.json()["usage"]["completion_tokens"] == 24 and r.json()["choices"][0]["finish_reason"] == "length"
    for r, dt in refused:
        assert r.status_code in (429, 503) and dt < 3.0
        assert r.headers["retry-after"] == "2"
        err = _error(r, r.status_code)
        assert err["type"] in ("rate_limit_error", "service_unavailable_error")
    assert any(r.status_code == 429 for r, _ in refused)  # the replica's own answer, in OpenAI format
    stats = _stats()
    assert (stats["admission_running"], stats["admission_waiting"]) == (0, 0)
    assert _post(base_url, "completions", {"prompt": "Hi", "max_tokens": 2}).status_code == 200


def test_n_choices_and_logprobs_streamed_match_non_streamed(base_url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "n": 2, "temperature": 1.0, "seed": 11,
            "logprobs": 1, "ignore_eos": True}
    whole = _post(base_url, "completions", body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert whole["usage"]["completion_tokens"] == 16
    with _post(base_url, "completions", {**body, "stream": True, "stream_options": {"include_usage": True}},
               stream=True) as r:
        events = [json.loads(e.removeprefix("data: ")) for e in r.content.decode().split("\n\n")
                  if e.startswith("data: {")]
    texts, tokens, finish = {0: "", 1: ""}, {0: [], 1: []}, {}
    for ev in events[:-1]:
        (c,) = ev["choices"]
        texts[c["index"]] += c["text"]
        if c["logprobs"]:
            tokens[c["index"]] += c["logprobs"]["tokens"]
        if c["finish_reason"]:
            finish[c["index"]] = c["finish_reason"]
    assert events[-1]["usage"] == whole["usage"]
    for c in whole["choices"]:
        i, lp = c["index"], c["logprobs"]
        assert texts[i] == c["text"] and finish[i] == c["finish_reason"] == "length"
        assert tokens[i] == lp["tokens"] and len(lp["tokens"]) == 8
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:j]) for j in range(8)]
        for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert value <= 0 and top[tok] == value and max(top.values()) >= value


def test_chat_logprobs_of_greedy_tokens_are_the_top_ones(base_url):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8,
            "logprobs": True, "top_logprobs": 3}
    choice = _post(base_url, "chat/completions", body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 8 and "".join(item["token"] for item in content) == choice["message"]["content"]
    for item in content:
        assert len(item["top_logprobs"]) == 3 and item["bytes"] == list(item["token"].encode())
        assert item["top_logprobs"][0]["token"] == item["token"]
        assert item["top_logprobs"][0]["logprob"] == pytest.approx(item["logprob"])
    with _post(base_url, "chat/completions", {**body, "stream": True}, stream=True) as r:
        events = [json.loads(e.removeprefix("data: ")) for e in r.content.decode().split("\n\n")
                  if e.startswith("data: {")]
    streamed = [item for ev in events for item in ((ev["choices"][0]["logprobs"] or {}).get("content") or [])]
    assert [i["token"] for i in streamed] == [i["token"] for i in content]
    assert [i["logprob"] for i in streamed] == pytest.approx([i["logprob"] for i in content], abs=1e-4)


def test_omitted_max_tokens_runs_to_the_end(base_url):
    """No max_tokens: until EOS or the context end, not a small default."""
    r = _post(base_url, "chat/completions", {"messages": [{"role": "user", "content": "Count from 1 to 40."}],
                                             "stop": ["29"]})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and r.json()["usage"]["completion_tokens"] > 64


@pytest.fixture
def probe_app(ray_cluster, base_url):
    """A tiny deployment whose call waits until its replica sees Serve's drain begin."""
    from ray import serve

    from deployments.app import serve_replica_draining

    @serve.deployment(ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=30,
                      graceful_shutdown_wait_loop_s=0.2)
    class DrainProbe:
        async def wait_for_drain(self) -> dict:
            before = serve_replica_draining()
            for _ in range(400):
                if serve_replica_draining():
                    return {"before": before, "seen": True}
                await asyncio.sleep(0.05)
            return {"before": before, "seen": False}

    return serve.run(DrainProbe.bind(), name="drain-probe", route_prefix="/drain-probe")


def test_serve_drain_is_detected_by_the_replica(probe_app):
    from ray import serve

    pending = probe_app.wait_for_drain.remote()
    time.sleep(1.0)
    serve.delete("drain-probe", _blocking=False)
    assert pending.result(timeout_s=60) == {"before": False, "seen": True}


def test_delete_lets_streams_in_flight_finish(base_url):
    """Last: deletes the app. The stream started before the delete ends normally."""
    from ray import serve

    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "stream": True}
    with _post(base_url, "completions", body, stream=True) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line)
        serve.delete(APP, _blocking=False)
        rest = [line.decode() for line in lines if line]
    events = [first.decode(), *rest]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("error" not in c for c in chunks)
    for _ in range(100):  # the app goes away once the drain is over
        if APP not in serve.status().applications:
            break
        time.sleep(0.3)
    assert APP not in serve.status().applications
