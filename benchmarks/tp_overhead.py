"""Plain greedy decoding through the Ray tensor-parallel verifier (ShardGroup) vs the in-process
Verifier, and the per-step control overhead (driver wall time minus rank 0's time in the step).

    python -m benchmarks.tp_overhead [--model smollm2-135m] [--tp 1,3] [--batch 1,8] [--tokens 32]

Prints one row per (backend, tp, batch): decode tokens/s, ms per step, rank-0 ms per step,
overhead ms per step and its share of the step. Backends: in-process Verifier; ``ray`` = plain actor
calls to rank 0; ``ray-cg`` = a Ray compiled graph for that call. Prefill steps are not timed.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

PROMPTS = Path(__file__).parent / "prompts" / "chat20.jsonl"
NUM_BLOCKS, BLOCK_SIZE = 128, 16


def _engine(loaded, threads: int, verifier=None):
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    cfg = EngineConfig(model=str(loaded.model_dir), num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                       num_threads=threads, enable_prefix_caching=False)
    return LLMEngine(cfg, loaded=loaded, verifier=verifier)


def decode_rate(eng, prompts: list, tokens: int, group=None) -> dict:
    """Prefill every prompt (untimed), then time the decode steps -> tokens/s, steps, seconds."""
    from actors.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    ids = [f"r{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params, chat=True)
    started: set[str] = set()
    while len(started) < len(ids):  # prefill: until every request has its first token
        started |= {o.request_id for o in eng.step() if o.token_ids}
    if group is not None:
        group.step_stats.reset()
    n, steps, t0 = 0, 0, time.perf_counter()
    while eng.has_unfinished():
        n += sum(len(o.delta_token_ids) for o in eng.step())
        steps += 1
    secs = time.perf_counter() - t0
    return {"tok_s": n / secs, "steps": steps, "step_ms": 1e3 * secs / max(steps, 1)}


def _row(backend: str, tp: int, batch: int, r: dict, group=None) -> str:
    if group is None:
        return f"| {backend:<10} | {tp:>2} | {batch:>5} | {r['tok_s']:>7.1f} | {r['step_ms']:>7.1f} | {'-':>8} | {'-':>11} | {'-':>6} |"
    st = group.step_stats
    rank0 = 1e3 * st.compute_s / max(st.steps, 1)
    return (f"| {backend:<10} | {tp:>2} | {batch:>5} | {r['tok_s']:>7.1f} | {r['step_ms']:>7.1f} | {rank0:>8.1f} | "
            f"{st.overhead_ms_per_step:>11.2f} | {100 * st.overhead_fraction:>5.1f}% |")


def run(model: str, tps: list[int], batches: list[int], tokens: int) -> list[str]:
    import ray

    from actors.model.loader import load_model
    from cluster.shard_group import ShardGroup

    cores = os.cpu_count() or 1
    loaded = load_model(model)
    chats = [json.loads(line)["messages"] for line in PROMPTS.read_text().splitlines()]
    rows = ["| backend    | tp | batch |   tok/s | step ms | rank0 ms | overhead ms | ovh %  |",
            "|------------|----|-------|---------|---------|----------|-------------|--------|"]
    eng = _engine(loaded, cores)
    for b in batches:
        decode_rate(eng, chats[:b], 4)  # warm-up
        rows.append(_row("in-process", 1, b, decode_rate(eng, chats[:b], tokens)))
        print(rows[-1], flush=True)
    del eng
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
    try:
        for tp in tps:
            for compiled in (False, True):
                group = ShardGroup.create(str(loaded.model_dir), tp, NUM_BLOCKS, BLOCK_SIZE, compiled=compiled,
                                          num_threads=max(1, cores // tp), timeout_s=120)
                try:
                    rows += _ray_rows(loaded, group, chats, batches, tokens)
                finally:
                    group.shutdown()
    finally:
        ray.shutdown()
    return rows


def _ray_rows(loaded, group, chats: list, batches: list[int], tokens: int) -> list[str]:
    eng = _engine(loaded, 1, verifier=group)  # the driver only samples: leave the cores to the ranks
    group.warmup()
    backend = "ray-cg" if group.is_compiled else "ray"
    out = []
    for b in batches:
        decode_rate(eng, chats[:b], 4, group)
        out.append(_row(backend, group.spec.tp_size, b, decode_rate(eng, chats[:b], tokens, group), group))
        print(out[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tp", default="1,3", help="comma-separated TP sizes (must divide the KV heads)")
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens per request")
    args = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    rows = run(args.model, ints(args.tp), ints(args.batch), args.tokens)
    print(f"\n{os.cpu_count()} cores, fp32, plain greedy decode, {args.tokens} tokens/request, model {args.model}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
