"""Batch generation job (deployments.batch): input validation, in-order durable output, resume,
progress lines, bad arguments before the model loads, and one real `ray job submit` against a Ray
head this module starts (and stops) itself."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from deployments import batch_output
from deployments.batch import BatchJob, main
from deployments.batch_input import BatchRequest, LineError, LineReader, resume_key
from deployments.batch_output import OrderedWriter, read_existing
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS = 6
GOOD = [
    {"id": "colours", "prompt": "The three primary colours are"},
    {"id": 2, "messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 4},
    {"id": "count", "prompt": "One, two, three, four,", "spec_tokens": 0},
    {"id": "story", "prompt": "Once upon a time", "stop": ["\n"]},
]


def _write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def engine(default_model):
    from cluster.engine import LLMEngine

    config = EngineConfig(num_kv_blocks=256, num_threads=1, speculative=SpeculativeConfig.from_draft_arg("ngram", 4))
    return LLMEngine(config, loaded=default_model)


class CountingEngine:
    """The engine, recording the prompts added and the output file's line count at every step."""

    def __init__(self, engine, output: Path | None = None):
        self.engine, self.output = engine, output
        self.added: list = []
        self.lines_seen: list[int] = []

    def add_request(self, request_id, prompt, params):
        self.added.append(prompt)
        return self.engine.add_request(request_id, prompt, params)

    def step(self):
        if self.output is not None:
            self.lines_seen.append(len(self.output.read_bytes().splitlines()))
        return self.engine.step()

    def __getattr__(self, name):
        return getattr(self.engine, name)


# ---- input lines -------------------------------------------------------------------------------
def test_reader_turns_each_line_into_a_request_or_an_error_naming_field_and_value(tmp_path):
    path = _write_jsonl(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": "hi", "max_tokens": 3, "stop": "x", "temperature": 1, "seed": 5, "min_p": 0.1,
         "stop_token_ids": [7], "include_stop_str_in_output": True},
        {"id": 7, "messages": [{"role": "user", "content": "hello"}], "prediction": "Hello!"},
        "",
        '{"id": "b", "prompt": ',
        [1, 2],
        {"prompt": "no id"},
        {"id": 2.5, "prompt": "x"},
        {"id": "a", "prompt": "again"},
        {"id": "c", "prompt": "x", "max_tokens": "8"},
        {"id": "d", "prompt": "x", "max_token": 8},
        {"id": "e", "prompt": "x", "temperature": -1},
        {"id": "f", "prompt": "x", "messages": [{"role": "user", "content": "y"}]},
        {"id": "g"},
        {"id": "h", "messages": [{"role": "robot", "content": "y"}]},
        {"id": "i", "messages": []},
        {"id": "j", "prompt": "x", "stop": 5},
        {"id": "c", "prompt": "a valid line reusing the id of a bad one"},
    ])
    items = list(LineReader(path, Counter(), default_max_tokens=MAX_TOKENS))
    a, b = items[0], items[1]
    assert a == BatchRequest(1, "a", "hi",
                             SamplingParams(max_tokens=3, stop=("x",), temperature=1.0, seed=5, min_p=0.1,
                                            stop_token_ids=(7,), include_stop_str_in_output=True))
    assert b == BatchRequest(2, 7, [{"role": "user", "content": "hello"}],
                             SamplingParams(max_tokens=MAX_TOKENS, prediction="Hello!"))
    errors = items[2:]
    assert all(isinstance(e, LineError) for e in errors)
    expected = [  # (line, id, words the message must hold); line 3 is blank: not a request
        (4, None, "not valid JSON"), (5, None, "must be a JSON object, got list"), (6, None, "id: Field required"),
        (7, None, "id=2.5: must be a non-empty string or an integer"),
        (8, "a", "id='a': duplicate of the id on line 1"),
        (9, "c", "max_tokens='8'"), (10, "d", "max_token=8: Extra inputs are not permitted"),
        (11, "e", "temperature=-1.0"), (12, "f", "exactly one of 'prompt'"), (13, "g", "got neither"),
        (14, "h", "messages.0.role='robot'"), (15, "i", "messages=[]"), (16, "j", "stop=5: must be a string"),
        (17, "c", "duplicate of the id on line 9"),
    ]
    assert [(e.line, e.id) for e in errors] == [(n, i) for n, i, _ in expected]
    for e, (_, _, words) in zip(errors, expected):
        assert words in e.error, (e, words)


def test_a_result_counts_its_prediction():
    from cluster.outputs import RequestOutput

    out = RequestOutput("r", "Hi", [5, 6], "", [], True, "stop", 3, 2, 1, 2, 2)
    req = BatchRequest(1, "a", "hello", SamplingParams(prediction="Hi there"))
    plain = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert batch_output.result_record(req, out)["usage"] == plain  # no prediction counted: none shown
    out.num_prediction_tokens, out.num_accepted_prediction_tokens = 3, 2
    assert batch_output.result_record(req, out)["usage"] == {
        **plain, "completion_tokens_details": {"accepted_prediction_tokens": 2, "rejected_prediction_tokens": 1}}


def test_existing_results_drop_a_torn_last_line_and_reject_a_foreign_file(tmp_path):
    out = tmp_path / "out.jsonl"
    good = [{"id": "a", "line": 1, "text": "x"}, {"id": None, "line": 3, "error": "bad"}]
    body = "".join(json.dumps(r) + "\n" for r in good)
    out.write_text(body + '{"id": "c", "line": 4, "te')
    found = read_existing(out)
    assert (found.num_lines, found.num_errors, found.torn_line, found.valid_bytes) == (2, 1, True, len(body))
    assert found.done == Counter({resume_key("a", 1): 1, resume_key(None, 3): 1})
    assert out.read_text().endswith("te"), "reading changes nothing"

    with OrderedWriter(out, found.valid_bytes) as w:  # out of order in, in order out
        w.put(1, {"id": "d", "line": 5, "text": "y"})
        assert w.flush() == 0
        w.put(0, {"id": "c", "line": 4, "text": "z"})
        assert w.flush() == 2
    assert [r["id"] for r in _records(out)] == ["a", None, "c", "d"]

    out.write_text(body.replace('"error": "bad"', '"oops": 1') + json.dumps(good[0]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not a result line"):
        read_existing(out)


# ---- command line ------------------------------------------------------------------------------
def test_bad_arguments_exit_2_with_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import cluster.engine

    def no_load(*a, **k):
        raise AssertionError("the model must not load on bad arguments")

    monkeypatch.setattr(cluster.engine, "LLMEngine", no_load)
    inp = _write_jsonl(tmp_path / "in.jsonl", GOOD)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text("hello\nworld\n")
    out = str(tmp_path / "out.jsonl")
    cases = [
        (["--input", str(tmp_path / "missing.jsonl"), "--output", out], "--input", "no such file"),
        (["--input", str(inp), "--output", str(tmp_path / "nodir" / "o.jsonl")], "--output", "does not exist"),
        (["--input", str(inp), "--output", out, "--draft", str(tmp_path / "no-draft")], "--draft", "no-draft"),
        (["--input", str(inp), "--output", out, "--draft", "layerskip:x"], "layerskip:x", "positive number"),
        (["--input", str(inp), "--output", out, "--concurrency", "0"], "--concurrency 0", "at least 1"),
        (["--input", str(inp), "--output", out, "--spec-tokens", "99"], "num_spec_tokens=99", "less than"),
        (["--input", str(inp), "--output", str(inp)], "--output", "is the input file"),
        (["--input", str(inp), "--output", str(foreign)], "foreign.jsonl", "line 1 is not a result line"),
    ]
    for argv, *words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and all(w in err for w in words), (argv, err)
    assert foreign.read_text() == "hello\nworld\n"
    for argv, word in ((["--input", str(inp)], "--output"),
                       (["--input", str(inp), "--output", out, "--concurrency", "x"], "'x'")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and word in err, err


# ---- with the engine ---------------------------------------------------------------------------
@pytest.mark.model
def test_one_result_per_line_in_input_order_with_errors_and_progress(engine, tmp_path):
    too_long = "hello " * (engine.max_model_len + 8)
    inp = _write_jsonl(tmp_path / "in.jsonl", GOOD[:2] + ['{"id": "broken"'] + GOOD[2:] +
                       [{"id": "long", "prompt": too_long}])
    out = tmp_path / "out.jsonl"
    log: list[str] = []
    summary = BatchJob(inp, out, concurrency=3, max_tokens=MAX_TOKENS, progress_every_s=1e-6).run(engine, log.append)

    recs = _records(out)
    assert [r["line"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert [r["id"] for r in recs] == ["colours", 2, None, "count", "story", "long"]
    assert "not valid JSON" in recs[2]["error"]
    assert recs[5]["error"].startswith("prompt has") and f"context is {engine.max_model_len}" in recs[5]["error"]
    good = [recs[i] for i in (0, 1, 3, 4)]
    params = [SamplingParams(max_tokens=g.get("max_tokens", MAX_TOKENS), spec_tokens=g.get("spec_tokens"),
                             stop=g.get("stop")) for g in GOOD]
    refs = [engine.generate([g.get("prompt") or g["messages"]], p)[0] for g, p in zip(GOOD, params)]
    for rec, ref in zip(good, refs):  # the result of each line is its own prompt's
        assert rec["text"] == ref.text and rec["finish_reason"] == ref.finish_reason, rec
        assert rec["usage"] == {"prompt_tokens": ref.num_prompt_tokens, "completion_tokens": ref.num_output_tokens,
                                "total_tokens": ref.num_prompt_tokens + ref.num_output_tokens}
        spec = rec["speculation"]
        assert 0 <= spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
        assert sum(spec["accepted_per_pos"]) == spec["num_accepted_tokens"]
    assert good[1]["usage"]["completion_tokens"] <= 4
    assert good[2]["speculation"]["num_draft_tokens"] == 0, "spec_tokens=0 turns speculation off"

    assert (summary.total, summary.written, summary.skipped, summary.errors) == (6, 6, 0, 2)
    assert summary.output_tokens == sum(r["usage"]["completion_tokens"] for r in good)
    assert len(log) >= 2 and all("/6 done" in x for x in log)
    assert log[-1].startswith("batch: finished: 6/6 done, 2 errors") and "output tok/s" in log[-1]
    assert "acceptance rate" in log[-1]
    assert not engine.seqs and not engine.has_unfinished()


@pytest.mark.model
def test_results_are_durable_as_soon_as_the_prefix_is_done(engine, tmp_path, monkeypatch):
    syncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(batch_output.os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd)))
    inp = _write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": f"Item {i}:", "max_tokens": 3} for i in range(3)])
    out = tmp_path / "out.jsonl"
    spy = CountingEngine(engine, out)
    BatchJob(inp, out, concurrency=1, max_tokens=MAX_TOKENS).run(spy, lambda _: None)
    assert len(_records(out)) == 3
    # With one request at a time, each result is on disk before the next request's steps.
    assert 1 in spy.lines_seen and 2 in spy.lines_seen
    assert spy.lines_seen == sorted(spy.lines_seen)
    assert len(syncs) == 3


@pytest.mark.model
def test_rerun_resumes_skipping_written_lines_and_redoing_a_torn_one(engine, tmp_path):
    lines = [GOOD[0], "not json", GOOD[1], {"id": "colours", "prompt": "dup"}, GOOD[2]]
    inp = _write_jsonl(tmp_path / "in.jsonl", lines)
    full = tmp_path / "full.jsonl"
    BatchJob(inp, full, concurrency=2, max_tokens=MAX_TOKENS).run(engine, lambda _: None)
    full_lines = full.read_bytes().splitlines(keepends=True)
    assert len(full_lines) == 5

    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(full_lines[:3]) + full_lines[3][:20])  # killed while writing the 4th
    spy = CountingEngine(engine)
    log: list[str] = []
    summary = BatchJob(inp, out, concurrency=2, max_tokens=MAX_TOKENS).run(spy, log.append)
    assert out.read_bytes() == full.read_bytes()
    assert spy.added == [GOOD[2]["prompt"]], "only the unfinished line runs again (the duplicate is an error)"
    assert (summary.skipped, summary.written, summary.errors) == (3, 2, 2)
    assert any("torn last line" in x for x in log) and any("resuming: 3 results" in x for x in log)

    spy = CountingEngine(engine)
    summary = BatchJob(inp, out, concurrency=2, max_tokens=MAX_TOKENS).run(spy, lambda _: None)
    assert spy.added == [] and (summary.skipped, summary.written) == (5, 0)
    assert out.read_bytes() == full.read_bytes()


# ---- a real `ray job submit` ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A Ray head with the job server, on free ports, its own temp dir and its own auth token.
    Stopped by signalling the `ray start --block` process this fixture started (never `ray stop`,
    which would stop every Ray on the machine)."""
    import requests

    tmp = tmp_path_factory.mktemp("rayhead")
    temp_dir = Path(f"/tmp/rt{secrets.token_hex(4)}")  # short: Ray's socket paths must stay under 108 bytes
    dash = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port", str(free_port()),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--include-dashboard", "true",
           "--num-cpus", "2", "--temp-dir", str(temp_dir), "--ray-client-server-port", str(free_port()),
           "--dashboard-agent-listen-port", str(free_port()), "--disable-usage-stats"]
    with open(tmp / "ray_start.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp / "ray_start.log").read_text()[-3000:]
            try:
                if requests.get(f"{url}/api/version", timeout=5,
                                headers={"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"}).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the Ray head's job server did not come up in 180 s"
            time.sleep(1)
        yield url, env
    finally:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this fixture created, nothing else
            proc.wait(timeout=30)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ray(env, *args, timeout=300) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).parent / "ray")
    return subprocess.run([exe, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.ray
@pytest.mark.model
def test_ray_job_submit_runs_resumes_and_logs_progress(ray_head, tmp_path):
    url, env = ray_head
    inp = _write_jsonl(tmp_path / "in.jsonl", [GOOD[0], {"id": "bad", "prompt": "x", "top_p": 0}, GOOD[1], GOOD[2]])
    out = tmp_path / "out.jsonl"
    entry = ["python", "-m", "deployments.batch", "--input", str(inp), "--output", str(out), "--max-tokens", "8",
             "--concurrency", "2", "--threads", "1", "--num-kv-blocks", "128", "--progress-every", "0.5"]

    def submit(sid: str) -> str:
        # --working-dir . uploads the checkout minus .gitignore'd paths (.venv alone would exceed the
        # upload limit); the job runs in that copy, so `python -m deployments.batch` finds the project.
        res = _ray(env, "job", "submit", "--address", url, "--submission-id", sid, "--working-dir", ".", "--", *entry)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        logs = _ray(env, "job", "logs", "--address", url, sid, timeout=60)
        assert logs.returncode == 0, logs.stderr
        return logs.stdout

    first_id = f"batch-{secrets.token_hex(3)}"
    logs = submit(first_id)
    recs = _records(out)
    assert [r["line"] for r in recs] == [1, 2, 3, 4] and [r["id"] for r in recs] == ["colours", "bad", 2, "count"]
    assert recs[1]["error"].startswith("top_p=0") and all("text" in recs[i] for i in (0, 2, 3))
    assert recs[0]["usage"]["completion_tokens"] <= 8
    assert "batch: finished: 4/4 done, 1 errors" in logs, logs

    written = out.read_bytes()
    logs = submit(first_id + "-again")
    assert out.read_bytes() == written, "the second job redid nothing"
    assert "resuming: 4 results" in logs and "batch: finished: 4/4 done, 1 errors, 4 skipped" in logs, logs


def test_a_line_may_ask_for_structured_output(tmp_path):
    from actors.structured_output import StructuredOutput

    path = _write_jsonl(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": "hi", "response_format": {"type": "choice", "choice": ["yes", "no"]}},
        {"id": "b", "prompt": "hi", "response_format": {"type": "regex"}},
        {"id": "c", "prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                             "schema": "nope"}}},
        {"id": "d", "prompt": "hi", "response_format": {"type": "json_object"}, "ignore_eos": True},
    ])
    a, *bad = list(LineReader(path, Counter(), default_max_tokens=MAX_TOKENS))
    assert a.params.structured == StructuredOutput(kind="choice", value=("yes", "no"))
    assert [(e.id, type(e)) for e in bad] == [("b", LineError), ("c", LineError), ("d", LineError)]
    for e, words in zip(bad, ("response_format: type 'regex' needs its 'regex' field", "response_format",
                              "ignore_eos=true cannot be combined with structured output")):
        assert words in e.error, e


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def test_a_job_answers_a_required_tool_line_with_calls(engine, tmp_path):
    inp = _write_jsonl(tmp_path / "in.jsonl", [
        {"id": "w", "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER],
         "tool_choice": "required", "max_tokens": 40}])
    out = tmp_path / "out.jsonl"
    BatchJob(inp, out, concurrency=1, max_tokens=MAX_TOKENS).run(engine, lambda _: None)
    (rec,) = _records(out)
    assert rec["finish_reason"] == "tool_calls", rec
    assert all(c["function"]["name"] == "get_weather" for c in rec["tool_calls"])
    assert all(isinstance(json.loads(c["function"]["arguments"])["city"], str) for c in rec["tool_calls"])
