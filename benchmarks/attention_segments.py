"""The native CPU attention's segment length, A/B inside one process: a step of the default model
(plain decode, a K=5 chain, an 11-node tree) with each row's keys as one segment against segments of
``--segments`` keys (kernels/csrc/attention.cpp), alternated in ABBA rounds so that the machine's
drift falls on both arms:

    python -m benchmarks.attention_segments [--contexts 300,1000,2000] [--batches 1,4] [--steps decode,tree]
                                            [--segments 0,512] [--rounds 8] [--reps 15]
                                            [--kv-cache-dtype auto|float32|bfloat16]

Prints, per batch, context and step, the median over rounds of each round's median step time, and
each arm against the first. Separate processes differ by more than the effect on a 2-core VM; the
toggle is ``kernels.cpu_native.set_attention_segment``, a process-wide switch that tests and this
benchmark use, never a serving process."""
from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.report import md_table
from cluster.config import engine_choices


def _ints(text: str, what: str, ap: argparse.ArgumentParser) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        ap.error(f"{what} {text!r}: expected comma-separated integers")


def ab_rounds(run, arms: list[int], rounds: int, reps: int) -> dict[int, float]:
    """Median ms of ``run()`` per segment length in ``arms``, ABBA-alternated over ``rounds`` rounds."""
    from benchmarks.step_costs import device_median_s
    from kernels import cpu_native as cn

    cpu = torch.device("cpu")
    times: dict[int, list[float]] = {a: [] for a in arms}
    for a in arms:  # warm each arm
        with cn.attention_segment(a):
            run()
    for i in range(rounds):
        for a in (arms if i % 2 == 0 else arms[::-1]):
            with cn.attention_segment(a):
                times[a].append(device_median_s(run, cpu, reps) * 1e3)
    return {a: statistics.median(t) for a, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.attention_segments", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--contexts", default="300,1000,2000", help="cached tokens per sequence")
    ap.add_argument("--batches", default="1,4", help="sequences per step")
    ap.add_argument("--steps", default="decode,tree", help="of decode, chain, tree")
    ap.add_argument("--segments", default="0,512", help="segment lengths to compare (0: whole rows), first = base")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=15, help="steps timed per arm per round")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=engine_choices("kv_cache_dtype"),
                    help="the KV cache's dtype (auto: the model's; bfloat16: half the bytes attention reads)")
    args = ap.parse_args(argv)
    contexts, batches = _ints(args.contexts, "--contexts", ap), _ints(args.batches, "--batches", ap)
    arms = _ints(args.segments, "--segments", ap)
    steps = args.steps.split(",")
    bad = [s for s in steps if s not in ("decode", "chain", "tree")]
    if bad:
        ap.error(f"--steps {','.join(bad)}: expected decode, chain or tree")
    if bad := [a for a in arms if a < 0 or a % 16]:
        ap.error(f"--segments {bad[0]}: expected 0 or a positive multiple of 16")
    if min(contexts) < 1 or min(batches) < 1 or args.rounds < 1 or args.reps < 1:
        ap.error("--contexts, --batches, --rounds and --reps must be at least 1")
    from benchmarks.op_count import StepRunner, native_cpu_model

    model, kv_dtype = native_cpu_model(ap, args.model, args.kv_cache_dtype)
    cpu = torch.device("cpu")
    print(f"{args.model}, {torch.get_num_threads()} threads, {kv_dtype or model.dtype} KV cache; ABBA, {args.rounds} "
          f"rounds x {args.reps} steps per arm")
    rows = []
    for b in batches:
        for ctx in contexts:
            runner = StepRunner(model, b, ctx, cpu, kv_dtype=kv_dtype)
            for kind in steps:
                ms = ab_rounds(runner.step(kind), arms, args.rounds, args.reps)
                base = ms[arms[0]]
                rows.append([str(b), str(ctx), kind]
                            + [f"{ms[a]:.2f} ({(ms[a] / base - 1) * 100:+.1f}%)" for a in arms])
                print(" | ".join(rows[-1]), flush=True)
    print(md_table(["batch", "context", "step"] + [f"segment {a or 'whole'} ms" for a in arms], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
