"""Where a target step's time goes on the CPU's native path: each phase of the decoder layers (the
norms, the four products, RoPE with the KV write, attention, SiLU), the LM head's product and what is
left outside the native ops (the Python that builds the batch, the embedding, the logits' rows), per
step of the default model with ``--context`` tokens cached:

    python -m benchmarks.step_phases [--batch 1,16] [--context 300] [--steps decode,chain,tree]
                                     [--reps 200] [--threads 2] [--kv-cache-dtype auto|float32|bfloat16]

Steps as ``benchmarks.op_count`` makes them (plain decode, a K=5 chain, a 10-node tree). The phases are
timed inside the one-op forward by ``kernels.cpu_native.phase_timing`` (the calling thread's wall
clock, two reads a phase); the products' rates are the bytes of their packed weights over their time,
to set beside ``python -m benchmarks.roofline --dtype streamed``. Prints ms per step (mean over
``--reps`` steps after a warm-up) and GB/s per product."""
from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import torch

from benchmarks.report import md_table
from cluster.config import engine_choices

# the layer's products and where their packed matrices are among a layer's 10 weights (csrc/layers.cpp)
PRODUCTS = {"qkv": 1, "o": 3, "gate_up": 6, "down": 8}
WEIGHTS_PER_LAYER = 10
STEPS = ("decode", "chain", "tree")


@contextmanager
def op_clock(module, names: tuple[str, ...]):
    """Wall seconds spent in each of ``module``'s functions ``names`` while the block runs: yields the
    dict they are summed in (the functions are wrapped, and restored after)."""
    spent = dict.fromkeys(names, 0.0)
    real = {n: getattr(module, n) for n in names}

    def timed(name, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return call

    for n, fn in real.items():
        setattr(module, n, timed(n, fn))
    try:
        yield spent
    finally:
        for n, fn in real.items():
            setattr(module, n, fn)


def step_phases(run, reps: int) -> dict[str, float]:
    """ms per step of ``run()`` (after one warm-up call): wall, each decoder-layer phase, the whole
    ``decoder_layers`` op, the LM head's product (the forward's one other ``linear`` call) and the rest."""
    from kernels import cpu_native as cn

    run()
    with op_clock(cn, ("decoder_layers", "linear")) as spent, cn.phase_timing() as read:
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        wall = time.perf_counter() - t0
        phases = read()
    ms = {name: s * 1e3 / reps for name, s in phases.items()}
    ms.update(wall=wall * 1e3 / reps, layers=spent["decoder_layers"] * 1e3 / reps,
              lm_head=spent["linear"] * 1e3 / reps)
    ms["rest"] = ms["wall"] - ms["layers"] - ms["lm_head"]
    return ms


def product_bytes(model) -> dict[str, int]:
    """Bytes each product streams a step: its packed weights over every layer, and the LM head's."""
    from kernels.cpu_linear import reordered

    weights = model._native_args.packed_weights()  # the one-op forward's arguments (after a forward)
    layers = range(0, len(weights), WEIGHTS_PER_LAYER)
    out = {name: sum(weights[first + at].nbytes for first in layers) for name, at in PRODUCTS.items()}
    out["lm_head"] = reordered(model.lm_head.weight).nbytes
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.step_phases", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes (sequences per step)")
    ap.add_argument("--context", type=int, default=300, help="tokens already cached per sequence")
    ap.add_argument("--steps", default=",".join(STEPS), help="of decode, chain (K=5), tree (10 nodes)")
    ap.add_argument("--reps", type=int, default=200, help="steps timed per case")
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=engine_choices("kv_cache_dtype"),
                    help="the KV cache's dtype (auto: the model's)")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        ap.error(f"--batch {args.batch!r}: expected comma-separated integers such as 1,16")
    steps = args.steps.split(",")
    if bad := [s for s in steps if s not in STEPS]:
        ap.error(f"--steps {','.join(bad)}: expected decode, chain or tree")
    if min(batches) < 1 or args.context < 1 or args.reps < 1:
        ap.error("--batch sizes, --context and --reps must be at least 1")
    from benchmarks.op_count import StepRunner, native_cpu_model
    from kernels import cpu_native as cn

    if args.threads:
        torch.set_num_threads(args.threads)
    model, kv_dtype = native_cpu_model(ap, args.model, args.kv_cache_dtype)
    cpu = torch.device("cpu")
    print(f"{args.model}, {torch.get_num_threads()} threads, {kv_dtype or model.dtype} KV cache, context "
          f"{args.context}; ms per step, mean of {args.reps}")
    times, rates = [], []
    for b in batches:
        runner = StepRunner(model, b, args.context, cpu, kv_dtype=kv_dtype)
        for kind in steps:
            ms = step_phases(runner.step(kind), args.reps)
            nbytes = product_bytes(model)
            times.append([str(b), kind, f"{ms['wall']:.2f}", f"{ms['layers']:.2f}"]
                         + [f"{ms[p]:.3f}" for p in cn.PHASES] + [f"{ms['lm_head']:.3f}", f"{ms['rest']:.3f}"])
            rates.append([str(b), kind] + [f"{nbytes[p] / 1e6:.1f} MB, {nbytes[p] / ms[p] / 1e6:.1f}"
                                           for p in (*PRODUCTS, "lm_head")])
            print(" | ".join(times[-1]), flush=True)
    print(md_table(["batch", "step", "wall", "decoder_layers", *cn.PHASES, "LM head", "outside the ops"], times))
    print()
    print("The products' weights per step and their rate (GB/s):")
    print(md_table(["batch", "step", *PRODUCTS, "LM head"], rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
