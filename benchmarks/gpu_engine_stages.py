"""The engine stages of ``benchmarks.gpu_bench``: ``default`` (the default model through the engine
at c=1/8/64 against transformers peers) and ``offload`` (weight offload: the SpecInfer curve and
the default model half offloaded, benchmarks/offload_bench.py). Each is a list of parts run in
order under ``--budget-s``, its section rewritten after each part, a failed part a note.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path

import torch

from benchmarks.gpu_bench import write_section
from benchmarks.report import fmt, md_table


DEFAULT_HEAD = ["run", "spec", "conc", "tokens/s", "TPOT p50 ms", "speedup vs plain", "mean acc. len",
                "specray / peer", "note"]


def default_rows(rows: list[dict], peers: list[dict]) -> list[list[str]]:
    """specray runs (bench rows) then peers (PeerResult dicts), as table rows."""
    out = [[f"specray {r['method']}", r["spec"], str(r["concurrency"]), fmt(r["tokens_per_s"]),
            fmt(r["tpot_p50_s"], "{:.1f}", 1e3), fmt(r["speedup"], "{:.2f}x"), fmt(r["mean_accepted_length"]), "-",
            f"{r['num_errors']} errors" if r["num_errors"] else ""] for r in rows]
    out += [[p["peer"], fmt(p["spec_tokens"], "K={}"), str(p.get("batch", 1)), fmt(p["tokens_per_s"]), "-", "-",
             "-", fmt(p["ratio"], "{:.2f}x"), p["note"] or ""] for p in peers]
    return out


def default_section(args, device: torch.device, out: Path) -> str:
    from actors.model import registry

    model = registry.DEFAULT_MODEL
    try:
        registry.resolve_alias(model)
    except ValueError as e:
        return write_section(out, "default", md_table(["model", "status"], [[model, f"missing: {e}"]]),
                             {"model": model, "missing": str(e)})
    from benchmarks.engine_bench import EngineBackend
    from benchmarks.options import select_prompts

    path, prompts = select_prompts(None, args.sample, 0)
    _, batch_prompts = select_prompts(None, args.batch_sample, 0)
    options = {"device": str(device), "kv_cache_gb": args.kv_cache_gb if device.type == "cuda" else None}
    backend = EngineBackend(model, args.max_tokens, 0, 1, options, warmup_batch=True)  # runs of ~1 s: warm each
    dtype = str(backend.dtype).removeprefix("torch.")
    notes = [f"{model}, {dtype} on {device}; prompts: {path.name}, stratified sample (seed 0) of {len(prompts)} at "
             f"c=1 / batch 1, {len(batch_prompts)} at c=8 and 64 / batch 64; max tokens {args.max_tokens}; greedy",
             "tokens/s = output tokens of the whole set / its wall time; speedup vs specray none at the same "
             "concurrency; specray / peer: specray none (prompt lookup: ngram, not run here) at concurrency = the "
             "peer's batch",
             "each specray run follows an unmeasured warm-up batch at its concurrency (kernels compiled, the "
             "adaptive policy's costs measured at that load)"]
    rows, peers = [], []

    def save() -> str:
        _ratios(rows, peers)
        data = {"model": model, "device": str(device), "notes": notes, "runs": rows, "peers": peers}
        return write_section(out, "default", md_table(DEFAULT_HEAD, default_rows(rows, peers)), data, notes)

    return run_parts(args, default_parts(args, backend, model, device, prompts, batch_prompts), notes, rows, peers,
                     save)


def _ratios(rows: list[dict], peers: list[dict]) -> None:
    """Speedups vs plain and specray/peer ratios, in place (peers stay dicts)."""
    from benchmarks.peers import PeerResult, attach_ratios
    from benchmarks.results import add_speedups

    add_speedups(rows)
    objs = [PeerResult(**p) for p in peers]
    attach_ratios(objs, rows)
    peers[:] = [p.to_dict() for p in objs]


def run_parts(args, parts: list, notes: list[str], rows: list[dict], peers: list[dict], save) -> str:
    """Run ``parts`` in order (each returns (bench rows, peer dicts)), ``save()`` after each; a part
    that fails is a note and the next still runs; none starts once ``--budget-s`` is spent."""
    md = None
    for part in parts:
        if out_of_time(args, notes):
            return save()
        try:
            new_rows, new_peers = part()
        except Exception as e:  # noqa: BLE001  one part failing leaves the others' rows
            traceback.print_exc()
            new_rows, new_peers = [], []
            notes.append(f"a part failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        rows += new_rows
        peers += new_peers
        md = save()
    return md if md is not None else save()


def default_parts(args, backend, model: str, device: torch.device, prompts, batch_prompts) -> list:
    """The default section's parts, most important first: each returns (bench rows, peer dicts)."""
    from benchmarks.compiled_peers import compiled_peers
    from benchmarks.peers import run_peers
    from benchmarks.results import run_row
    from benchmarks.sweep import iter_runs, plan_groups

    def runs(spec_tokens, ps, concurrency):
        groups = plan_groups(["default"], spec_tokens, None, adaptive=True)
        return [run_row(r) for r in iter_runs(backend, groups, ps, [0.0], concurrency)], []

    def peer(fn):
        return lambda: ([], [p.to_dict() for p in fn()])

    parts = [lambda: runs([5], prompts, [1])]
    if args.peers != "none":
        parts.append(peer(lambda: run_peers(model, prompts, args.max_tokens, ["default"], [5], device=device)))
    parts.append(lambda: runs([], batch_prompts, [8, 64]))
    if args.peers == "all":
        parts.append(peer(lambda: compiled_peers(model, prompts, args.max_tokens, device, batches=(1,))))
        parts.append(peer(lambda: compiled_peers(model, batch_prompts, args.max_tokens, device, batches=(64,))))
    return parts


def out_of_time(args, notes: list[str]) -> bool:
    """Whether ``--budget-s`` is spent (then a note says the remaining parts were skipped)."""
    deadline = getattr(args, "deadline", None)
    if deadline is None or time.monotonic() < deadline:
        return False
    notes.append(f"the remaining parts were skipped: --budget-s {args.budget_s:g} was spent")
    return True


def offload_section(args, device: torch.device, out: Path) -> str:
    """The SpecInfer curve on a random model, then the default model half offloaded through the
    engine and its accelerate peer (benchmarks/offload_bench.py), each part written when done."""
    from benchmarks import offload_bench as ob

    curve, parts, notes = ob.stage_parts(args, device)
    rows, peers = [], []

    def save() -> str:
        _ratios(rows, peers)
        engine = md_table(DEFAULT_HEAD, default_rows(rows, peers)) if rows or peers else None
        table = ob.stage_markdown(curve.get("doc"), engine, ob.goal_rows(curve.get("doc"), rows, peers))
        return write_section(out, "offload", table, {"curve": curve.get("doc"), "runs": rows, "peers": peers}, notes)

    return run_parts(args, parts, notes, rows, peers, save)
