"""`specray bench --url`: the HTTP client (the `openai` SDK, streaming) against a fake OpenAI-compatible
server: parallel clients never above the concurrency, the spec_tokens=0 baseline, seeds, usage and
speculation counters read from the final chunk, prompt sets side by side."""
from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from pathlib import Path

import pytest
from fastapi import FastAPI, Request  # module level: the fake app's string annotations resolve here
from fastapi.responses import StreamingResponse

from tests.bench_cli import run_cli, write_prompts
from tests.ports import free_port


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("prompts") / "p.jsonl")


TOKEN_DELAY_S = 0.02


def _fake_openai_app(seen: list[dict], peaks: list[tuple[int, int]]):
    """Streams max_tokens words; with spec_tokens > 0 two tokens per step (half the delay) and a
    specray-style speculation object in the usage chunk (one of K drafts accepted per step).
    ``peaks`` gets (max_tokens, the most requests in flight while this one streamed) per request."""
    app = FastAPI()
    in_flight = [0]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake-spec", "object": "model", "created": 0, "owned_by": "t"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: Request):
        body = await req.json()
        seen.append(body)
        n, k = body["max_tokens"], body.get("spec_tokens") or 0
        per_step = 2 if k else 1

        def chunk(delta, finish=None, **extra):
            return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                          "model": "fake-spec", "choices": [] if delta is None else [
                                              {"index": 0, "delta": delta, "finish_reason": finish}], **extra}) + "\n\n"

        async def stream():
            in_flight[0] += 1
            peak, counted = in_flight[0], True
            try:
                yield chunk({"role": "assistant", "content": ""})
                for i in range(0, n, per_step):
                    await asyncio.sleep(TOKEN_DELAY_S)
                    peak = max(peak, in_flight[0])
                    for j in range(i, min(i + per_step, n)):
                        yield chunk({"content": f"w{j} "})
                # out of the count before the client can see the answer end (and send its next one)
                in_flight[0] -= 1
                counted = False
                peaks.append((n, peak))
                yield chunk({}, "length")
                steps = math.ceil(n / per_step)
                spec = {"num_drafts": steps, "num_draft_tokens": steps * k, "num_accepted_tokens": steps,
                        "acceptance_rate": 1 / k, "accepted_per_pos": [steps]} if k else None
                usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
                yield chunk(None, usage=usage, speculation=spec)
                yield "data: [DONE]\n\n"
            finally:
                in_flight[0] -= counted

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def fake_server():
    import uvicorn

    seen: list[dict] = []
    peaks: list[tuple[int, int]] = []
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_fake_openai_app(seen, peaks), host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}", seen, peaks
    server.should_exit = True
    thread.join(timeout=10)


def test_url_bench_streams_with_parallel_clients(capsys, prompts_file, fake_server):
    url, seen, peaks = fake_server
    peaks.clear()
    code, out, err = run_cli(capsys, "bench", "--url", url, "--prompts", str(prompts_file), "--sample", "4",
                           "--concurrency", "1,2", "--temperature", "0.7", "--spec-tokens", "2",
                           "--max-tokens", "6", "--seed", "11", "--json")
    assert code == 0, err
    doc = json.loads(out)
    runs = {(r["method"], r["concurrency"]): r for r in doc["runs"]}
    assert set(runs) == {("none", 1), ("none", 2), ("fake-spec", 1), ("fake-spec", 2)}
    measured = [b for b in seen if b["max_tokens"] == 6]  # the warm-up requests ask for 8 tokens
    assert len(measured) == 16
    assert sorted({b["spec_tokens"] for b in measured}) == [0, 2]
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in measured)
    assert sorted({b["seed"] for b in measured}) == [11, 12, 13, 14] and {b["temperature"] for b in measured} == {0.7}
    for (method, c), r in runs.items():
        assert r["output_tokens"] == 4 * 6 and r["num_errors"] == 0
        assert r["ttft_p50_s"] >= TOKEN_DELAY_S and r["e2e_p50_s"] > r["ttft_p50_s"]
        if method == "fake-spec":
            assert r["acceptance_rate"] == pytest.approx(0.5) and r["mean_accepted_length"] == pytest.approx(2.0)
            assert r["per_position_acceptance"] == [1.0]
        # the speedup is this run's tokens/s over the baseline's at the same concurrency (how fast
        # the fake server was on this box is no test's business)
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / runs[("none", c)]["tokens_per_s"])
    # clients run in parallel, never more of them than the concurrency: the c=1 requests stream
    # alone, and c=2 requests overlap
    measured_peaks = [p for n, p in peaks if n == 6]
    assert len(measured_peaks) == 16 and measured_peaks.count(1) >= 8 and max(measured_peaks) == 2, measured_peaks


def test_url_bench_runs_prompt_sets_side_by_side(capsys, prompts_file, fake_server, tmp_path):
    other = tmp_path / "other_set.jsonl"
    other.write_text(prompts_file.read_text())
    code, out, err = run_cli(capsys, "bench", "--url", fake_server[0], "--prompts", f"{prompts_file},{other}",
                             "--sample", "2", "--concurrency", "1", "--spec-tokens", "2", "--max-tokens", "4", "--json")
    assert code == 0, err
    sets = json.loads(out)["sets"]
    assert list(sets) == [prompts_file.stem, "other_set"]
    for doc in sets.values():
        assert doc["prompts"]["num_prompts"] == 2 and {r["method"] for r in doc["runs"]} == {"none", "fake-spec"}
    code, _, err = run_cli(capsys, "bench", "--url", fake_server[0], "--prompts", f"{prompts_file},{prompts_file}")
    assert code == 2 and "two sets named alike" in err


def test_url_bench_unseeded_sends_no_seeds(capsys, prompts_file, fake_server):
    url, seen, _ = fake_server
    before = len(seen)
    code, out, err = run_cli(capsys, "bench", "--url", url, "--prompts", str(prompts_file), "--sample", "2",
                             "--concurrency", "1", "--temperature", "1.0", "--spec-tokens", "2",
                             "--max-tokens", "5", "--unseeded", "--json")
    assert code == 0, err
    doc = json.loads(out)
    measured = [b for b in seen[before:] if b["max_tokens"] == 5]
    assert len(measured) == 4 and all(b.get("seed") is None and b["temperature"] == 1.0 for b in measured)
    assert doc["settings"]["sampling"] == "unseeded" and "--unseeded" in doc["command"]
