"""The device's paged-attention kernel (Triton on CUDA, the native C++ kernel on CPU) timed against
the pure-torch reference backend and against ``F.scaled_dot_product_attention`` on dense K/V of the
same shape (issue 25):

    python -m benchmarks.attention_bench [--device cuda|cpu] [--contexts 512,4096,16384] [--batches 1,16,64]
                                         [--tree 64] [--prefill 1000] [--shape 8b|smollm2]

Attention shape per layer: Llama-3-8B's (32 query heads, 8 KV heads, head_dim 128; bf16 on CUDA,
fp32 on CPU) or SmolLM2-135M's (9, 3, 64; ``--shape smollm2``), KV blocks of 16 shuffled through the
pool. Decode: one query token per sequence at each context and batch; tree: a token tree of
``--tree`` nodes verified by one sequence at context 4,096; prefill: one sequence's causal prompt of
``--prefill`` tokens. The dense SDPA reads K/V already gathered (the cost a paged kernel must
approach, not a way to serve). Times: median of CUDA-event timed graph replays where the call can be
captured, else of launches (wall clock on CPU)."""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

from actors.tree import TokenTree
from benchmarks.report import md_table

H, KVH, D, BS = 32, 8, 128, 16
SHAPES = {"8b": (32, 8, 128), "smollm2": (9, 3, 64)}


def _timed(fn, device: torch.device, reps: int, graph: bool = True) -> float:
    """Median seconds of one call. On CUDA with ``graph`` the call is replayed from a CUDA graph (how
    the engine runs it: no host launch cost in the figure); the torch reference reads lengths on
    the host, cannot be captured, and is timed launch by launch (graph=False)."""
    from benchmarks.step_costs import device_median_s

    for _ in range(3):
        fn()
    run = fn
    if device.type == "cuda" and graph:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    return device_median_s(run, device, reps)


def bushy_tree_mask(n: int) -> torch.Tensor:
    """[n, n] ancestor mask of an n-node tree whose node i hangs under (i - 1) // 3 (three children each)."""
    tree = TokenTree.root(0)
    for i in range(1, n):
        tree.add((i - 1) // 3, i)
    return tree.ancestor_mask()


def case(batch: int, context: int, q_per_seq: int, window: torch.Tensor | None, device: torch.device,
         dtype: torch.dtype, seed: int = 0):
    """Random paged K/V for ``batch`` sequences of ``context`` keys (the new tokens' included) and q."""
    from actors.model.batch import ForwardBatch

    per_seq = -(-context // BS)
    num_blocks = batch * per_seq + 1
    g = torch.Generator().manual_seed(seed)
    tables = torch.randperm(num_blocks - 1, generator=g)[: batch * per_seq].view(batch, per_seq) + 1
    k = torch.randn(num_blocks, BS, KVH, D, generator=g).to(device, dtype)
    v = torch.randn(num_blocks, BS, KVH, D, generator=g).to(device, dtype)
    q = torch.randn(batch * q_per_seq, H, D, generator=g).to(device, dtype)
    i64 = dict(dtype=torch.int64, device=device)
    fb = ForwardBatch(input_ids=torch.zeros(batch * q_per_seq, **i64), positions=torch.zeros(batch * q_per_seq, **i64),
                      slot_mapping=torch.zeros(batch * q_per_seq, **i64),
                      query_start_loc=torch.arange(0, batch * q_per_seq + 1, q_per_seq, **i64),
                      kv_lens=torch.full((batch,), context, **i64), block_tables=tables.to(device), block_size=BS,
                      window_masks=[None if window is None else window.to(device)] * batch)
    dense_k = k[tables.to(device)].reshape(batch, per_seq * BS, KVH, D)[:, :context].transpose(1, 2)
    dense_v = v[tables.to(device)].reshape(batch, per_seq * BS, KVH, D)[:, :context].transpose(1, 2)
    return q, k, v, fb, dense_k.contiguous(), dense_v.contiguous()


def kernel(device: torch.device):
    """(name, the backend function) of the device's paged-attention kernel."""
    from actors.model import attention_backends as ab

    if device.type == "cuda":
        return "triton", ab.triton_paged_attention
    return "native", ab.native_paged_attention


def parse_segments(text: str) -> list[int]:
    """``--segments`` ("1,4,16"; empty: none) -> the split-K counts; ValueError naming the first that is
    not a power of two."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    bad = next((x for x in parts if not x.isdigit() or int(x) < 1 or int(x) & (int(x) - 1)), None)
    if bad is not None:
        raise ValueError(f"--segments {text!r}: {bad} is not a power of two (give comma-separated powers of two, "
                         "e.g. 1,4,16)")
    return [int(x) for x in parts]


def split_times(q, k, v, fb, scale: float, segments: list[int], device: torch.device, reps: int) -> dict:
    """The Triton kernel on one case with each split-K count in ``segments`` forced -> {"heuristic":
    the count the backend chooses, "times": {count: median seconds}}."""
    from actors.model.attention_backends import triton_meta
    from kernels import triton_attention as ta

    tree, chosen, (qsl, kv_lens, tables) = triton_meta(q, k, fb)
    times = {s: _timed(lambda s=s: ta.paged_attention(q, k, v, qsl, kv_lens, tables, scale, tree=tree, num_segments=s),
                       device, reps) for s in segments}
    return {"heuristic": chosen, "times": times}


def measure(batch: int, context: int, tree: int | None, device: torch.device, reps: int,
            prefill: bool = False, segments: list[int] = ()) -> dict:
    """One case: ``tree`` nodes (None: one decode token; with ``prefill``, ``context`` causal queries);
    ``segments``: also the Triton kernel at each of these split-K counts (split_times)."""
    from actors.model.attention import paged_attention

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    window = bushy_tree_mask(tree) if tree else None
    qn = context if prefill else (tree or 1)
    q, k, v, fb, dk, dv = case(batch, context, qn, window, device, dtype)
    scale = D ** -0.5
    qd = q.view(batch, qn, H, D).transpose(1, 2)  # [B, H, q, D]
    mask = None
    if window is not None:  # dense form: every context key visible, the tree's own window by ancestry
        mask = torch.ones(qn, context, dtype=torch.bool, device=device)
        mask[:, context - qn:] = window.to(device)
    name, attend = kernel(device)
    out = {"batch": batch, "context": context, "queries": qn, "kernel": name}
    fb.cache.clear()
    out["kernel_s"] = _timed(lambda: attend(q, k, v, fb, scale), device, reps)
    out["torch_ref_s"] = _timed(lambda: paged_attention(q, k, v, fb, scale), device, reps, graph=False)
    out["sdpa_dense_s"] = _timed(lambda: F.scaled_dot_product_attention(qd, dk, dv, attn_mask=mask, scale=scale,
                                                                        is_causal=prefill, enable_gqa=True),
                                 device, reps)
    out["kv_bytes"] = 2 * batch * context * KVH * D * torch.finfo(dtype).bits // 8
    if segments:
        out["split"] = split_times(q, k, v, fb, scale, list(segments), device, reps)
    return out


def table(rows: list[dict]) -> str:
    name = rows[0]["kernel"] if rows else "kernel"
    head = ["batch", "context", "queries/seq", name, "torch reference", "SDPA dense", f"{name} / SDPA",
            f"{name} / torch reference", f"{name} K/V read GB/s"]
    us = lambda seconds: f"{seconds * 1e6:.0f} us"  # noqa: E731
    return md_table(head, [[str(r["batch"]), str(r["context"]), str(r["queries"]), us(r["kernel_s"]),
                            us(r["torch_ref_s"]), us(r["sdpa_dense_s"]), f"{r['kernel_s'] / r['sdpa_dense_s']:.2f}x",
                            f"{r['kernel_s'] / r['torch_ref_s']:.2f}x", f"{r['kv_bytes'] / r['kernel_s'] / 1e9:.0f}"]
                           for r in rows])


def split_table(rows: list[dict]) -> str:
    """The Triton kernel's time per forced split-K count (the backend's own choice starred, the
    fastest in bold) and how the choice compares with the fastest."""
    counts = sorted({s for r in rows for s in r["split"]["times"]})
    out = []
    for r in rows:
        times, chosen = r["split"]["times"], r["split"]["heuristic"]
        best = min(times, key=times.get)
        cells = [("**{:.0f} us**" if s == best else "{:.0f} us").format(times[s] * 1e6) + (" *" if s == chosen else "")
                 if s in times else "-" for s in counts]
        ratio = f"{times[chosen] / times[best]:.2f}x" if chosen in times else f"S={chosen} not timed"
        out.append([str(r["batch"]), str(r["context"]), str(r["queries"]), str(chosen), *cells, ratio])
    return md_table(["batch", "context", "queries/seq", "backend's S", *[f"S={s}" for s in counts],
                     "backend's S / fastest"], out)


def main(argv: list[str] | None = None) -> int:
    global H, KVH, D
    ap = argparse.ArgumentParser(prog="python -m benchmarks.attention_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--contexts", default="512,4096,16384")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--tree", type=int, default=64, help="nodes of the verified tree (batch 1, context 4096); 0: none")
    ap.add_argument("--prefill", type=int, default=0, help="also one causal prompt of this many tokens; 0: none")
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES), help="heads, KV heads, head dim of a layer")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--segments", default="",
                    help="also time the Triton kernel at each of these split-K counts (powers of two, e.g. 1,4,16,64) "
                         "beside the backend's own choice (CUDA, or TRITON_INTERPRET=1 on CPU)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    H, KVH, D = SHAPES[args.shape]
    try:
        segments = parse_segments(args.segments)
    except ValueError as e:
        ap.error(str(e))
    if segments and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error(f"--segments times the Triton kernel: it needs CUDA or TRITON_INTERPRET=1 (device {device})")
    if device.type == "cpu":
        from kernels import cpu_native

        if not cpu_native.load():
            ap.error(f"the native CPU kernels cannot be built here: {cpu_native.unavailable_reason()}")
    rows = [measure(b, c, None, device, args.reps, segments=segments) for c in map(int, args.contexts.split(","))
            for b in map(int, args.batches.split(","))]
    if args.tree:
        rows.append(measure(1, 4096, args.tree, device, args.reps, segments=segments))
    if args.prefill:
        rows.append(measure(1, args.prefill, None, device, args.reps, prefill=True, segments=segments))
    print(f"## Paged attention ({args.shape} shape): {rows[0]['kernel']} vs the torch reference vs dense SDPA\n\n"
          + table(rows))
    if segments:
        print("\n## Split-K: the Triton kernel per number of key segments S (* the backend's choice, fastest in "
              "bold)\n\n" + split_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
