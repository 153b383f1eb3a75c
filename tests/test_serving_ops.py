"""Serving operations of the OpenAI ingress without HTTP: admission control (429/503 with
Retry-After, never a hang), draining and a dead engine, n > 1 choices, and the Serve options
derived from ServeArgs. ``OpenAIServer`` runs in-process on a tiny model (protocol-neutral, fast);
the same operations over HTTP: tests/test_http_ops.py."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from deployments.admission import Admission
from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest
from deployments.serve_config import ServeArgs

MODEL = "smollm2-135m"


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
    assert opts["max_queued_requests"] == -1  # Serve's queue never refuses (its 503 is plain text)
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
