"""The replica's state handed to the ingress middleware explicitly (deployments/replica_state.py), and
the engine state the replica reads through public accessors (AsyncLLMEngine, OpenAIServer.stats)."""
from __future__ import annotations

import asyncio

import pytest

from cluster.metrics import EngineMetrics
from deployments import replica_state
from deployments.http_guard import GuardSettings, RequestGuard
from deployments.http_metrics import HTTPCountMiddleware
from deployments.replica_state import REPLICA_HEADER, ReplicaHeader, ReplicaState


@pytest.fixture
def unbound():
    yield
    replica_state.bind(ReplicaState())


def _app():
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": []}

    app.add_middleware(RequestGuard, settings=replica_state.guard_settings)
    app.add_middleware(HTTPCountMiddleware, metrics=replica_state.http_metrics)
    app.add_middleware(ReplicaHeader, replica_id=replica_state.replica_id)
    return app


def _http_counts(metrics: EngineMetrics) -> dict:
    from cluster.metrics_merge import snapshot

    return {dict(lab)["status"]: v for f in snapshot(metrics.registry) for n, lab, v in f.samples
            if n == "specray:http_requests_total"}


def test_middleware_reads_what_the_replica_bound(unbound):
    from fastapi.testclient import TestClient

    client = TestClient(_app())
    assert replica_state.guard_settings() is None and replica_state.http_metrics() is None
    r = client.get("/v1/models")
    assert r.status_code == 200 and REPLICA_HEADER not in r.headers  # unbound: open, not counted, not named

    metrics = EngineMetrics()
    replica_state.bind(ReplicaState(GuardSettings("k", 2048), metrics, "r-1"))
    answers = [client.get("/v1/models"), client.get("/v1/models", headers={"authorization": "Bearer k"}),
               client.post("/v1/models", content=b"x" * 4096, headers={"authorization": "Bearer k"})]
    assert [r.status_code for r in answers] == [401, 200, 413]
    assert [r.headers.get(REPLICA_HEADER) for r in answers] == ["r-1"] * 3  # the guard's refusals named too
    assert _http_counts(metrics) == {"401": 1, "200": 1, "413": 1}

    replica_state.bind(ReplicaState())
    r = client.get("/v1/models")
    assert r.status_code == 200 and REPLICA_HEADER not in r.headers
    assert _http_counts(metrics) == {"401": 1, "200": 1, "413": 1}


def test_draining_is_false_outside_a_replica():
    assert replica_state.serve_replica_draining() is False


def test_engine_state_through_public_accessors(tiny_target_dir, tiny_prompts):
    from actors.sampling_params import SamplingParams
    from cluster.async_engine import AsyncLLMEngine
    from deployments.admission import Admission
    from deployments.openai_server import OpenAIServer
    from tests.tiny import tiny_engine

    engine = tiny_engine(tiny_target_dir)
    aeng = AsyncLLMEngine(engine)
    server = OpenAIServer(aeng, "tiny", engine.max_model_len, Admission(2, 1, 1, 5))

    async def main():
        outs = [o async for o in aeng.generate(tiny_prompts[0], SamplingParams(max_tokens=3, ignore_eos=True))]
        return outs[-1]

    try:
        assert aeng.is_running and server.engine_alive and aeng.tokenizer is engine.tokenizer
        assert asyncio.run(main()).num_output_tokens == 3
        total = engine.allocator.num_blocks
        assert server.stats() == {"has_unfinished": False, "num_free_blocks": engine.allocator.num_free_blocks,
                                  "num_blocks": total, "admission_running": 0, "admission_waiting": 0}
        assert 0 < server.stats()["num_free_blocks"] <= total
    finally:
        aeng.shutdown()
    assert not aeng.is_running and not server.engine_alive
    assert server.unavailable_reason() == "engine is not running"
