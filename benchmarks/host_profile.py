"""Host time per engine step, by phase (issue 26: scheduler, drafting, forward, verification,
detokenization), at given concurrencies: ``python -m benchmarks.host_profile --device cuda``.

Each case (draft method x concurrency) generates the same prompts twice on one engine after a
warm-up: once plain (the step time a user sees: wall time / steps) and once under cProfile,
whose cumulative times per engine function give the split. On a GPU the host waits for the
device only where it reads results (``.tolist()`` / ``.item()``): that wait is its own row, so
"host" = step - GPU wait. cProfile slows Python code down (about 1.5-2x here), so the split is
shown as shares of the profiled step, scaled to the plain step time."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

# (label, file suffix, function name): cumulative time of each, per step
PHASES = (
    ("schedule", "actors/scheduler.py", "schedule"),
    ("draft", "cluster/drafting.py", "propose"),
    ("plan forward", "cluster/engine.py", "_plan_forward"),
    ("forward (enqueue)", "cluster/engine.py", "_forward"),
    ("verify + commit", "cluster/engine.py", "_verify_and_commit"),
    ("emit + detokenize", "cluster/engine.py", "_emit"),
)
WAITS = ("<method 'tolist' of 'torch._C.TensorBase' objects>", "<method 'item' of 'torch._C.TensorBase' objects>")


def phase_seconds(stats: pstats.Stats) -> tuple[int, float, dict[str, float]]:
    """(engine steps, seconds in LLMEngine.step, {phase: cumulative seconds}) from a profile."""
    steps, step_s, out = 0, 0.0, {label: 0.0 for label, _, _ in PHASES}
    out["GPU wait (.tolist/.item)"] = 0.0
    for (path, _, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        if path.endswith("cluster/engine.py") and func == "step":
            steps, step_s = steps + ncalls, step_s + cumtime
        for label, suffix, name in PHASES:
            if path.endswith(suffix) and func == name:
                out[label] += cumtime
        if func in WAITS:
            out["GPU wait (.tolist/.item)"] += tottime
    return steps, step_s, out


def profile_case(engine, prompts, params, concurrency: int) -> dict:
    engine.generate(prompts[:2], params[:2], chat=True, concurrency=concurrency)  # warm-up
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, chat=True, concurrency=concurrency)
    wall = time.perf_counter() - t0
    prof = cProfile.Profile()
    prof.enable()
    engine.generate(prompts, params, chat=True, concurrency=concurrency)
    prof.disable()
    steps, step_s, phases = phase_seconds(pstats.Stats(prof))
    scale = (wall / steps) / (step_s / steps) if steps and step_s else 0.0
    return dict(concurrency=concurrency, tokens=sum(len(o.token_ids) for o in outs), wall_s=wall, steps=steps,
                step_ms=1e3 * wall / max(1, steps), phases_ms={k: 1e3 * v / max(1, steps) * scale for k, v in phases.items()})


def table(rows: list[dict]) -> str:
    labels = [label for label, _, _ in PHASES] + ["GPU wait (.tolist/.item)"]
    head = ["draft", "c", "steps", "tok/s", "step ms", *labels, "host ms (step - wait)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        p = r["phases_ms"]
        wait = p["GPU wait (.tolist/.item)"]
        cells = [r["draft"], str(r["concurrency"]), str(r["steps"]), f"{r['tokens'] / r['wall_s']:.0f}",
                 f"{r['step_ms']:.2f}", *(f"{p[k]:.2f}" for k in labels), f"{r['step_ms'] - wait:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
