"""Serving operations of the OpenAI ingress over HTTP: one restrictive Serve application of the
default model (loaded once for the module; deleting it is the last test): the API key, the body
size limit, bad input, overload (429/503 with Retry-After), n > 1 choices and logprobs streamed
and not, draining and graceful shutdown. Without HTTP: tests/test_serving_ops.py."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time

import pytest
import requests

from deployments.serve_config import ServeArgs
from tests.serve_app import serve_app

MODEL = "smollm2-135m"
KEY = "sk-test-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The three primary colours are"


# ---- over HTTP: one restrictive Serve application -------------------------------------------
APP = "specray-ops"
OPS_ARGS = dict(max_ongoing_requests=2, max_queued_requests=1, retry_after_s=2, api_key=KEY,
                max_request_bytes=4096, num_cpus=1, graceful_shutdown_timeout_s=60)


@pytest.fixture(scope="module")
def base_url(ray_cluster):
    with serve_app(APP, **OPS_ARGS) as url:
        yield url


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
    (429) with Retry-After; every admitted request completes in full."""
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
        assert dt < 3.0 and r.headers["retry-after"] == "2"
        assert _error(r, 429)["type"] == "rate_limit_error"  # the replica's own answer, in OpenAI format
    stats = _stats()
    assert (stats["admission_running"], stats["admission_waiting"]) == (0, 0)
    assert _post(base_url, "completions", {"prompt": "Hi", "max_tokens": 2}).status_code == 200


def _http_counts(base_url) -> dict[tuple[str, str], float]:
    """specray:http_requests_total by (route, status), from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{base_url}/metrics", timeout=30).text
    return {(s.labels["route"], s.labels["status"]): s.value for fam in text_string_to_metric_families(text)
            if fam.name == "specray:http_requests" for s in fam.samples if s.name.endswith("_total")}


def _gauge(base_url, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{base_url}/metrics", timeout=30).text
    return next(s.value for fam in text_string_to_metric_families(text) if fam.name == name for s in fam.samples)


def test_a_burst_beyond_serve_limits_gets_only_200_or_openai_429_all_counted(base_url):
    """105 requests at once, more than the replica runs and queues (2 + 1) and three times what
    Serve lets into it (2 + 1 + 32): every answer comes from the app, 200 or a JSON 429 with Retry-After (Serve's own
    plain-text 503 never), and /metrics counts each one."""
    from deployments.app import deployment_options

    opts = deployment_options(ServeArgs(**OPS_ARGS))
    burst = 3 * opts["max_ongoing_requests"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "ignore_eos": True}
    before = _http_counts(base_url)
    start = concurrent.futures.ThreadPoolExecutor(burst)
    gate = concurrent.futures.Future()

    def call(_):
        gate.result()
        return _post(base_url, "completions", body)

    try:
        futures = [start.submit(call, i) for i in range(burst)]
        time.sleep(0.5)  # every thread waits at the gate: they start together
        gate.set_result(None)
        answers = [f.result() for f in futures]
    finally:
        start.shutdown()
    statuses = [r.status_code for r in answers]
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 3, statuses
    for r in answers:
        assert r.headers["content-type"] == "application/json", (r.status_code, r.headers, r.text)
        if r.status_code == 429:
            assert r.headers["retry-after"] == "2" and _error(r, 429)["code"] == "server_overloaded"
    after = _http_counts(base_url)
    for status in (200, 429):
        key = ("/v1/completions", str(status))
        assert after.get(key, 0) - before.get(key, 0) == statuses.count(status), (status, before, after)


def test_requests_in_the_admission_line_show_as_waiting(base_url):
    """Two long requests run (max_ongoing_requests=2), a third waits in the replica's line:
    specray:num_requests_queued and specray:num_requests_waiting count it."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 160, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_post, base_url, "completions", body) for _ in range(3)]
        seen = []
        for _ in range(100):
            seen.append((_gauge(base_url, "specray:num_requests_queued"),
                         _gauge(base_url, "specray:num_requests_waiting")))
            if seen[-1][0] == 1:
                break
            time.sleep(0.1)
        assert seen[-1][0] == 1 and seen[-1][1] >= 1, seen
        assert [f.result().status_code for f in futures] == [200] * 3
    assert _gauge(base_url, "specray:num_requests_queued") == _gauge(base_url, "specray:num_requests_waiting") == 0


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
    counts = {k: v for k, v in whole["usage"].items() if k != "prompt_tokens_details"}  # cache-dependent
    assert {k: v for k, v in events[-1]["usage"].items() if k != "prompt_tokens_details"} == counts
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


def test_the_replica_froze_its_loaded_objects_out_of_the_collectors_way(base_url):
    """A replica moves what it loaded (model, libraries, Ray, Serve) into the collector's permanent
    generation once its engine is up (actors/gc_pauses.py), so a full collection never walks them
    mid-stream; /metrics shows how many and times every collection."""
    assert _gauge(base_url, "specray:gc_frozen_objects") > 10_000
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{base_url}/metrics", timeout=30).text
    pauses = next(fam for fam in text_string_to_metric_families(text) if fam.name == "specray:gc_pause_seconds")
    full = [s.value for s in pauses.samples if s.name.endswith("_count") and s.labels["generation"] == "2"]
    assert full and full[0] >= 1  # at least the freeze's own collection


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

    from deployments.replica_state import serve_replica_draining

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

