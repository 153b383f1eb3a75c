"""One layer's paged attention for batches of mixed shapes: one padded call for the whole batch
against one call per group of similar sequences (``actors.model.attention.group_sequences``).

    python -m benchmarks.attention_groups [--threads 2] [--reps 5] [--dtype float32]

The default model's attention shape (9 query heads, 3 KV heads, head_dim 64). Each case is a
batch the scheduler forms in serving: decoding sequences with a prefill chunk among them,
decoding sequences of varied context, verification rows (K + 1 = 6) beside plain decoding.
Prints the median ms per layer both ways and the number of groups; then, for fresh prompts
(prefill from position 0), a dense causal mask against SDPA's own causal kernel (what
``paged_attention`` runs for them).
"""
from __future__ import annotations

import argparse
import dataclasses
import random

import numpy as np
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


def prompt_cases(scale: int = 1) -> dict[str, list[int]]:
    """name -> prompt lengths of a batch of fresh prompts (query length = context length)."""
    s = lambda xs: [max(2, x // scale) for x in xs]  # noqa: E731
    return {"one 1,000-token prompt": s([1000]), "one 300-token prompt": s([300]),
            "4 prompts of 150-800 tokens": s([800, 520, 300, 150])}


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


def _masked(group_meta):
    """attention._group_meta with the causal kernel replaced by the dense mask it saves."""
    def wrapped(block_size, tables, seqs, q_lens, kv_lens, windows, device):
        m = group_meta(block_size, tables, seqs, q_lens, kv_lens, windows, device)
        if not m.causal:
            return m
        ql, kl = (np.array([x[i] for i in seqs]) for x in (q_lens, kv_lens))
        mask = attention._dense_mask(ql, kl, m.max_q, int(kl.max()), [None] * len(seqs))
        return dataclasses.replace(m, mask=torch.from_numpy(mask).to(device), host_mask=mask, causal=False,
                                   folded={}, gathered={})
    return wrapped


def layer_ms(q_lens: list[int], kv_lens: list[int], dtype: torch.dtype, reps: int, grouped: bool,
             heads: tuple[int, int, int] = (9, 3, 64), causal: bool = True) -> float:
    h, kvh, d = heads
    batch, blocks = make_batch(q_lens, kv_lens)
    k, v = attention.allocate_kv_cache(1, blocks, BLOCK, kvh, d, dtype)[0]
    k.normal_(), v.normal_()
    q = torch.randn(sum(q_lens), h, d, dtype=dtype)
    group, group_meta = attention.group_sequences, attention._group_meta
    if not grouped:  # the previous behaviour: the whole batch as one padded call
        attention.group_sequences = lambda qs, kvs: [list(range(len(qs)))]
    if not causal:  # the previous behaviour for fresh prompts: a dense causal mask
        attention._group_meta = _masked(group_meta)
    try:
        return median_ms(lambda: attention.paged_attention(q, k, v, batch, d ** -0.5), reps)
    finally:
        attention.group_sequences, attention._group_meta = group, group_meta


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
    print("\n| fresh prompts | dense causal mask ms | causal kernel ms | speedup |\n|---|---|---|---|")
    for name, lens in prompt_cases(a.scale).items():
        masked, causal = (layer_ms(lens, lens, dtype, a.reps, True, causal=c) for c in (False, True))
        print(f"| {name} | {masked:.2f} | {causal:.2f} | {masked / causal:.1f}x |")


if __name__ == "__main__":
    main()
