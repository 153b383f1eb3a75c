"""Memory-bandwidth roofline of this machine for a model: how many decode steps per second reading
every weight once allows, and what that means in tokens/s for a given tokens-per-step.

    python -m benchmarks.roofline [--model smollm2-135m] [--threads 2] [--tpot-ms 38.6] [--tokens-per-step 1,2,3]

Bandwidth is measured four ways on a buffer far larger than the caches (a copy, a sum, a matrix
times a vector through ``torch.mv`` and through the engine's own product ``kernels.cpu_linear``,
each the best of ``--reps``); the roofline uses the faster mat-vec, which is what a decode step
does. Weight bytes are the model's parameters (tied embeddings counted once) as the engine's CPU
products stream them (``--dtype streamed``, the default: the default model's Q4_1/Q8_0 blocks, 96 MB)
or in ``--dtype``. Over quantized blocks a step is also bound by the arithmetic of rebuilding each
weight (``python -m benchmarks.cpu_linear`` measures both), so the bandwidth bound is not reachable.
With ``--tpot-ms`` it also prints where a measured TPOT stands against the bound.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import torch

DTYPES = {"streamed": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _best_seconds(fn, reps: int) -> float:
    fn()  # warm-up: page faults, thread pool
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bandwidth(mbytes: int = 512, reps: int = 5) -> dict[str, float]:
    """GB/s of copy (read + write counted), sum and fp32 mat-vec (torch's and the engine's) over
    ``mbytes`` MB."""
    from kernels.cpu_linear import linear

    n = mbytes * 2**20 // 4
    a = torch.rand(n)
    b = torch.empty_like(a)
    cols = 4096
    m = a[: n // cols * cols].view(-1, cols)
    v = torch.rand(cols)
    size = a.numel() * 4
    return {
        "copy": 2 * size / _best_seconds(lambda: b.copy_(a), reps) / 1e9,
        "sum": size / _best_seconds(lambda: a.sum(), reps) / 1e9,
        "matvec": m.numel() * 4 / _best_seconds(lambda: m @ v, reps) / 1e9,
        "engine_matvec": m.numel() * 4 / _best_seconds(lambda: linear(v[None], m), reps) / 1e9,
    }


def weight_bytes(model: str, dtype: torch.dtype | None) -> int:
    """Bytes of the model's parameters in ``dtype``; None: as the engine's CPU products stream them
    (a GGUF model's own quantized blocks where they are bound: actors/model/gguf_weights.py)."""
    from actors.model.loader import load_model
    from kernels import cpu_linear

    params = list(load_model(model).model.parameters())  # parameters() yields a tied tensor once
    if dtype is not None:
        return sum(p.numel() for p in params) * torch.finfo(dtype).bits // 8

    def streamed(p: torch.Tensor) -> int:
        t = cpu_linear.reordered(p) if p.dim() == 2 and cpu_linear.packs(p) else p
        return t.numel() * t.element_size()

    return sum(streamed(p) for p in params)


@dataclass(frozen=True)
class Roofline:
    """The bound a weight-streaming decode step obeys: one pass over the weights per step."""
    bandwidth_gbs: float  # GB/s (1e9 bytes) the weights stream at
    weight_bytes: int

    @property
    def steps_per_s(self) -> float:
        return self.bandwidth_gbs * 1e9 / self.weight_bytes

    @property
    def ms_per_step(self) -> float:
        return 1e3 / self.steps_per_s

    def tokens_per_s(self, tokens_per_step: float) -> float:
        """The bound on tokens/s at ``tokens_per_step`` tokens emitted per verified step."""
        return self.steps_per_s * tokens_per_step

    def percent_of_bound(self, tpot_ms: float) -> float:
        """How close a measured plain-decoding TPOT comes to the bound (100 = at the bound)."""
        return 100 * self.ms_per_step / tpot_ms


def roofline(bandwidth: dict[str, float], weight_bytes: int) -> Roofline:
    """The bound from ``measure_bandwidth``'s figures: the faster of the two mat-vecs, which is what
    a decode step does."""
    return Roofline(max(bandwidth["matvec"], bandwidth["engine_matvec"]), weight_bytes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.roofline", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="streamed", choices=sorted(DTYPES),
                    help="weight bytes: as the CPU products stream them (streamed: a GGUF model's own blocks), "
                         "or every parameter in this dtype")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--mbytes", type=int, default=512, help="size of the measured buffer")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tpot-ms", type=float, default=None, help="a measured plain-decoding TPOT to place")
    ap.add_argument("--tokens-per-step", default="1,2,3", help="comma-separated tokens per verified step")
    args = ap.parse_args(argv)
    try:
        per_step = [float(x) for x in args.tokens_per_step.split(",")]
    except ValueError:
        ap.error(f"--tokens-per-step {args.tokens_per_step!r}: expected comma-separated numbers")
    if args.mbytes < 64:
        ap.error(f"--mbytes {args.mbytes}: use at least 64 (the buffer must not fit in the caches)")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    bw = measure_bandwidth(args.mbytes, args.reps)
    wb = weight_bytes(args.model, DTYPES[args.dtype])
    bound = roofline(bw, wb)
    print(f"threads {torch.get_num_threads()}: copy {bw['copy']:.1f} GB/s, sum {bw['sum']:.1f} GB/s, "
          f"mat-vec {bw['matvec']:.1f} GB/s (torch.mv), {bw['engine_matvec']:.1f} GB/s (kernels.cpu_linear)")
    print(f"{args.model} weights in {args.dtype}: {wb / 1e6:.0f} MB -> roofline {bound.steps_per_s:.1f} steps/s "
          f"({bound.ms_per_step:.1f} ms per step)")
    for k in per_step:
        print(f"  {k:g} tokens per step: {bound.tokens_per_s(k):.1f} tokens/s")
    if args.tpot_ms is not None:
        print(f"measured TPOT {args.tpot_ms:.1f} ms = {bound.percent_of_bound(args.tpot_ms):.0f}% "
              "of the bandwidth bound")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
