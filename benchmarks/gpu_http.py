"""The ``http`` stage of ``benchmarks.gpu_bench`` (issue 26): c=1 greedy TPOT through the served
OpenAI-compatible endpoint against the in-process engine, on the same prompts with the same engine
configuration; the goal is HTTP within 1.5x of in-process.

In-process is ``benchmarks.engine_bench.EngineBackend``, with the engine's own times. The server is
``specray serve --config FILE`` run as a child process, the ``make serve`` path (Ray, Serve's HTTP
proxy, the OpenAI ingress, one engine replica), from ``ray_configs/serve_local.yaml`` with the
in-process side's engine config (device, draft, KV cache), ``num_gpus: 1`` on CUDA, a free port and
no gRPC proxy; requests go through the openai client, streamed (``benchmarks.http_bench.HttpBackend``),
timed on the client. Both sides run one engine config (the draft's) with two variants: plain decoding
(``spec_tokens`` 0 per request) and the adaptive draft; each variant first serves two other prompts
unmeasured. The sides run one after the other, never at once, so neither shares the device or the
cores with the other.
"""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.ports import free_port

REPO = Path(__file__).resolve().parents[1]
SERVE_TEMPLATE = REPO / "ray_configs" / "serve_local.yaml"
GOAL = 1.5  # HTTP TPOT / in-process TPOT at c=1 (issue 26)
WARMUP_PROMPTS = 2
HEAD = ["spec", "in-process TPOT p50", "HTTP TPOT p50", "HTTP / in-process", f"goal <= {GOAL}x", "in-process tok/s",
        "HTTP tok/s", "TTFT p50 in-process / HTTP", "mean acc. len in-process / HTTP", "errors"]


def serve_config(engine: dict, port: int, num_gpus: float) -> dict:
    """serve_local.yaml with this engine config (an ``EngineConfig`` dump), the port, the replica's
    GPUs and no gRPC proxy."""
    import yaml

    doc = yaml.safe_load(SERVE_TEMPLATE.read_text(encoding="utf-8"))
    doc.pop("grpc_options", None)
    doc["http_options"] = {**doc["http_options"], "host": "127.0.0.1", "port": port}
    app = doc["applications"][0]
    app["args"] = {**app["args"], "engine": engine, "num_gpus": num_gpus}
    return doc


def replica_cpus() -> int:
    """The replica's CPU reservation in serve_local.yaml, hence its torch threads."""
    import yaml

    return max(1, int(yaml.safe_load(SERVE_TEMPLATE.read_text(encoding="utf-8"))["applications"][0]["args"]
                      .get("num_cpus", 1)))


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _tail(log: Path, chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.is_file() else ""


@contextmanager
def served(config: dict, log: Path, start_timeout_s: float, stop_timeout_s: float = 60.0) -> Iterator[str]:
    """Run ``specray serve --config`` (``python -m cluster.cli``) with this Serve config until the
    block ends; yields the base URL once GET /v1/models answers. The server's output goes to
    ``log``; a server that exits or is not up in time is an error quoting its tail."""
    import yaml

    port = config["http_options"]["port"]
    path = log.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    env = {"RAY_USAGE_STATS_ENABLED": "0", **os.environ,  # the lent boxes are offline
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", "serve", "--config", str(path)], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + start_timeout_s
    try:
        while not _ready(url):
            if proc.poll() is not None:
                raise RuntimeError(f"specray serve exited {proc.returncode} before serving; its log ends: {_tail(log)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"specray serve not up after {start_timeout_s:.0f} s; its log ends: {_tail(log)}")
            time.sleep(1.0)
        yield url
    finally:
        stop(proc, stop_timeout_s)


def stop(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM (the server then shuts down the Serve apps and the Ray it started), then SIGKILL to
    its process group if it is still there after timeout_s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def variants(draft: str, spec_tokens: int = 5) -> tuple:
    """(adaptive draft, plain): one engine config serves both; plain is spec_tokens 0 per request."""
    from benchmarks.results import Variant
    from benchmarks.sweep import plan_groups

    return plan_groups([draft], [spec_tokens], adaptive=True)[1].variants[-1], Variant(spec_tokens=0)


def measure(backend, method: str, group: tuple, prompts: list, warmup: list) -> list[dict]:
    """One session over the group: per variant an unmeasured pass over the warm-up prompts, then the
    sample at c=1, greedy; the bench rows."""
    from benchmarks.results import run_row

    rows = []
    with backend.session(method, group, warmup[0]) as run_once:
        for v in group:
            run_once(v, warmup, 1, 0.0)
            rows.append(run_row(run_once(v, prompts, 1, 0.0)))
            print(f"# http stage: {type(backend).__name__} {v.label}: TPOT p50 "
                  f"{_fmt_ms(rows[-1]['tpot_p50_s'])}", file=sys.stderr, flush=True)
    return rows


def _fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f} ms"


def ratio(http: float | None, local: float | None) -> float | None:
    return http / local if http and local else None


def table_rows(local: list[dict], http: list[dict]) -> list[list[str]]:
    """Per variant: in-process vs HTTP, their TPOT ratio and whether it meets the goal."""
    from benchmarks.report import fmt

    out = []
    for a, b in zip(local, http):
        r = ratio(b["tpot_p50_s"], a["tpot_p50_s"])
        out.append([a["spec"], _fmt_ms(a["tpot_p50_s"]), _fmt_ms(b["tpot_p50_s"]), fmt(r, "{:.2f}x"),
                    "-" if r is None else ("met" if r <= GOAL else "missed"), fmt(a["tokens_per_s"]),
                    fmt(b["tokens_per_s"]), f"{_fmt_ms(a['ttft_p50_s'])} / {_fmt_ms(b['ttft_p50_s'])}",
                    f"{fmt(a['mean_accepted_length'])} / {fmt(b['mean_accepted_length'])}",
                    f"{a['num_errors']} / {b['num_errors']}"])
    return out


def http_section(args, device, out: Path) -> str:
    """The stage: in-process first, then the server; one table, written like every section."""
    import importlib.util

    from benchmarks.gpu_bench import write_section
    from benchmarks.gpu_engine_stages import out_of_time
    from benchmarks.report import md_table

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("openai") is None:
        why = "skipped: ray[serve] or openai is not installed (on a lent GPU box: prepare --http)"
        return write_section(out, "http", md_table(["stage", "status"], [["http", why]]), {"skipped": why})
    from actors.model.registry import DEFAULT_MODEL
    from benchmarks.engine_bench import engine_config

    sets, notes = prompt_sets(args.sample), []
    group = variants(args.http_draft)
    options = {"device": str(device), "kv_cache_gb": args.kv_cache_gb if device.type == "cuda" else None,
               "num_threads": replica_cpus()}  # the replica's torch threads (deployments.engine_factory), both sides
    engine = engine_config(DEFAULT_MODEL, args.http_draft, group, options).model_dump(mode="json",
                                                                                    exclude_defaults=True)
    local, http = _in_process(DEFAULT_MODEL, args, options, group, sets), []
    if not out_of_time(args, notes):
        try:
            http = _over_http(engine, device, args, group, sets, out)
        except Exception as e:  # noqa: BLE001  the in-process rows still make a table
            notes.append(f"HTTP failed: {type(e).__name__}: {str(e)[-1500:]}")
    data = {"model": DEFAULT_MODEL, "device": str(device), "draft": args.http_draft, "goal": GOAL, "engine": engine,
            "in_process": local, "http": http,
            "ratios": {a["spec"]: ratio(b["tpot_p50_s"], a["tpot_p50_s"]) for a, b in zip(local, http)}}
    rows = table_rows(local, http) if http else [[a["spec"], _fmt_ms(a["tpot_p50_s"]), *["-"] * 8] for a in local]
    return write_section(out, "http", md_table(HEAD, rows), data, section_notes(args, device, sets[0]) + notes)


def prompt_sets(sample: int) -> tuple[list, list]:
    """(the measured sample of the bench prompts, WARMUP_PROMPTS others): warming up on other
    prompts leaves no prefix-cache hit in the measured runs."""
    from benchmarks.options import select_prompts

    _, prompts = select_prompts(None, sample, 0)
    taken = {p.id for p in prompts}
    others = [p for p in select_prompts(None, sample + 4 * WARMUP_PROMPTS, 1)[1] if p.id not in taken]
    return prompts, (others or prompts)[:WARMUP_PROMPTS]


def section_notes(args, device, prompts: list) -> list[str]:
    from actors.model.registry import DEFAULT_MODEL
    from benchmarks.prompt_set import default_prompts_path

    return [f"{DEFAULT_MODEL} on {device}; prompts: {default_prompts_path().name}, stratified sample (seed 0) of "
            f"{len(prompts)} at c=1, greedy, max tokens {args.max_tokens}; draft {args.http_draft!r} (adaptive) and "
            "plain (spec_tokens 0) on one engine config",
            "HTTP: `specray serve --config` (serve_local.yaml with this engine config; Ray Serve, the OpenAI "
            "ingress, one replica), streamed chat completions through the openai client, times taken on the "
            "client; in-process: the engine's own times; the two never run at once",
            f"TPOT = (E2E - TTFT) / (output tokens - 1) per request, p50; each variant first serves "
            f"{WARMUP_PROMPTS} other prompts unmeasured; the server's log: http_serve.log",
            f"both sides run {replica_cpus()} torch thread(s), what the replica's num_cpus gives it in `make serve` "
            "(deployments.engine_factory): the in-process figure is this config's, not the default stage's "
            "(every core)"]


def _in_process(model: str, args, options: dict, group: tuple, sets: tuple) -> list[dict]:
    """The in-process rows; then the model and its KV cache are freed for the server's."""
    import torch

    from benchmarks.engine_bench import EngineBackend

    backend = EngineBackend(model, args.max_tokens, 0, 1, options)
    rows = measure(backend, args.http_draft, group, *sets)
    del backend
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def _over_http(engine: dict, device, args, group: tuple, sets: tuple, out: Path) -> list[dict]:
    from benchmarks.http_bench import HttpBackend

    config = serve_config(engine, free_port(), 1.0 if device.type == "cuda" else 0.0)
    start_s = args.http_start_s
    if getattr(args, "deadline", None) is not None:
        start_s = max(1.0, min(start_s, args.deadline - time.monotonic()))
    with served(config, out / "http_serve.log", start_s) as url:
        return measure(HttpBackend(url, args.max_tokens, 0, 1), args.http_draft, group, *sets)
