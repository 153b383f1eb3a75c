"""KV tiers on a multi-turn workload, and swap vs recompute preemption (issue 27's CPU goals):
``python -m benchmarks.multiturn``.

1. Multi-turn: N conversations of T turns over 1,000-2,000-token documents
   (``benchmarks/multiturn_workload.py``); turn t's prompt is turn t-1's prompt + answer + a new
   question. Turns run in order (every conversation's turn 1, then every turn 2, ...), at most
   ``--concurrency`` requests in flight, on a device pool (``--device-blocks``, default: room for
   ``concurrency`` whole conversations) far too small for all conversations, so a conversation's
   KV leaves the device pool before its next turn. Configurations: no tier (the context is
   recomputed), a host tier holding the whole workload, and with ``--disk-dir`` a small host tier
   (a quarter) over a disk tier holding the workload. Per configuration: TTFT p50/p95 of turn 1
   and of turns 2-T, the turns 2-T TTFT p50 against no tier (goal: <= 0.3x with the host tier),
   prompt tokens served per tier (device / host / disk over all prompt tokens), wall time, and
   whether the greedy outputs equal no tier's.
2. Preemption: ``--preempt-requests`` prompts at that concurrency on a device pool holding about a
   third of what they need (``--preempt-blocks``), ``--kv-preemption swap`` vs ``recompute`` (same
   host tier): output tokens/s, preemptions by mode, TTFT/E2E p50; the greedy outputs must be
   identical (exit 1 otherwise).

TTFT/E2E are the engine's own (``RequestOutput.ttft_s``/``e2e_s``: from when the request was added).
Every engine is warmed up on an unrelated prompt first. ``--out DIR`` writes multiturn.md and
multiturn.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.kv_bench_engines import EngineFactory, greedy_params
from benchmarks.metrics_math import percentile
from benchmarks.multiturn_workload import (Conversation, blocks, build_workload, multiturn_sizes, next_prompt,
                                          parse_range, preemption_sizes)
from benchmarks.preemption_bench import PREEMPT_MODES, preemption_table, run_preemption
from benchmarks.report import fmt, machine_info, md_table


@dataclass
class TurnRecord:
    conv: int
    turn: int  # 0-based
    prompt_tokens: int
    cached: int  # prompt tokens served from the prefix cache, any tier
    host: int  # ... loaded from the host tier
    disk: int  # ... loaded from the disk tier
    ttft_s: float
    e2e_s: float
    output_tokens: int


def run_conversations(engine, convs: list[Conversation], max_tokens: int, concurrency: int):
    """Turn-major order (all turn 1s, then all turn 2s, ...), at most ``concurrency`` in flight; a
    turn starts once its conversation's previous turn has finished. Returns (records, outputs,
    prompts, wall seconds); outputs[c][t] and prompts[c][t] are token ids."""
    n, turns = len(convs), len(convs[0].followups) + 1
    eos = set(engine.eos_ids)
    queue = deque((t, c) for t in range(turns) for c in range(n))
    prompts: list[list[list[int]]] = [[] for _ in range(n)]
    outputs: list[list[list[int]]] = [[] for _ in range(n)]
    flight: dict[str, tuple[int, int]] = {}
    records: list[TurnRecord] = []
    params = greedy_params(max_tokens)
    start = time.perf_counter()
    while queue or flight:
        while queue and len(flight) < concurrency and len(outputs[queue[0][1]]) == queue[0][0]:
            t, c = queue.popleft()
            conv = convs[c]
            prompt = conv.first if t == 0 else next_prompt(prompts[c][-1], outputs[c][-1], conv.followups[t - 1], eos)
            prompts[c].append(prompt)
            rid = f"mt-{c}-{t}"
            engine.add_request(rid, prompt, params)
            flight[rid] = (t, c)
        for out in engine.step():
            if not out.finished:
                continue
            t, c = flight.pop(out.request_id)
            if out.finish_reason == "error":
                raise RuntimeError(f"conversation {c} turn {t + 1}: {out.error}")
            outputs[c].append(out.token_ids)
            records.append(TurnRecord(c, t, out.num_prompt_tokens, out.num_cached_tokens, out.num_host_cached_tokens,
                                      out.num_disk_cached_tokens, out.ttft_s, out.e2e_s, out.num_output_tokens))
    engine.on_idle()
    return records, outputs, prompts, time.perf_counter() - start


def hit_rates(records: list[TurnRecord]) -> dict:
    """Prompt tokens served from each tier over all prompt tokens of ``records``."""
    total = sum(r.prompt_tokens for r in records) or 1
    host, disk = sum(r.host for r in records), sum(r.disk for r in records)
    return {"device": (sum(r.cached for r in records) - host - disk) / total, "host": host / total,
            "disk": disk / total}


def summarize(name: str, records: list[TurnRecord], wall: float, stats: dict) -> dict:
    first = [r.ttft_s for r in records if r.turn == 0]
    later = [r.ttft_s for r in records if r.turn > 0]
    return {"config": name, "wall_s": wall, "requests": len(records),
            "prompt_tokens": sum(r.prompt_tokens for r in records),
            "output_tokens": sum(r.output_tokens for r in records),
            "ttft_first_p50_s": percentile(first, 50), "ttft_first_p95_s": percentile(first, 95),
            "ttft_later_p50_s": percentile(later, 50), "ttft_later_p95_s": percentile(later, 95),
            "hit_rate": hit_rates(records), "hit_rate_later": hit_rates([r for r in records if r.turn > 0]),
            "kv_stats": stats, "records": [asdict(r) for r in records]}


def tier_configs(host_blocks: int, disk_dir: str | None) -> list[tuple[str, dict | None]]:
    configs = [("no tier", None), ("host tier", {"host_blocks": host_blocks})]
    if disk_dir:
        configs.append(("small host + disk", {"host_blocks": max(1, host_blocks // 4), "disk_dir": disk_dir,
                                              "disk_blocks": host_blocks}))
    return configs


def run_multiturn(factory: EngineFactory, convs: list[Conversation], max_tokens: int, concurrency: int,
                  device_blocks: int, host_blocks: int, disk_dir: str | None = None) -> tuple[list[dict], dict]:
    """One row per tier configuration (the first is no tier) and the prompts/outputs of each."""
    rows, runs = [], {}
    for name, offload in tier_configs(host_blocks, disk_dir):
        engine = factory.make(device_blocks, concurrency, offload)
        try:
            records, outputs, prompts, wall = run_conversations(engine, convs, max_tokens, concurrency)
            rows.append(summarize(name, records, wall, engine.kv.stats()))
        finally:
            engine.shutdown()
        runs[name] = {"outputs": outputs, "prompts": prompts}
        rows[-1]["same_outputs_as_no_tier"] = outputs == runs[rows[0]["config"]]["outputs"]
        base = rows[0]["ttft_later_p50_s"]
        rows[-1]["ttft_later_vs_no_tier"] = rows[-1]["ttft_later_p50_s"] / base if base else None
        print(multiturn_table(rows[-1:]), file=sys.stderr, flush=True)
    return rows, runs


def multiturn_table(rows: list[dict]) -> str:
    head = ["config", "turn-1 TTFT p50 / p95 ms", "turns 2+ TTFT p50 / p95 ms", "turns 2+ p50 vs no tier",
            "hit device / host / disk (all turns)", "hit device / host / disk (turns 2+)", "wall s",
            "same outputs as no tier"]

    def hits(h: dict) -> str:
        return " / ".join(f"{100 * h[k]:.1f}%" for k in ("device", "host", "disk"))

    return md_table(head, [[r["config"],
                            f"{fmt(r['ttft_first_p50_s'], '{:.0f}', 1e3)} / {fmt(r['ttft_first_p95_s'], '{:.0f}', 1e3)}",
                            f"{fmt(r['ttft_later_p50_s'], '{:.0f}', 1e3)} / {fmt(r['ttft_later_p95_s'], '{:.0f}', 1e3)}",
                            fmt(r.get("ttft_later_vs_no_tier"), "{:.2f}x"), hits(r["hit_rate"]),
                            hits(r["hit_rate_later"]), fmt(r["wall_s"], "{:.1f}"),
                            "yes" if r.get("same_outputs_as_no_tier") else "NO"] for r in rows])


# ---- sizes, report, command line ----------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from cluster.config import DEFAULT_MODEL

    ap = argparse.ArgumentParser(prog="python -m benchmarks.multiturn", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="target: alias, local HF dir or .gguf file")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--draft", default="none", help="speculation method of every engine (default: none)")
    ap.add_argument("--parts", default="multiturn,preemption", help="which runs: multiturn, preemption or both")
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--doc-tokens", default="1000,2000", metavar="LO,HI", help="document length per conversation")
    ap.add_argument("--max-tokens", type=int, default=16, help="answer tokens per turn (greedy)")
    ap.add_argument("--concurrency", type=int, default=4, help="multi-turn requests in flight")
    ap.add_argument("--device-blocks", type=int, default=None, help="device KV pool of the multi-turn runs "
                    "(default: room for --concurrency of the longest conversations)")
    ap.add_argument("--host-blocks", type=int, default=None, help="host tier (default: the whole workload)")
    ap.add_argument("--disk-dir", default=None, help="also run a quarter-size host tier over a disk tier in this "
                    "directory (which must exist) holding the whole workload")
    ap.add_argument("--preempt-requests", type=int, default=64, help="requests of the preemption run, all in flight")
    ap.add_argument("--preempt-doc-tokens", default="100,400", metavar="LO,HI")
    ap.add_argument("--preempt-modes", default="swap,recompute,recompute-no-tier",
                    help=f"preemption runs, comma-separated: {', '.join(PREEMPT_MODES)} (recompute-no-tier: "
                         "without a host tier, as before tiers existed; the others share one host tier)")
    ap.add_argument("--preempt-max-tokens", type=int, default=64, help="output tokens per request (EOS ignored)")
    ap.add_argument("--preempt-blocks", type=int, default=None,
                    help="device KV pool of the preemption run (default: about a third of what it needs)")
    ap.add_argument("--seed", type=int, default=0, help="documents and questions")
    ap.add_argument("--out", type=Path, default=None, metavar="DIR", help="write multiturn.md and multiturn.json")
    args = ap.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        ap.error(str(e))
    return args


def check_args(args) -> None:
    for flag in ("conversations", "turns", "max_tokens", "concurrency", "preempt_requests", "preempt_max_tokens",
                 "threads", "device_blocks", "host_blocks", "preempt_blocks"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise ValueError(f"--{flag.replace('_', '-')} {v}: must be at least 1")
    args.doc_range = parse_range("--doc-tokens", args.doc_tokens)
    args.preempt_doc_range = parse_range("--preempt-doc-tokens", args.preempt_doc_tokens)
    args.part_list = [p.strip() for p in args.parts.split(",")]
    bad = [p for p in args.part_list if p not in ("multiturn", "preemption")]
    if bad or not args.part_list:
        raise ValueError(f"--parts {args.parts!r}: use multiturn, preemption or multiturn,preemption")
    args.preempt_mode_list = tuple(dict.fromkeys(m.strip() for m in args.preempt_modes.split(",")))
    bad = [m for m in args.preempt_mode_list if m not in PREEMPT_MODES]
    if bad:
        raise ValueError(f"--preempt-modes {args.preempt_modes!r}: {bad[0]!r} is not one of {', '.join(PREEMPT_MODES)}")
    if args.disk_dir is not None and not Path(args.disk_dir).is_dir():
        raise ValueError(f"--disk-dir {args.disk_dir}: not a directory (create it first)")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out}: exists and is not a directory")
    from benchmarks.options import check_method

    check_method(args.draft)


def check_pool(flag: str, device_blocks: int, longest_blocks: int, block_size: int) -> None:
    """The engine's context is the pool less a block (and draft slots): the longest request must fit."""
    if device_blocks < longest_blocks + 2:
        raise ValueError(f"{flag} {device_blocks}: the longest request needs {longest_blocks} blocks of "
                         f"{block_size} tokens (and 2 spare); give at least {longest_blocks + 2}")


def goal_line(rows: list[dict]) -> str:
    host = next((r for r in rows if r["config"] == "host tier"), None)
    if host is None or host["ttft_later_vs_no_tier"] is None:
        return ""
    met = "met" if host["ttft_later_vs_no_tier"] <= 0.3 else "NOT met"
    return (f"Goal (issue 27): host tier TTFT p50 of turns 2+ <= 0.3x of no tier: "
            f"{host['ttft_later_vs_no_tier']:.2f}x, {met}.")


def markdown(doc: dict) -> str:
    parts = [f"# Multi-turn KV tiers and preemption ({doc['date']})", "", f"`{doc['command']}`", "",
             f"Machine: {doc['machine']}", ""]
    mt = doc.get("multiturn")
    if mt:
        s = mt["settings"]
        parts += ["## Multi-turn: TTFT and prefix hits per KV tier", "",
                  f"{s['conversations']} conversations x {s['turns']} turns, documents of {s['doc_tokens']} tokens, "
                  f"{s['max_tokens']} answer tokens per turn (greedy, draft {s['draft']}), concurrency "
                  f"{s['concurrency']}; device pool {s['device_blocks']} blocks of {s['block_size']} tokens, the "
                  f"workload {s['workload_blocks']} blocks; host tier {s['host_blocks']} blocks"
                  + (f"; small host + disk: {max(1, s['host_blocks'] // 4)} + {s['host_blocks']} blocks"
                     if s.get("disk_dir") else "") + ". Hit rates: prompt tokens served from each tier over all "
                  "prompt tokens.", "", multiturn_table(mt["rows"]), "", goal_line(mt["rows"]), ""]
    pr = doc.get("preemption")
    if pr:
        s = pr["settings"]
        parts += ["## Preemption: swap vs recompute", "",
                  f"{s['requests']} requests (documents of {s['doc_tokens']} tokens, chat-framed) at concurrency "
                  f"{s['requests']}, {s['max_tokens']} output tokens each (EOS ignored, greedy), device pool "
                  f"{s['device_blocks']} blocks for {s['workload_blocks']} needed, host tier {s['host_blocks']} "
                  f"blocks (every mode but recompute-no-tier). Greedy outputs identical between modes: "
                  f"{'yes' if pr['rows'][0]['same_outputs'] else 'NO'}.", "", preemption_table(pr["rows"]), ""]
    return "\n".join(parts)


def run_all(args, factory: EngineFactory, tokenizer) -> dict:
    bs = factory.block_size
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": "python -m benchmarks.multiturn " + " ".join(
        sys.argv[1:] if args.argv is None else args.argv), "machine": machine_info()}
    # machine_info reads the process's default; every engine sets torch to --threads (or all cores)
    doc["machine"]["torch_threads"] = args.threads or doc["machine"]["torch_threads"]
    if "multiturn" in args.part_list:
        convs = build_workload(tokenizer, args.conversations, args.turns, args.doc_range, args.seed)
        size = multiturn_sizes(convs, args.max_tokens, args.concurrency, bs)
        device = args.device_blocks or size["device_blocks"]
        host = args.host_blocks or size["host_blocks"]
        check_pool("--device-blocks", device, size["longest_blocks"], bs)
        rows, _ = run_multiturn(factory, convs, args.max_tokens, args.concurrency, device, host, args.disk_dir)
        doc["multiturn"] = {"settings": {"conversations": args.conversations, "turns": args.turns,
                                         "doc_tokens": args.doc_tokens, "max_tokens": args.max_tokens,
                                         "concurrency": args.concurrency, "draft": args.draft, "block_size": bs,
                                         "device_blocks": device, "host_blocks": host, "disk_dir": args.disk_dir,
                                         "workload_blocks": size["workload_blocks"], "seed": args.seed},
                            "rows": rows}
    if "preemption" in args.part_list:
        convs = build_workload(tokenizer, args.preempt_requests, 1, args.preempt_doc_range, args.seed + 1)
        prompts = [c.first for c in convs]
        size = preemption_sizes(prompts, args.preempt_max_tokens, bs)
        device = args.preempt_blocks or size["device_blocks"]
        check_pool("--preempt-blocks", device, blocks(max(len(p) for p in prompts) + args.preempt_max_tokens, bs), bs)
        rows, _ = run_preemption(factory, prompts, args.preempt_max_tokens, args.preempt_requests, device,
                                 size["host_blocks"], args.preempt_mode_list)
        doc["preemption"] = {"settings": {"requests": args.preempt_requests, "doc_tokens": args.preempt_doc_tokens,
                                          "max_tokens": args.preempt_max_tokens, "device_blocks": device,
                                          "host_blocks": size["host_blocks"],
                                          "workload_blocks": size["workload_blocks"]}, "rows": rows}
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = argv
    from actors.model.loader import load_model
    from cluster.runtime import resolve_device_dtype

    device, dtype = resolve_device_dtype(args.device, "auto")
    loaded = load_model(args.model, dtype=dtype, device=device)
    factory = EngineFactory(args.model, loaded, args.device, args.draft, args.threads)
    start = time.perf_counter()
    try:
        doc = run_all(args, factory, loaded.tokenizer)
    except ValueError as e:
        print(f"python -m benchmarks.multiturn: error: {e}", file=sys.stderr)
        return 2
    doc["wall_s"] = time.perf_counter() - start
    md = markdown(doc) + f"\nWhole command: {doc['wall_s']:.0f} s.\n"
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "multiturn.md").write_text(md, encoding="utf-8")
        (args.out / "multiturn.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
        print(f"# wrote {args.out / 'multiturn.md'}, {args.out / 'multiturn.json'}", file=sys.stderr)
    pr = doc.get("preemption")
    if pr and not pr["rows"][0]["same_outputs"]:
        print("FAILED: greedy outputs differ between swap and recompute preemption", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
