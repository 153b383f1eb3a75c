"""Host time per engine step, by phase (issue 26: scheduler, drafting, forward, verification,
detokenization), at given concurrencies: ``python -m benchmarks.host_profile --device cuda``.

Each case (draft method x concurrency) generates the same prompts on one engine after a warm-up
and reads the engine's own step clock (``cluster/step_clock.py``: a clock read per phase, no
profiler): milliseconds per step in each phase. On a GPU the host waits for the device only where
it reads the step's results back (``wait``), so "host" = step - wait."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.report import md_table
from cluster.step_clock import PHASES


def profile_case(engine, prompts, params, concurrency: int) -> dict:
    engine.generate(prompts[:2], params[:2], chat=True, concurrency=concurrency)  # warm-up
    before = engine.clock.snapshot()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, chat=True, concurrency=concurrency)
    wall = time.perf_counter() - t0
    after = engine.clock.snapshot()
    steps = after["steps"] - before["steps"]
    return dict(concurrency=concurrency, tokens=sum(len(o.token_ids) for o in outs), wall_s=wall, steps=steps,
                step_ms=1e3 * wall / max(1, steps),
                phases_ms={k: 1e3 * (after[k] - before[k]) / max(1, steps) for k in PHASES})


def table(rows: list[dict]) -> str:
    head = ["draft", "c", "steps", "tok/s", "step ms", *PHASES, "host ms (step - wait)"]
    return md_table(head, [[r["draft"], str(r["concurrency"]), str(r["steps"]), f"{r['tokens'] / r['wall_s']:.0f}",
                            f"{r['step_ms']:.2f}", *(f"{r['phases_ms'][k]:.2f}" for k in PHASES),
                            f"{r['step_ms'] - r['phases_ms']['wait']:.2f}"] for r in rows])


def run(device: str, drafts: list[str], concurrency: list[int], sample: int, max_tokens: int) -> list[dict]:
    from actors.sampling_params import SamplingParams
    from benchmarks.options import select_prompts
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine

    _, prompts = select_prompts(None, sample, 0)
    msgs = [p.messages for p in prompts]
    params = [SamplingParams(max_tokens=p.budget(max_tokens)) for p in prompts]
    rows = []
    for draft in drafts:
        spec = SpeculativeConfig.from_draft_arg(draft, 5, None, adaptive=True)
        engine = LLMEngine(EngineConfig(device=device, speculative=spec, max_num_seqs=max(concurrency)))
        for c in concurrency:
            rows.append(dict(draft=draft, **profile_case(engine, msgs, params, c)))
            print(table(rows[-1:]), flush=True)
        engine.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.host_profile", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--draft", default="none,default", help="draft methods, comma-separated")
    ap.add_argument("--concurrency", default="1,64", help="comma-separated")
    ap.add_argument("--sample", type=int, default=64, help="bench prompts (stratified)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="also write host_profile.md here")
    args = ap.parse_args(argv)
    rows = run(args.device, args.draft.split(","), [int(c) for c in args.concurrency.split(",")], args.sample,
               args.max_tokens)
    md = "## Host time per step, by phase (ms)\n\n" + table(rows) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_profile.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
