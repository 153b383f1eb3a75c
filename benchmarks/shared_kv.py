"""Cross-replica prefix reuse through the shared KV tier (issue 27's goal: TTFT <= 0.3x of recompute).

    python -m benchmarks.shared_kv [--prefix-tokens 2000] [--trials 3] [--out DIR]

Two in-process engines ("replica A" and "replica B") over one loaded target, each with its own KV
cache, share the tier actor (a local Ray instance, blocks through its object store). Per trial, a
fresh random prefix of ``--prefix-tokens`` tokens: A answers prefix + question 1 (computing and
publishing the prefix), then B answers prefix + question 2, fetching the prefix from the tier;
a third engine without the tier answers prefix + question 2 from scratch (recompute). Reported: TTFT
of each, B's cached and shared tokens, the greedy outputs compared, and B's fetch counters.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from benchmarks.report import md_table


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab) for _ in range(n)]


def _ttft(engine, prompt: list[int], max_tokens: int):
    from actors.sampling_params import SamplingParams

    out = engine.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
    return out


def _wait_published(engine, blocks: int, timeout_s: float = 120.0) -> float:
    """Publishing is not awaited by the engine: wait until the tier holds ``blocks`` (seconds)."""
    t0 = time.perf_counter()
    while engine.shared_kv.stats().get("tier_blocks", 0) < blocks:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"the tier holds {engine.shared_kv.stats().get('tier_blocks')} of {blocks} blocks")
        time.sleep(0.02)
    return time.perf_counter() - t0


def run(args) -> dict:
    import ray

    from actors.model.loader import load_model
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=args.object_store_mb * 2**20, namespace="specray-bench")
    try:
        loaded = load_model(args.model)
        base = dict(model=args.model, num_threads=args.threads, num_kv_blocks=args.kv_blocks, block_size=16,
                    max_num_batched_tokens=args.chunk)
        tier = {"enabled": True, "capacity_gb": args.tier_gb, "name": "specray-bench-kv-tier",
                "fetch_timeout_ms": args.fetch_timeout_ms}
        rows, trials = [], []
        rng = random.Random(args.seed)
        for t in range(args.trials + 1):  # trial 0 warms up (actor start, first forwards), not reported
            prefix = _prompt(rng, args.prefix_tokens, loaded.config.vocab_size)
            q1, q2 = _prompt(rng, 12, loaded.config.vocab_size), _prompt(rng, 12, loaded.config.vocab_size)
            a = LLMEngine(EngineConfig(**base, kv_tier=tier), loaded=loaded)
            b = LLMEngine(EngineConfig(**base, kv_tier=tier), loaded=loaded)
            plain = LLMEngine(EngineConfig(**base), loaded=loaded)
            out_a = _ttft(a, prefix + q1, args.max_tokens)
            publish_wait = _wait_published(a, (len(prefix) + len(q1)) // 16)
            out_b = _ttft(b, prefix + q2, args.max_tokens)
            out_r = _ttft(plain, prefix + q2, args.max_tokens)
            s = b.shared_kv.stats()
            trial = {"trial": t, "ttft_a_s": out_a.ttft_s, "ttft_shared_s": out_b.ttft_s, "ttft_recompute_s": out_r.ttft_s,
                     "ratio": out_b.ttft_s / out_r.ttft_s, "b_cached_tokens": out_b.num_cached_tokens,
                     "b_shared_cached_tokens": out_b.num_shared_cached_tokens, "same_output": out_b.token_ids == out_r.token_ids,
                     "publish_wait_s": publish_wait, "b_fetch": {k: s[k] for k in ("hits", "misses", "timeouts",
                                                                                      "blocks_fetched", "bytes_fetched")}}
            print(json.dumps(trial), flush=True)
            if t:
                trials.append(trial)
                rows.append([str(t), f"{out_a.ttft_s:.3f}", f"{out_r.ttft_s:.3f}", f"{out_b.ttft_s:.3f}",
                             f"{trial['ratio']:.3f}", f"{out_b.num_shared_cached_tokens}/{len(prefix) + len(q2)}",
                             str(trial["same_output"]), f"{s['bytes_fetched'] / 2**20:.1f}"])
            for eng in (a, b, plain):
                eng.shutdown()
            ray.get(ray.get_actor("specray-bench-kv-tier", namespace="specray").clear.remote())
        summary = {"median_ttft_recompute_s": statistics.median(t["ttft_recompute_s"] for t in trials),
                   "median_ttft_shared_s": statistics.median(t["ttft_shared_s"] for t in trials)}
        summary["ratio_of_medians"] = summary["median_ttft_shared_s"] / summary["median_ttft_recompute_s"]
        table = md_table(["trial", "A TTFT s (computes)", "recompute TTFT s", "B TTFT s (shared tier)", "B / recompute",
                          "B shared tokens / prompt", "same greedy output", "MiB fetched"], rows)
        return {"args": vars(args), "machine": platform.machine(), "python": platform.python_version(),
                "trials": trials, "summary": summary, "table": table}
    finally:
        ray.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prefix-tokens", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=1, help="tokens generated per request (TTFT needs 1)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-blocks", type=int, default=160, help="each engine's KV pool (blocks of 16)")
    p.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens (prefill chunk)")
    p.add_argument("--tier-gb", type=float, default=1.0)
    p.add_argument("--fetch-timeout-ms", type=float, default=1000.0)
    p.add_argument("--object-store-mb", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for result.json and table.md")
    args = p.parse_args(argv)
    res = run(args)
    print(res["table"])
    print(json.dumps(res["summary"]))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(res, indent=1))
        (out / "table.md").write_text(res["table"] + "\n\n" + json.dumps(res["summary"]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
