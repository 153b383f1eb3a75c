"""Tokens/s of a whole Ray replica (scheduler actor + KV allocator actor + verifier shards), as
`specray generate --ray` runs it, against the in-process engine on the same prompts.

    .venv/bin/python -m benchmarks.ray_e2e [--limit 8] [--max-tokens 64] [--tp 1] [--draft none]

Start-up (Ray, actors, weights) is excluded: both sides serve one warm-up prompt first."""
from __future__ import annotations

import argparse
import time

from actors.sampling_params import SamplingParams
from benchmarks.prompt_set import CHAT20_PROMPTS, load_prompt_set
from cluster.config import EngineConfig, SpeculativeConfig


def _timed(fn) -> tuple[float, list]:
    start = time.perf_counter()
    outs = fn()
    return time.perf_counter() - start, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--draft", default="none")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    args = ap.parse_args()

    from cluster.engine import LLMEngine
    from cluster.replica import RayOptions, RayReplicaClient, connect_or_start_ray

    prompts = [p.prompt for p in load_prompt_set(CHAT20_PROMPTS)[: args.limit or None]]
    params = [SamplingParams(max_tokens=args.max_tokens)] * len(prompts)
    config = EngineConfig(speculative=SpeculativeConfig.from_draft_arg(args.draft, 5))
    local = LLMEngine(config)
    connect_or_start_ray()
    client = RayReplicaClient(config, RayOptions(tp=args.tp))
    rows = []
    try:
        local.generate(prompts[:1], SamplingParams(max_tokens=8), chat=True)
        client.generate_all(prompts[:1], [SamplingParams(max_tokens=8)], True, None)
        for c in args.concurrency:
            t_loc, o_loc = _timed(lambda: local.generate(prompts, params, chat=True, concurrency=c))
            t_ray, o_ray = _timed(lambda: client.generate_all(prompts, params, True, c))
            n = sum(o.num_output_tokens for o in o_loc)
            same = [o.token_ids for o in o_loc] == [o.token_ids for o in o_ray]
            rows.append((c, n, n / t_loc, sum(o.num_output_tokens for o in o_ray) / t_ray, same))
    finally:
        client.shutdown()
    print(f"| concurrency | output tokens | in-process tok/s | ray tp={args.tp} tok/s | ratio | same output |")
    print("|---|---|---|---|---|---|")
    for c, n, a, b, same in rows:
        print(f"| {c} | {n} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {same} |")


if __name__ == "__main__":
    main()
