"""Swap vs recompute preemption under a small device pool (part 2 of ``python -m benchmarks.multiturn``):
the same prompts per ``--kv-preemption`` mode, one row each (tokens/s, preemptions, blocks swapped,
TTFT/E2E p50), and whether every mode's greedy outputs are the same."""
from __future__ import annotations

import sys
import time

from benchmarks.kv_bench_engines import EngineFactory, greedy_params
from benchmarks.metrics_math import percentile
from benchmarks.report import fmt, md_table

PREEMPT_MODES = ("swap", "recompute", "auto", "recompute-no-tier")


def preempt_offload(mode: str, host_blocks: int) -> dict | None:
    """``recompute-no-tier``: today's default without a host tier (a preempted request's prefix
    blocks stay cached only while the device pool keeps them); the others share one host tier."""
    return None if mode == "recompute-no-tier" else {"host_blocks": host_blocks, "preemption": mode}


def run_preemption(factory: EngineFactory, prompts: list[list[int]], max_tokens: int, concurrency: int,
                   device_blocks: int, host_blocks: int, modes: tuple[str, ...] = ("swap", "recompute")):
    """One row per preemption mode (same device pool, same host tier) and each mode's outputs."""
    rows, outputs = [], {}
    for mode in modes:
        engine = factory.make(device_blocks, concurrency, preempt_offload(mode, host_blocks))
        try:
            start = time.perf_counter()
            outs = engine.generate(prompts, greedy_params(max_tokens, ignore_eos=True), concurrency=concurrency)
            wall = time.perf_counter() - start
            stats = engine.kv.stats()
            counts = dict(engine.scheduler.preemptions)
        finally:
            engine.shutdown()
        errors = [o.error for o in outs if o.finish_reason == "error"]
        if errors:
            raise RuntimeError(f"--kv-preemption {mode}: {len(errors)} requests failed: {errors[0]}")
        outputs[mode] = [o.token_ids for o in outs]
        tokens = sum(o.num_output_tokens for o in outs)
        rows.append({"mode": mode, "requests": len(outs), "concurrency": concurrency, "device_blocks": device_blocks,
                     "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "preemptions": counts,
                     "ttft_p50_s": percentile([o.ttft_s for o in outs], 50),
                     "e2e_p50_s": percentile([o.e2e_s for o in outs], 50), "kv_stats": stats})
        print(preemption_table(rows[-1:]), file=sys.stderr, flush=True)
    same = all(o == outputs[modes[0]] for o in outputs.values())
    for r in rows:
        r["same_outputs"] = same
    return rows, outputs


def preemption_table(rows: list[dict]) -> str:
    head = ["preemption", "requests", "c", "device blocks", "output tokens", "tok/s", "preemptions swap / recompute",
            "blocks swapped out / in", "prefix blocks loaded from host", "TTFT p50 ms", "E2E p50 s", "wall s"]
    return md_table(head, [[r["mode"], str(r["requests"]), str(r["concurrency"]), str(r["device_blocks"]),
                            str(r["output_tokens"]), fmt(r["tokens_per_s"], "{:.1f}"),
                            f"{r['preemptions']['swap']} / {r['preemptions']['recompute']}",
                            f"{r['kv_stats'].get('host_blocks_swapped_out', 0)} / "
                            f"{r['kv_stats'].get('host_blocks_swapped_in', 0)}",
                            str(r["kv_stats"].get("host_blocks_loaded", 0)),
                            fmt(r["ttft_p50_s"], "{:.0f}", 1e3), fmt(r["e2e_p50_s"]), fmt(r["wall_s"], "{:.1f}")]
                           for r in rows])
