"""How fast one pass over a decoder's weights is per row count, ``F.linear`` against
``kernels.cpu_linear.linear`` (oneDNN over reordered weights): the measurement behind that module.

    python -m benchmarks.cpu_linear [--threads 2] [--reps 9] [--rows 1,2,4,8,16,32,64] [--dtype float32]
                                    [--layers 30 --hidden 576 ...] [--quantized]

Random weights of the default model's shapes (fused qkv, o, fused gate_up, down per layer, then the
LM head), far larger than the caches together, as in a decode step. Prints the median ms of a pass
and the GB/s of weights it streams, for each row count (decode batch, or tokens verified at once).
``--quantized``: the native product over fp32 tiles against the same product over GGUF blocks (Q4_1,
a Q8_0 LM head: what the default model runs, kernels/gguf_blocks.py).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.options import parse_int_list
from kernels.cpu_linear import linear


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
    p.add_argument("--rows", default="1,2,4,6,8,12,16,32,64,256")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--q-size", type=int, default=576)
    p.add_argument("--kv-size", type=int, default=192)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--quantized", action="store_true",
                   help="also the native product over GGUF blocks of the same shapes (Q4_1 matrices, a Q8_0 "
                        "LM head, as the default model ships): the product a GGUF model runs")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.quantized:
        return quantized(a)
    dtype = getattr(torch, a.dtype)
    shapes = weight_shapes(a.layers, a.hidden, a.intermediate, a.q_size, a.kv_size, a.vocab)
    weights = [torch.randn(o, i, dtype=dtype) for o, i in shapes]
    mbytes = sum(w.numel() * w.element_size() for w in weights) / 1e6
    print(f"{len(weights)} matrices, {mbytes:.0f} MB {a.dtype}, {a.threads} threads, median of {a.reps}")
    print("\n| rows | F.linear ms | GB/s | cpu_linear ms | GB/s | cpu_linear / F.linear |\n|---|---|---|---|---|---|")
    with torch.inference_mode():
        for rows in parse_int_list("--rows", a.rows):
            xs = {i: torch.randn(rows, i, dtype=dtype) for i in {i for _, i in shapes}}
            base = median_ms(lambda: [F.linear(xs[w.shape[1]], w) for w in weights], a.reps)
            ours = median_ms(lambda: [linear(xs[w.shape[1]], w) for w in weights], a.reps)
            print(f"| {rows} | {base:.1f} | {mbytes / base:.1f} | {ours:.1f} | {mbytes / ours:.1f} | {ours / base:.2f} |")



def quantized(a) -> None:
    """fp32 packed tiles against GGUF blocks of the same random weights (the blocks' dequantization):
    the same bits, fewer bytes, more arithmetic per weight."""
    from kernels import cpu_native, gguf_blocks

    if a.dtype != "float32" or not cpu_native.load():
        raise SystemExit("--quantized compares float32 products on the native CPU kernels")
    shapes = weight_shapes(a.layers, a.hidden, a.intermediate, a.q_size, a.kv_size, a.vocab)
    gen = torch.Generator().manual_seed(0)
    mats = []
    for i, (o, k) in enumerate(shapes):
        kind = "Q8_0" if i == len(shapes) - 1 else "Q4_1"
        kb = k // gguf_blocks.BLOCK_K
        d = (torch.rand(o, kb, generator=gen) * 0.01).half()
        if kind == "Q8_0":
            b = gguf_blocks.QBlocks(kind, d, None, torch.randint(-128, 128, (o, k), generator=gen, dtype=torch.int8))
        else:
            b = gguf_blocks.QBlocks(kind, d, (-torch.rand(o, kb, generator=gen) * 0.1).half(),
                                    torch.randint(0, 16, (o, k), generator=gen, dtype=torch.uint8))
        mats.append((o, cpu_native.pack_linear(gguf_blocks.dequantize(b)), gguf_blocks.pack(b)))
    mb = {name: sum(m[j].numel() * m[j].element_size() for m in mats) / 1e6 for j, name in ((1, "fp32"), (2, "q"))}
    print(f"{len(mats)} matrices: {mb['fp32']:.0f} MB fp32 tiles, {mb['q']:.0f} MB GGUF blocks (Q4_1, LM head Q8_0), "
          f"{a.threads} threads, median of {a.reps}")
    print("\n| rows | fp32 tiles ms | GB/s | GGUF blocks ms | GB/s | blocks / fp32 |\n|---|---|---|---|---|---|")
    with torch.inference_mode():
        for rows in parse_int_list("--rows", a.rows):
            xs = {i: torch.randn(rows, i) for i in {i for _, i in shapes}}
            dense = median_ms(lambda: [cpu_native.linear(xs[f.shape[1]], f, o) for o, f, _ in mats], a.reps)
            quant = median_ms(lambda: [cpu_native.linear(xs[q.shape[1] * 32], q, o) for o, _, q in mats], a.reps)
            print(f"| {rows} | {dense:.1f} | {mb['fp32'] / dense:.1f} | {quant:.1f} | {mb['q'] / quant:.1f} | "
                  f"{quant / dense:.2f} |")

if __name__ == "__main__":
    main()
