"""How fast one pass over a decoder's weights is for 1 to ``MAX_ROWS`` (12) rows, per way of doing
the products: the measurement behind ``kernels.cpu_linear.PLAN``.

    python -m benchmarks.cpu_linear [--threads 2] [--reps 9] [--layers 30 --hidden 576 ...]

Random fp32 weights of the default model's shapes (fused qkv, o, fused gate_up, down per layer,
then the LM head), far larger than the caches together, as in a decode step. Prints the median ms
of a pass for ``F.linear`` with M rows, for one ``W @ x^T`` product of each width, and for the
plan's products, with the GB/s each reaches.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kernels.cpu_linear import MAX_ROWS, linear


def weight_shapes(layers: int, hidden: int, intermediate: int, q_size: int, kv_size: int,
                  vocab: int) -> list[tuple[int, int]]:
    """(out, in) of every matrix a decode step multiplies by, in order."""
    per_layer = [(q_size + 2 * kv_size, hidden), (hidden, q_size), (2 * intermediate, hidden), (hidden, intermediate)]
    return per_layer * layers + [(vocab, hidden)]


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_linear", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--q-size", type=int, default=576)
    p.add_argument("--kv-size", type=int, default=192)
    p.add_argument("--vocab", type=int, default=49152)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    shapes = weight_shapes(a.layers, a.hidden, a.intermediate, a.q_size, a.kv_size, a.vocab)
    weights = [torch.randn(o, i) for o, i in shapes]
    mbytes = sum(w.numel() for w in weights) * 4 / 1e6
    print(f"{len(weights)} matrices, {mbytes:.0f} MB fp32, {a.threads} threads, median of {a.reps}")

    def inputs(rows: int) -> dict[int, torch.Tensor]:
        return {i: torch.randn(rows, i) for i in {i for _, i in shapes}}

    def row(label: str, ms: float) -> str:
        return f"| {label} | {ms:.1f} | {mbytes / ms:.1f} |"

    print("\n| product | ms per pass | GB/s |\n|---|---|---|")
    for width in range(1, MAX_ROWS + 1):
        xs = inputs(width)
        print(row(f"W @ x^T, {width} columns", median_ms(lambda: [torch.mm(w, xs[w.shape[1]].t()) for w in weights], a.reps)))
    print("\n| rows | F.linear ms | plan ms | plan / F.linear |\n|---|---|---|---|")
    for rows in range(1, MAX_ROWS + 1):
        xs = inputs(rows)
        base = median_ms(lambda: [F.linear(xs[w.shape[1]], w) for w in weights], a.reps)
        plan = median_ms(lambda: [linear(xs[w.shape[1]], w) for w in weights], a.reps)
        print(f"| {rows} | {base:.1f} | {plan:.1f} | {plan / base:.2f} |")


if __name__ == "__main__":
    main()
