"""Prometheus metrics: the engine's counters equal what its RequestOutputs report, histograms count
finished requests, snapshots of several registries merge to their sums (also through the hub), the
HTTP middleware counts every answer, and a Serve app with two replicas shows the totals of all
the traffic on /metrics."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.sampling_params import SamplingParams
from cluster.metrics import EngineMetrics
from cluster.metrics_merge import KV_TOTAL, KV_USAGE, KV_USED, Snapshot, merge_snapshots, render, snapshot
from tests.tiny import tiny_engine
from tests.serve_app import ngram_engine, serve_app

K = 4
MAX_TOKENS = 12
SPEC = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")


def sample_value(snap: Snapshot, sample_name: str, **labels: str) -> float:
    """Sum of the samples called ``sample_name`` whose labels include ``labels`` (0.0 if none)."""
    want = set(labels.items())
    return sum(v for fam in snap for n, lab, v in fam.samples if n == sample_name and want <= set(lab))


def _v(snap: Snapshot, name: str, **labels: str) -> float:
    return sample_value(snap, "specray:" + name, **labels)


def _per_pos(outs) -> list[int]:
    """Accepted tokens per position summed over requests."""
    n = max((len(o.accepted_per_pos) for o in outs), default=0)
    return [sum(o.accepted_per_pos[i] for o in outs if i < len(o.accepted_per_pos)) for i in range(n)]


@pytest.fixture(scope="module")
def spec_run(tiny_target_dir, tiny_draft_dir, tiny_prompts):
    """A draft-model engine (K=4) that served the tiny prompts greedily and sampled: (engine, outputs)."""
    eng = tiny_engine(tiny_target_dir, draft="draft", draft_dir=tiny_draft_dir, k=K)
    greedy = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    sampled = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, seed=5)
    outs = eng.generate(tiny_prompts, greedy, concurrency=3)
    outs += eng.generate(tiny_prompts[:4], sampled)
    return eng, outs


def test_counters_equal_the_request_outputs(spec_run):
    eng, outs = spec_run
    snap = eng.metrics.snapshot()
    for name, field in zip(SPEC, ("num_drafts", "num_draft_tokens", "num_accepted_tokens")):
        assert _v(snap, name) == sum(getattr(o, field) for o in outs), name
    assert _v(snap, SPEC[1]) > 0
    assert 0 <= _v(snap, SPEC[2]) <= _v(snap, SPEC[1])
    per_pos = [_v(snap, "spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(K)]
    expected = _per_pos(outs)
    assert per_pos == expected + [0] * (K - len(expected))
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:])), per_pos
    assert sum(per_pos) == _v(snap, SPEC[2])
    assert _v(snap, "prompt_tokens_total") == sum(o.num_prompt_tokens for o in outs)
    assert _v(snap, "generation_tokens_total") == sum(o.num_output_tokens for o in outs) == len(outs) * MAX_TOKENS
    assert _v(snap, "request_success_total", finished_reason="length") == len(outs)
    assert _v(snap, "request_success_total") == len(outs)


def test_histograms_count_finished_requests_and_steps(spec_run):
    eng, outs = spec_run
    snap = eng.metrics.snapshot()
    for h in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        assert _v(snap, h + "_count") == len(outs), h
        assert _v(snap, h + "_bucket", le="+Inf") == len(outs), h
    assert _v(snap, "e2e_request_latency_seconds_sum") == pytest.approx(sum(o.e2e_s for o in outs))
    assert _v(snap, "time_to_first_token_seconds_sum") == pytest.approx(sum(o.ttft_s for o in outs))
    steps = _v(snap, "spec_decode_verify_seconds_count")
    drafted = _v(snap, "spec_decode_draft_seconds_count")
    # one verification per step; a draft timing for every step that drafted, so at least one per draft
    # step of the longest request, and never more than steps
    assert max(o.num_drafts for o in outs) <= drafted <= steps
    assert _v(snap, "spec_decode_verify_seconds_sum") > 0


def test_gauges_and_prefix_cache_read_the_engine(spec_run, tiny_prompts):
    eng, _ = spec_run
    eng.generate(tiny_prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # same prompts again: hits
    snap = eng.metrics.snapshot()
    alloc = eng.allocator
    assert _v(snap, "num_requests_running") == _v(snap, "num_requests_waiting") == 0
    assert _v(snap, "kv_blocks_total") == alloc.num_blocks == 256
    assert _v(snap, "kv_blocks_used") == alloc.num_used_blocks == 0
    assert _v(snap, "prefix_cache_queries_total") == alloc.prefix_queries > 0
    assert 0 < _v(snap, "prefix_cache_hits_total") == alloc.prefix_hits


def test_gauges_while_requests_run_and_wait(tiny_target_dir, tiny_prompts):
    eng = tiny_engine(tiny_target_dir, max_num_seqs=2)
    for i, p in enumerate(tiny_prompts[:5]):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=8, ignore_eos=True))
    eng.step()
    snap = eng.metrics.snapshot()
    assert _v(snap, "num_requests_running") == 2 and _v(snap, "num_requests_waiting") == 3
    used = _v(snap, "kv_blocks_used")
    assert used == eng.allocator.num_used_blocks > 0
    assert _v(snap, "kv_cache_usage_perc") == pytest.approx(used / 256)
    assert _v(snap, "num_requests_queued") == 0  # no admission line watched


def test_waiting_counts_the_admission_line_too(tiny_target_dir, tiny_prompts):
    """Requests in the replica's admission line wait as much as those in the engine's queue."""
    eng = tiny_engine(tiny_target_dir, max_num_seqs=1)
    line = [4]
    eng.metrics.watch_queue(lambda: line[0])
    for i, p in enumerate(tiny_prompts[:3]):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=4, ignore_eos=True))
    eng.step()
    snap = eng.metrics.snapshot()
    assert _v(snap, "num_requests_running") == 1
    assert _v(snap, "num_requests_queued") == 4 and _v(snap, "num_requests_waiting") == 2 + 4
    line[0] = 0
    assert _v(eng.metrics.snapshot(), "num_requests_waiting") == 2


def test_process_resident_memory_is_the_processes_rss(tiny_target_dir):
    from cluster.heap import resident_bytes

    rss = resident_bytes()
    if rss is None:
        pytest.skip("no /proc/self/statm here")
    got = _v(tiny_engine(tiny_target_dir).metrics.snapshot(), "process_resident_memory_bytes")
    assert got == pytest.approx(rss, rel=0.2) and got > 50 * 2**20


def test_abort_and_no_speculation(tiny_target_dir, tiny_prompts):
    eng = tiny_engine(tiny_target_dir)
    eng.add_request("a", tiny_prompts[0], SamplingParams(max_tokens=8, ignore_eos=True))
    first = eng.step()
    final = eng.abort("a")
    assert final.finish_reason == "abort" and eng.abort("a") is None
    snap = eng.metrics.snapshot()
    assert _v(snap, "request_success_total", finished_reason="abort") == 1
    assert _v(snap, "request_success_total") == 1
    assert _v(snap, "generation_tokens_total") == sum(len(o.delta_token_ids) for o in first) == final.num_output_tokens
    assert _v(snap, "e2e_request_latency_seconds_count") == 1
    assert _v(snap, "spec_decode_draft_seconds_count") == 0
    assert all(_v(snap, name) == 0 for name in SPEC)
    assert not [s for f in snap for s in f.samples if s[0].endswith("per_pos_total")]  # no positions without a proposer


@pytest.mark.ray
def test_remote_kv_service(ray_cluster, tiny_target_dir, tiny_prompts):
    """The allocator in another process (cluster.replica.RemoteKV): KV series come from its stats."""
    import ray

    from actors.kv_service import KVService
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine
    from cluster.replica import RemoteKV
    from tests.tiny import _load

    handle = ray.remote(KVService).options(num_cpus=0).remote(256, 4, True)
    try:
        cfg = EngineConfig(model=str(tiny_target_dir), num_kv_blocks=256, block_size=4, num_threads=1)
        eng = LLMEngine(cfg, loaded=_load(str(tiny_target_dir)), kv=RemoteKV(lambda: handle))
        eng.generate(tiny_prompts[:3] * 2, SamplingParams(max_tokens=4, ignore_eos=True), concurrency=3)
        stats = ray.get(handle.stats.remote())
        snap = eng.metrics.snapshot()
        assert _v(snap, "kv_blocks_total") == 256 and _v(snap, "kv_blocks_used") == 0
        assert _v(snap, "prefix_cache_queries_total") == stats["prefix_queries"] > 0
        assert _v(snap, "prefix_cache_hits_total") == stats["prefix_hits"] > 0
    finally:
        ray.kill(handle)
    time.sleep(0.5)
    snap = eng.metrics.snapshot()  # the KV service is gone: its series are left out, the rest stays
    assert not [f for f in snap if f.name in (KV_USED, KV_TOTAL, KV_USAGE)]
    assert _v(snap, "request_success_total") == 6


def test_merge_of_two_registries_is_their_sum(spec_run, tiny_target_dir, tiny_prompts):
    eng_a, _ = spec_run
    eng_b = tiny_engine(tiny_target_dir, draft="ngram", k=K)
    eng_b.add_request("w", tiny_prompts[0], SamplingParams(max_tokens=64, ignore_eos=True))
    eng_b.step()  # one request still running: non-zero gauges
    eng_b.generate(tiny_prompts[1:3], SamplingParams(max_tokens=6))
    eng_b.metrics.record_http("/v1/completions", 429)
    a, b = eng_a.metrics.snapshot(), eng_b.metrics.snapshot()
    merged = merge_snapshots([a, b])
    names = {(n, lab) for snap in (a, b) for f in snap for n, lab, _ in f.samples}
    assert names == {(n, lab) for f in merged for n, lab, _ in f.samples}
    for name, labels in names:
        want = sum(v for snap in (a, b) for f in snap for n, lab, v in f.samples if (n, lab) == (name, labels))
        got = next(v for f in merged for n, lab, v in f.samples if (n, lab) == (name, labels))
        if name == KV_USAGE:
            used, total = (_v(merged, n.removeprefix("specray:")) for n in (KV_USED, KV_TOTAL))
            assert got == pytest.approx(used / total) and total == 512 and used > 0
        else:
            assert got == pytest.approx(want), (name, labels)
    # the rendered text parses back to the merged values
    parsed = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for fam in text_string_to_metric_families(render(merged).decode()) for s in fam.samples}
    assert parsed == {(n, lab): v for f in merged for n, lab, v in f.samples}


def test_hub_keeps_counters_of_replicas_that_leave():
    from deployments.metrics_hub import MetricsHub

    def engine_like(requests: int, running: int) -> EngineMetrics:
        m = EngineMetrics()
        for _ in range(requests):
            m.request_success.labels(finished_reason="stop").inc()
        m.watch(type("Scheduler", (), {"running": [0] * running, "waiting": []})(), None, 0)
        return m

    a, b = engine_like(3, 1), engine_like(5, 2)
    hub = MetricsHub()
    hub.push("a", a.snapshot())
    merged = hub.push("b", b.snapshot())
    assert _v(merged, "request_success_total") == 8 and _v(merged, "num_requests_running") == 3
    assert hub.remove("a") == 1
    merged = hub.merged()
    assert _v(merged, "request_success_total") == 8 and _v(merged, "num_requests_running") == 2
    hub.stale_after_s = 0.0  # b falls silent: its counters stay, its gauges go
    time.sleep(0.01)
    merged = hub.merged()
    assert _v(merged, "request_success_total") == 8 and _v(merged, "num_requests_running") == 0
    hub.stale_after_s = 60.0
    b.request_success.labels(finished_reason="stop").inc()
    merged = hub.push("b", b.snapshot())  # back: counted once, not twice
    assert _v(merged, "request_success_total") == 9 and _v(merged, "num_requests_running") == 2


def test_http_middleware_counts_routes_and_statuses():
    from fastapi import APIRouter, FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient

    from deployments import http_metrics

    app = FastAPI()

    @app.get("/v1/models/{name}")
    async def model(name: str):
        return {"name": name}

    @app.post("/v1/completions")
    async def completions():
        raise HTTPException(413, "too large")

    items = APIRouter()

    @items.get("/items/{item_id}")
    async def item(item_id: int):
        return {"id": item_id}

    app.include_router(items, prefix="/v1")  # Serve re-mounts routes like this

    @app.middleware("http")
    async def auth(request: Request, call_next):  # answers before routing, like an API-key check
        if request.headers.get("authorization") != "Bearer k":
            return JSONResponse({"error": "no key"}, status_code=401)
        return await call_next(request)

    metrics = EngineMetrics()
    app.add_middleware(http_metrics.HTTPCountMiddleware, metrics=lambda: metrics)
    client = TestClient(app, headers={"authorization": "Bearer k"})
    client.get("/v1/models/a")
    client.get("/v1/models/b")
    client.post("/v1/completions")
    client.get("/no/such/path")
    client.post("/v1/completions", headers={"authorization": "wrong"})
    client.get("/v1/items/7")
    client.get("/v1/items/8", headers={"authorization": "wrong"})  # refused before routing
    counts = {dict(lab)["route"] + " " + dict(lab)["status"]: v for f in snapshot(metrics.registry)
              for n, lab, v in f.samples if n == "specray:http_requests_total"}
    assert counts == {"/v1/models/{name} 200": 2, "/v1/completions 413": 1, "other 404": 1, "/v1/completions 401": 1,
                      "/v1/items/{item_id} 200": 1, "/v1/items/{item_id} 401": 1}


# ---- a Serve app with two replicas ----------------------------------------------------------------
APP = "specray-metrics-test"
N_REQUESTS = 8
KEY = "metrics-test-key"


@pytest.fixture(scope="module")
def two_replicas(ray_cluster):
    with serve_app(APP, engine=ngram_engine(K), num_replicas=2, num_cpus=0.5, api_key=KEY) as url:
        yield url


def _hub():
    import ray

    from deployments.metrics_hub import SERVE_NAMESPACE, hub_name

    return ray.get_actor(hub_name(APP, "OpenAIIngress"), namespace=SERVE_NAMESPACE)


def _scrape(base_url: str) -> dict[tuple[str, tuple], float]:
    """GET /metrics without an API key (the app requires one on /v1/*)."""
    import requests

    r = requests.get(f"{base_url}/metrics", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def _total(scrape: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in scrape.items() if n == "specray:" + name and want <= set(lab))


@pytest.mark.ray
@pytest.mark.model
def test_metrics_endpoint_shows_totals_of_all_replicas(two_replicas):
    import ray
    import requests

    prompts = [f"Count from {i} to twenty: {i}, {i + 1}," for i in range(N_REQUESTS)]
    auth = {"Authorization": f"Bearer {KEY}"}

    def complete(prompt: str) -> dict:
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        r = requests.post(f"{two_replicas}/v1/completions", json=body, headers=auth, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(complete, prompts))
    bad = requests.post(f"{two_replicas}/v1/completions", json={"prompt": "x", "model": "nope"}, headers=auth,
                        timeout=60)
    assert bad.status_code == 404
    no_key = requests.post(f"{two_replicas}/v1/completions", json={"prompt": "x"}, timeout=60)
    assert no_key.status_code == 401

    deadline = time.monotonic() + 60  # other replicas push every couple of seconds
    while True:
        scrape = _scrape(two_replicas)
        replicas = ray.get(_hub().replicas.remote())
        if (_total(scrape, "request_success_total") == N_REQUESTS and len(replicas) == 2
                and _total(scrape, "http_requests_total", status="404") == 1
                and _total(scrape, "http_requests_total", status="401") == 1) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(replicas) == 2
    served = [sample_value(s, "specray:request_success_total") for s in replicas.values()]
    assert sum(served) == N_REQUESTS and all(n > 0 for n in served), served  # both replicas served traffic
    spec = [a["speculation"] for a in answers]
    usage = [a["usage"] for a in answers]
    assert _total(scrape, "request_success_total", finished_reason="length") == N_REQUESTS
    assert _total(scrape, "prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage)
    assert _total(scrape, "generation_tokens_total") == sum(u["completion_tokens"] for u in usage) == 8 * N_REQUESTS
    for name, key in zip(SPEC, ("num_drafts", "num_draft_tokens", "num_accepted_tokens")):
        assert _total(scrape, name) == sum(s[key] for s in spec), name
    per_pos = [_total(scrape, "spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(K)]
    assert sum(per_pos) == _total(scrape, SPEC[2]) <= _total(scrape, SPEC[1])
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:])), per_pos
    for h in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        assert _total(scrape, h + "_count") == N_REQUESTS, h
    assert _total(scrape, "http_requests_total", route="/v1/completions", status="200") == N_REQUESTS
    assert _total(scrape, "http_requests_total", route="/v1/completions", status="404") == 1
    assert _total(scrape, "http_requests_total", route="/v1/completions", status="401") == 1
    assert _total(scrape, "num_requests_running") == _total(scrape, "num_requests_waiting") == 0
    assert _total(scrape, "engine_up") == 2  # both replicas' engine loops run
    # per-step speculation health: every token after the first came from a decode step
    assert _total(scrape, "spec_decode_num_decode_tokens_total") == 7 * N_REQUESTS
    assert _total(scrape, "spec_decode_num_decode_steps_total", drafted="true") == sum(s["num_drafts"] for s in spec)
    assert _total(scrape, "spec_decode_guard_tripped") == 0
    assert _total(scrape, "kv_blocks_total") == 2 * 256
    assert _total(scrape, "kv_cache_usage_perc") == pytest.approx(
        _total(scrape, "kv_blocks_used") / _total(scrape, "kv_blocks_total"))
    again = _scrape(two_replicas)  # any replica answers with the same totals
    assert _total(again, "request_success_total") == N_REQUESTS
    assert _total(again, "generation_tokens_total") == 8 * N_REQUESTS


@pytest.mark.ray
@pytest.mark.model
def test_hub_ends_with_the_app(two_replicas):
    from ray import serve

    assert _hub() is not None
    serve.delete(APP)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _hub()
        except ValueError:
            return
        time.sleep(0.5)
    pytest.fail("the metrics hub outlived its application")
