"""Torch ops (and, on CUDA, kernel launches) per target step, per decoder layer.

    python -m benchmarks.op_count [--model smollm2-135m] [--device cpu|cuda] [--batch 1,8]
                                  [--context 128] [--threads 2] [--time 20]
                                  [--attention-backend auto|torch|triton|native]

A step is one ``Verifier.forward_logits`` call as the engine makes it: the ForwardBatch built from
host lists, the forward over every token, the LM head on the rows verification needs. For each
batch size B (B sequences, each ``--context`` tokens already in its KV cache) three steps:
``decode`` (one token per sequence), ``chain K=5`` (root + 5 drafts, the ancestor mask the engine
passes) and ``tree 10`` (a 10-node tree of depth 4, see ``TREE_PARENTS``).

Which ops count. ``torch.profiler`` records every call that goes through the dispatcher (``aten::``,
``mkldnn::``, ... namespaces), including the calls an op makes inside itself: ``aten::slice`` calls
``aten::as_strided``, ``F.rms_norm`` on CPU is a composite of ~20 (``pow``, ``mean`` -> ``sum`` +
``div_``, scalar ``to`` conversions, ...). ``all`` counts every such call (the figure issue 25
quotes, ~5,800 per decode step); ``top`` only the ops called from Python code (whose profiler
parent is not itself an op), i.e. what the model code asks for. Views count: each costs Python and
dispatcher time, and on a GPU they are the host work around every launch. ``launches`` (CUDA
only) counts the kernel-launch calls of the CUDA runtime/driver (``cudaLaunchKernel``,
``cuLaunchKernel``, ...) inside each scope; the device-side kernel total is printed beside it.
Counts are deterministic for given shapes and thread count (no timing enters them; a few kernels
call other nested ops when they run on several threads).

Per layer: the ops inside decoder layer i's forward (scoped by wrapping each layer's ``forward`` for
the count only). Layer 0 also builds the attention metadata the other layers reuse (built on first
use, cached in ``batch.cache``), so it is listed apart from layers 1.. ; ``outside`` is the rest of
the step: batch building, embedding, RoPE tables, final norm, LM head.

``--time N`` also times each step unprofiled (median of N, ms); on a shared machine take
before/after figures in one run.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from cluster.config import engine_choices

SCOPE = "specray.layer."
TREE_PARENTS = [-1, 0, 1, 1, 2, 3, 4, 5, 0, 8]  # 10 nodes, depth 4: two branches under the root
CHAIN_K = 5
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")


@dataclass
class StepCount:
    """Ops of one step: totals, per decoder layer, outside the layers, and by op name."""
    all_ops: int  # every dispatcher call, nested ones included
    top_ops: int  # only the ops called from Python
    layer_all: list[int]  # [num_layers] all ops inside layer i
    layer_top: list[int]
    outside_all: int
    by_name: Counter = field(default_factory=Counter)  # op name -> all-ops count
    launches: int | None = None  # CUDA runtime launch calls (None on CPU)
    layer_launches: list[int] | None = None
    device_kernels: int | None = None  # kernels the GPU ran
    graph_launches: int | None = None  # CUDA graph replays among the launches


def _is_op(name: str) -> bool:
    return "::" in name and not name.startswith("profiler::")


@contextmanager
def layer_scopes(model: torch.nn.Module):
    """Wrap each decoder layer's forward in a profiler scope named SCOPE + index (restored after)."""
    for i, layer in enumerate(model.layers):
        def scoped(*args, _fwd=layer.forward, _name=f"{SCOPE}{i}", **kwargs):
            with record_function(_name):
                return _fwd(*args, **kwargs)
        layer.forward = scoped
    try:
        yield
    finally:
        for layer in model.layers:
            del layer.forward  # the instance attribute: the class's forward again


def _layer_of(event) -> int | None:
    while event is not None:
        if event.name.startswith(SCOPE):
            return int(event.name[len(SCOPE):])
        event = event.cpu_parent
    return None


def count_ops(run, model: torch.nn.Module, cuda: bool = False) -> StepCount:
    """Profile one call of ``run()`` (a step over ``model``) and count its ops per layer."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with layer_scopes(model), profile(activities=acts) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    n = len(model.layers)
    c = StepCount(0, 0, [0] * n, [0] * n, 0, launches=0 if cuda else None,
                  layer_launches=[0] * n if cuda else None, device_kernels=0 if cuda else None,
                  graph_launches=0 if cuda else None)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            c.device_kernels += 1
            continue
        layer = _layer_of(e.cpu_parent)
        if cuda and e.name in LAUNCH_CALLS:
            c.launches += 1
            c.graph_launches += e.name == "cudaGraphLaunch"
            if layer is not None:
                c.layer_launches[layer] += 1
        if not _is_op(e.name):
            continue
        top = e.cpu_parent is None or not _is_op(e.cpu_parent.name)
        c.all_ops += 1
        c.top_ops += top
        c.by_name[e.name] += 1
        if layer is None:
            c.outside_all += 1
        else:
            c.layer_all[layer] += 1
            c.layer_top[layer] += top
    return c


# ---------------------------------------------------------------- the steps

class StepRunner:
    """A Verifier over ``model`` with ``batch`` sequences of ``context`` tokens already cached."""

    def __init__(self, model: torch.nn.Module, batch: int, context: int, device: torch.device,
                 block_size: int = 16, kv_dtype: torch.dtype | None = None):
        from actors.verifier import SeqChunk, Verifier

        self.seq_chunk, self.batch, self.context, self.block_size = SeqChunk, batch, context, block_size
        per_seq = -(-(context + len(TREE_PARENTS) + 1) // block_size)
        self.tables = [list(range(b * per_seq, (b + 1) * per_seq)) for b in range(batch)]
        self.verifier = Verifier(model, batch * per_seq, block_size, device, kv_dtype or model.dtype)
        vocab = model.config.vocab_size
        prompts = [[(7 * b + 3 * i + 1) % vocab for i in range(context)] for b in range(batch)]
        self.verifier.forward_logits([self._chunk(b, p, list(range(context)), None)
                                      for b, p in enumerate(prompts)], [])

    def _chunk(self, b: int, tokens: list[int], positions: list[int], mask):
        table = self.tables[b]
        slots = [table[p // self.block_size] * self.block_size + p % self.block_size
                 for p in range(positions[0], positions[0] + len(tokens))]
        return self.seq_chunk(tokens, positions, slots, positions[0] + len(tokens), table, mask)

    def step(self, kind: str):
        """A callable running one step: 'decode', 'chain' (K=5) or 'tree' (TREE_PARENTS)."""
        from actors.tree import TokenTree

        if kind == "decode":
            tree = TokenTree.root(5)
        elif kind == "chain":
            tree = TokenTree.chain(5, list(range(6, 6 + CHAIN_K)))
        elif kind == "tree":
            tree = TokenTree.root(5)
            for i, parent in enumerate(TREE_PARENTS[1:]):
                tree.add(parent, 6 + i)
        else:
            raise ValueError(f"step kind {kind!r} is not one of decode, chain, tree")
        mask = tree.ancestor_mask() if tree.size > 1 else None
        chunks = [self._chunk(b, tree.tokens, tree.positions(self.context), mask) for b in range(self.batch)]
        rows = list(range(self.batch * tree.size))
        return lambda: self.verifier.forward_logits(chunks, rows)


def native_cpu_model(ap: argparse.ArgumentParser, name: str, kv_cache_dtype: str):
    """The model ``name`` on the CPU with the native kernels (``ap.error`` where they cannot be built),
    and the KV cache dtype a ``--kv-cache-dtype`` flag asks for (None: the model's): what the native
    kernels' benchmarks step (``benchmarks.attention_segments``, ``benchmarks.step_phases``)."""
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model
    from kernels import cpu_native as cn

    if not cn.load():
        ap.error(f"the native CPU kernels cannot be used here: {cn.unavailable_reason()}")
    cpu = torch.device("cpu")
    model = load_model(name, device=cpu).model
    set_attention_backend(model, "native", cpu)
    return model, None if kv_cache_dtype == "auto" else getattr(torch, kv_cache_dtype)


STEPS = (("decode", "decode"), ("chain", f"chain K={CHAIN_K}"), ("tree", f"tree {len(TREE_PARENTS)}"))


def _median_ms(fn, reps: int, cuda: bool) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def format_count(label: str, c: StepCount, top_names: int = 8) -> list[str]:
    rest = c.layer_all[1:] or c.layer_all
    per = f"layer 0 {c.layer_all[0]}, layers 1.. {min(rest)}..{max(rest)}" if c.layer_all else "no layers"
    per += f" ({c.layer_top[-1] if c.layer_top else 0} from Python)"
    if any(name.endswith("::decoder_layers") for name in c.by_name):
        per = "every layer in one decoder_layers op (--layer-by-layer counts them one by one)"
    lines = [f"{label}: {c.all_ops} ops ({c.top_ops} called from Python); per layer: {per}; "
             f"outside the layers {c.outside_all}"]
    if c.launches is not None:
        lines.append(f"  CUDA launches {c.launches} (layer {c.layer_launches[-1]} each), "
                     f"device kernels {c.device_kernels}")
    lines.append("  top ops: " + ", ".join(f"{n.split('::')[-1]} {k}" for n, k in c.by_name.most_common(top_names)))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.op_count", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes (sequences per step)")
    ap.add_argument("--context", type=int, default=128, help="tokens already cached per sequence")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--time", type=int, default=0, metavar="N", help="also time each step: median of N")
    ap.add_argument("--attention-backend", default="auto", choices=engine_choices("attention_backend"),
                    help="the model's attention and fused ops, as the engine sets them (auto: as it runs)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=engine_choices("kv_cache_dtype"),
                    help="the KV cache's dtype (auto: the model's; bfloat16 needs the native backend on CPU)")
    ap.add_argument("--layer-by-layer", action="store_true",
                    help="native backend: run the layers one by one (their ops per layer) instead of as one op")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        ap.error(f"--batch {args.batch!r}: expected comma-separated integers such as 1,8")
    if min(batches) < 1 or args.context < 1:
        ap.error("--batch sizes and --context must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is visible here; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model

    device = torch.device(args.device)
    model = load_model(args.model, device=device).model
    backend = set_attention_backend(model, args.attention_backend, device)
    if args.layer_by_layer:
        model.fused_layers = None
    cuda = device.type == "cuda"
    print(f"{args.model} on {args.device} ({model.dtype}, {len(model.layers)} layers, "
          f"{torch.get_num_threads()} threads, {backend} attention), context {args.context}")
    for b in batches:
        runner = StepRunner(model, b, args.context, device,
                            kv_dtype=None if args.kv_cache_dtype == "auto" else getattr(torch, args.kv_cache_dtype))
        for kind, label in STEPS:
            run = runner.step(kind)
            run()  # warm-up: reordered weights, RoPE table growth
            for line in format_count(f"B={b} {label}", count_ops(run, model, cuda)):
                print(line)
            if args.time:
                print(f"  {_median_ms(run, args.time, cuda):.2f} ms per step (median of {args.time})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
