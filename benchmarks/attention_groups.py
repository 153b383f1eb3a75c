"""One layer's paged attention for batches of mixed shapes: one padded call for the whole batch
against one call per group of similar sequences (``actors.model.attention.group_sequences``).

    python -m benchmarks.attention_groups [--threads 2] [--reps 5] [--dtype float32]

The default model's attention shape (9 query heads, 3 KV heads, head_dim 64). Each case is a
batch the scheduler forms in serving: decoding sequences with a prefill chunk among them,
decoding sequences of varied context, verification rows (K + 1 = 6) beside plain decoding.
Prints the median ms per layer both ways and the number of groups.
"""
from __future__ import annotations

import argparse
import random

import torch

from actors.model import attention
from actors.model.batch import ForwardBatch
from benchmarks.cpu_linear import median_ms

BLOCK = 16


def cases(scale: int = 1) -> dict[str, tuple[list[int], list[int]]]:
    """name -> (query lengths, context lengths after the step); ``scale`` divides every length."""
    r = random.Random(0)
    s = lambda xs: [max(1, x // scale) for x in xs]  # noqa: E731
    return {
        "64 decoding + one 1,000-token prefill chunk": (s([1] * 63 + [1000]), s([200] * 63 + [1000])),
        "64 decoding, contexts 100-1,500": (s([1] * 64), s([r.randint(100, 1500) for _ in range(64)])),
        "16 verifying K=5, contexts 300-600": (s([6] * 16), s([r.randint(300, 600) for _ in range(16)])),
        "8 verifying + 8 decoding, contexts 300-600": (s([6] * 8 + [1] * 8), s([r.randint(300, 600) for _ in range(16)])),
        "1 decoding, context 500": (s([1]), s([500])),
    }


def make_batch(q_lens: list[int], kv_lens: list[int]) -> tuple[ForwardBatch, int]:
    """A batch whose sequences own consecutive blocks; returns it and the number of blocks."""
    tables, first = [], 0
    for kv in kv_lens:
        nb = -(-kv // BLOCK)
        tables.append(list(range(first, first + nb)))
        first += nb
    width = max(map(len, tables))
    i64 = dict(dtype=torch.int64)
    n = sum(q_lens)
    qsl = torch.tensor([0] + q_lens, **i64).cumsum(0)
    batch = ForwardBatch(torch.zeros(n, **i64), torch.zeros(n, **i64), torch.zeros(n, **i64), qsl,
                         torch.tensor(kv_lens, **i64), torch.tensor([t + [0] * (width - len(t)) for t in tables], **i64),
                         BLOCK, [None] * len(q_lens))
    return batch, first


def layer_ms(q_lens: list[int], kv_lens: list[int], dtype: torch.dtype, reps: int, grouped: bool,
             heads: tuple[int, int, int] = (9, 3, 64)) -> float:
    h, kvh, d = heads
    batch, blocks = make_batch(q_lens, kv_lens)
    k, v = attention.allocate_kv_cache(1, blocks, BLOCK, kvh, d, dtype)[0]
    k.normal_(), v.normal_()
    q = torch.randn(sum(q_lens), h, d, dtype=dtype)
    group = attention.group_sequences
    if not grouped:  # the previous behaviour: the whole batch as one padded call
        attention.group_sequences = lambda qs, kvs: [list(range(len(qs)))]
    try:
        return median_ms(lambda: attention.paged_attention(q, k, v, batch, d ** -0.5), reps)
    finally:
        attention.group_sequences = group


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.attention_groups", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--scale", type=int, default=1, help="divide every length (smoke runs)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    print(f"one layer, {a.dtype}, {a.threads} threads, median of {a.reps}\n")
    print("| batch | one padded call ms | grouped ms | groups | speedup |\n|---|---|---|---|---|")
    for name, (q, kv) in cases(a.scale).items():
        one, grouped = (layer_ms(q, kv, dtype, a.reps, g) for g in (False, True))
        print(f"| {name} | {one:.2f} | {grouped:.2f} | {len(attention.group_sequences(q, kv))} | {one / grouped:.1f}x |")


if __name__ == "__main__":
    main()
