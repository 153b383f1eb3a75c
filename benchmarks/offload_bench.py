"""Weight offload's SpecInfer curve, on the Verifier directly (no engine, so ``random:<shape>`` will do):

    python -m benchmarks.offload_bench --model random:llama-3-8b --offload-layers 16 --device cuda --out DIR
        [--weights-device-gb G] [--tokens 1,16,32,64] [--context 512] [--reps 10]

For the model resident (0 layers offloaded) and with each ``--offload-layers N`` (and the N that
``--weights-device-gb G`` implies: ``layers_to_offload``), the time of one forward carrying q tokens
of one sequence after ``--context`` committed ones: q = 1 is a plain decode step (tokens/s = 1/t);
q > 1 verifies a token tree of q nodes (root included; each node sees its ancestors: the tree's
ancestor mask as the window mask, as the engine verifies), whose tokens per forward depend on what
the draft gets accepted, so its row is the time per forward (tokens/s = accepted+1 per forward
x forwards/s). With layers streamed, a forward's time barely grows with q (SpecInfer): that is
what lets tree verification amortise the transfer. Each offloaded row also gives the bytes streamed
per forward (``WeightOffloader.stats()``) and the host->device rate they imply (bytes / forward
time: a lower bound on the link's, as the forward's compute is inside it), beside a measured
host->device copy of one layer (pinned on CUDA) and the floor it puts on an offloaded forward.

Timing is ``step_costs.device_median_s`` (CUDA events; the clock on CPU) around
``step_costs.OneSequence.verify`` (which reads the argmax back: one sync per forward), after
warm-up forwards of the same shape. On CUDA the resident model is measured eagerly and with CUDA
graphs (``step_costs.verifier_modes``); offloaded forwards run eagerly (the offload hooks decide
what to copy, which a graph replay would skip). Each configuration gets a fresh model
(``random:`` ones are built on the device; offloading then moves the streamed matrices to host
memory).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

from actors.tree import TokenTree
from benchmarks.report import fmt, md_table
from benchmarks.step_costs import OneSequence, device_median_s, verifier_modes

DEFAULT_TOKENS = (1, 16, 32, 64)
TREE_BRANCHING = (4, 2, 2, 2)  # children per node at depth 0, 1, ...; 1 (a chain) deeper: bushy near the root
GIB = 2**30


def verify_tree(q: int, root: int, vocab: int) -> TokenTree:
    """A tree of ``q`` nodes, root included, grown breadth first with TREE_BRANCHING children per
    node (q=1: the root alone, a plain decode step; 16: depth 3; 64: depth 5)."""
    if q < 1:
        raise ValueError(f"a verify tree needs at least its root: q={q}")
    tree, frontier = TokenTree.root(root), [(0, 0)]  # (node, depth), breadth first
    while tree.size < q:
        node, depth = frontier.pop(0)
        for _ in range(TREE_BRANCHING[depth] if depth < len(TREE_BRANCHING) else 1):
            if tree.size == q:
                break
            frontier.append((tree.add(node, (root + tree.size) % vocab), depth + 1))
    return tree


def measure_h2d_s(device: torch.device, nbytes: int, reps: int) -> float:
    """Median seconds of one host->device copy of ``nbytes`` from pinned memory (CUDA; on CPU a
    plain host copy: what the offloader does there)."""
    cuda = device.type == "cuda"
    src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=cuda)  # warm-up
    seconds = device_median_s(lambda: dst.copy_(src, non_blocking=cuda), device, reps)
    del src, dst
    return seconds


def measure_config(model, device: torch.device, dtype: torch.dtype, offload: int, mode: str, verifier_kw: dict,
                   tokens: list[int], context: int, reps: int, warmup: int = 2) -> list[dict]:
    """One Verifier over ``model`` (``offload`` layers streamed): per q, the median forward time
    and the bytes streamed per forward."""
    seq = OneSequence(model, device, dtype, context + max(tokens) + 1, offload_layers=offload, **verifier_kw)
    seq.prefill(context)
    w = seq.verifier.weight_offload
    rows = []
    for q in tokens:
        tree = verify_tree(q, seq.last, seq.vocab)
        for _ in range(warmup):
            seq.verify(tree)
        before = w.bytes_copied if w is not None else 0
        seconds = device_median_s(lambda t=tree: seq.verify(t), device, reps)
        streamed = (w.bytes_copied - before) / reps if w is not None else 0
        rows.append(dict(offloaded=offload, mode=mode, q=q, depth=tree.max_depth, forward_s=seconds,
                         streamed_bytes=streamed))
    del seq
    return rows


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _configs(spec: str, device: torch.device, dtype: torch.dtype, layers: list[int], budget_gb: float | None):
    """(offloaded layers, a fresh model) per configuration, resident first, then each of ``layers``
    and the N that ``budget_gb`` implies (computed on the first model: a bad budget fails at once)."""
    from actors.model.loader import load_model
    from actors.model.weight_offload import layers_to_offload

    model = load_model(spec, dtype=dtype, device=device).model
    wanted = [0, *layers]
    if budget_gb is not None and (n := layers_to_offload(model, budget_gb)) not in wanted:
        wanted.append(n)
    for i, n in enumerate(wanted):
        if i:
            model = load_model(spec, dtype=dtype, device=device).model
        yield n, model
        del model
        _free(device)


def run(spec: str, device: torch.device, layers: list[int], tokens: list[int], context: int, reps: int,
        weights_device_gb: float | None = None) -> dict:
    """Every configuration's rows, the host->device copy of one layer and each one's device weights."""
    from actors.model.attention_backends import set_attention_backend
    from actors.model.weight_offload import device_weight_bytes, layer_weight_bytes

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    rows, configs, doc = [], [], {"model": spec, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                                  "context": context, "reps": reps, "tokens": tokens}
    for n, model in _configs(spec, device, dtype, layers, weights_device_gb):
        backend = set_attention_backend(model, "auto", device)
        total, per_layer = model.param_bytes(), layer_weight_bytes(model.layers[0])
        on_device = device_weight_bytes(model, n)  # before the Verifier offloads the model
        if "h2d_s" not in doc:
            doc.update(layer_bytes=per_layer, num_layers=len(model.layers), weight_bytes=total, backend=backend,
                       h2d_s=measure_h2d_s(device, per_layer, reps))
        modes = verifier_modes(device) if n == 0 else [("eager", {"enforce_eager": True})]
        for mode, kw in modes:
            rows += measure_config(model, device, dtype, n, mode, kw, tokens, context, reps)
            _free(device)
        configs.append(dict(offloaded=n, device_bytes=on_device, host_bytes=n * per_layer,
                            budget_gb=weights_device_gb if n not in [0, *layers] else None))
        del model  # before the next one loads: one 8B model on the device at a time
    doc.update(rows=rows, configs=configs, h2d_bandwidth=doc["layer_bytes"] / doc["h2d_s"])
    add_ratios(rows)
    return doc


def add_ratios(rows: list[dict]) -> None:
    """vs_q1: against the same configuration's q=1 forward; vs_resident: against the fastest resident
    forward of the same q."""
    q1 = {(r["offloaded"], r["mode"]): r["forward_s"] for r in rows if r["q"] == 1}
    resident: dict[int, float] = {}
    for r in rows:
        if r["offloaded"] == 0:
            resident[r["q"]] = min(resident.get(r["q"], r["forward_s"]), r["forward_s"])
    for r in rows:
        base = q1.get((r["offloaded"], r["mode"]))
        r["vs_q1"] = r["forward_s"] / base if base else None
        r["vs_resident"] = r["forward_s"] / resident[r["q"]] if r["q"] in resident else None


HEAD = ["layers offloaded", "mode", "q (tree nodes)", "tree depth", "ms per forward", "vs q=1", "vs resident",
        "tokens/s", "MB streamed per forward", "implied H2D GB/s"]


def table_rows(doc: dict) -> list[list[str]]:
    out = []
    for r in doc["rows"]:
        t = r["forward_s"]
        tps = f"{1 / t:.1f}" if r["q"] == 1 else f"(acc.+1) x {1 / t:.1f}"
        streamed = r["streamed_bytes"]
        out.append([str(r["offloaded"]), r["mode"], str(r["q"]), str(r["depth"]), f"{t * 1e3:.3g}",
                    fmt(r["vs_q1"], "{:.2f}x"), fmt(r["vs_resident"], "{:.2f}x"), tps,
                    f"{streamed / 1e6:.4g}" if streamed else "-", f"{streamed / t / 1e9:.3g}" if streamed else "-"])
    return out


def notes(doc: dict) -> list[str]:
    """What the table's configurations are, and the measured host->device copy."""
    out = [f"{doc['model']}, {doc['dtype']} on {doc['device']} (attention {doc['backend']}), {doc['num_layers']} "
           f"decoder layers of {doc['layer_bytes'] / 1e6:.4g} MB of matrices each, {doc['weight_bytes'] / GIB:.3g} "
           f"GiB of weights; one sequence, context {doc['context']}; median of {doc['reps']} forwards "
           "(step_costs.device_median_s) after 2 warm-up forwards per shape"]
    for c in doc["configs"]:
        if c["offloaded"]:
            why = f" (what --weights-device-gb {c['budget_gb']:g} implies)" if c["budget_gb"] is not None else ""
            out.append(f"{c['offloaded']} layers offloaded{why}: {c['device_bytes'] / GIB:.3g} GiB of weights on "
                       f"the device (2 staging layers included), {c['host_bytes'] / GIB:.3g} GiB streamed from "
                       "host memory every forward")
    pinned = "pinned " if doc["device"].startswith("cuda") else ""
    out.append(f"host->device copy of one layer ({pinned}host memory): {doc['h2d_bandwidth'] / 1e9:.3g} GB/s "
               f"({doc['h2d_s'] * 1e3:.3g} ms): an offloaded forward takes at least its streamed bytes / this")
    out.append("tokens/s: q=1 is plain decoding (1 / time); a tree's tokens per forward are the accepted "
               "ones + 1, which depend on the draft; implied H2D = bytes streamed / forward time (compute "
               "included, so a lower bound on the copy rate)")
    return out


def markdown(doc: dict) -> str:
    return "".join(f"- {n}\n" for n in notes(doc)) + "\n" + md_table(HEAD, table_rows(doc)) + "\n"


# ---------------------------------------------------------------- the engine, offloaded (gpu_bench's offload stage)

WIDE_TREE = (8, 4, 32)  # K, width, node cap: a deeper, wider dynamic tree than the default (5, 3, 10)


def engine_parts(model: str, layers: int, device: torch.device, prompts, max_tokens: int,
                 kv_cache_gb: float | None) -> list:
    """The default model with its last ``layers`` decoder layers offloaded, c=1, greedy, through the
    bench machinery: parts returning (bench rows, peer dicts), most important first: plain vs
    ``--draft default`` (K=5 and adaptive, its default dynamic tree); the same with WIDE_TREE;
    transformers with accelerate's CPU offload of the same layers on the same prompts. The model
    loads in the first part (one backend, one offloaded verifier for every run)."""
    from benchmarks.peers import accelerate_offload_peer
    from benchmarks.results import run_row
    from benchmarks.sweep import iter_runs, plan_groups

    backend = []

    def runs(groups) -> tuple[list[dict], list[dict]]:
        if not backend:
            from benchmarks.engine_bench import EngineBackend

            options = {"device": str(device), "kv_cache_gb": kv_cache_gb, "offload": {"layers": layers}}
            backend.append(EngineBackend(model, max_tokens, 0, 1, options))
        return [run_row(r) for r in iter_runs(backend[0], groups, prompts, [0.0], [1])], []

    k, width, nodes = WIDE_TREE
    return [lambda: runs(plan_groups(["default"], [5], None, adaptive=True)),
            lambda: runs(plan_groups(["default"], [k], None, adaptive=True, tree_widths=(width,),
                                     tree_nodes=(nodes,))[1:]),  # [0] is plain, measured already
            lambda: ([], [accelerate_offload_peer(model, prompts, max_tokens, layers, device).to_dict()])]


def goal_rows(curve: dict | None, rows: list[dict], peers: list[dict]) -> list[list[str]]:
    """Issue 27's weight-offload goals against what was measured (rows missing what did not run)."""
    out = []
    if curve is not None:
        off = [r for r in curve["rows"] if r["offloaded"] and r["q"] > 1 and r["vs_q1"] is not None]
        if off:
            n = off[0]["offloaded"]
            ratios = ", ".join(f"q={r['q']}: {r['vs_q1']:.2f}x" for r in off if r["offloaded"] == n)
            out.append([f"verify a tree vs a 1-token forward, {curve['model']} with {n} layers offloaded", ratios,
                        "about 1x (SpecInfer: a forward costs one stream of the weights)"])
    plain = next((r for r in rows if r["method"] == "none"), None)
    spec = max((r for r in rows if r["method"] != "none" and r["tokens_per_s"]), default=None,
               key=lambda r: r["tokens_per_s"])
    if plain and spec and plain["tokens_per_s"]:
        out.append([f"--draft default ({spec['spec']}) vs plain, both offloaded, c=1",
                    f"{spec['tokens_per_s'] / plain['tokens_per_s']:.2f}x", ">= 3x"])
    peer = next((p for p in peers if p["peer"] == "transformers.accelerate_offload" and p["tokens_per_s"]), None)
    if spec and peer:
        out.append([f"--draft default ({spec['spec']}) vs transformers + accelerate CPU offload",
                    f"{spec['tokens_per_s'] / peer['tokens_per_s']:.2f}x", ">= 5x"])
    return out


GOAL_HEAD = ["goal (issue 27)", "measured", "target"]
CURVE_SPECS = {"cuda": "random:llama-3-8b", "cpu": "random:tiny-8l"}  # the stage offloads half their layers


def stage_parts(args, device: torch.device) -> tuple[dict, list, list[str]]:
    """gpu_bench's offload stage: (where the curve's document lands, the parts, the notes). Parts:
    the curve of CURVE_SPECS with half its layers offloaded, then ``engine_parts`` for the default
    model with half its layers offloaded (none, with a note, when the model is missing)."""
    from actors.model import registry

    spec = CURVE_SPECS["cuda" if device.type == "cuda" else "cpu"]
    half, curve, notes = registry.random_config(spec).num_layers // 2, {}, []

    def curve_part():
        curve["doc"] = run(spec, device, [half], list(DEFAULT_TOKENS), args.context, args.reps)
        return [], []

    model = registry.DEFAULT_MODEL
    try:
        registry.resolve_alias(model)
    except ValueError as e:
        return curve, [curve_part], [f"{model} missing ({e}): no engine rows"]
    from actors.model.config import ModelConfig
    from actors.model.loader import resolve_model_dir
    from benchmarks.options import select_prompts

    path, prompts = select_prompts(None, args.sample, 0)
    layers = ModelConfig.from_dir(resolve_model_dir(model)).num_layers // 2
    notes.append(f"engine rows: {model} with {layers} of its {2 * layers} decoder layers offloaded, on {device}; "
                 f"prompts: {path.name}, stratified sample (seed 0) of {len(prompts)}; max tokens {args.max_tokens}; "
                 "greedy, c=1; the peer: batch 1 on the same prompts; specray / peer: specray none (offloaded)")
    kv_gb = args.kv_cache_gb if device.type == "cuda" else None
    return curve, [curve_part, *engine_parts(model, layers, device, prompts, args.max_tokens, kv_gb)], notes


def stage_markdown(curve: dict | None, engine_table: str | None, goals: list[list[str]]) -> str:
    """The stage's tables: the curve, the engine rows, the goals (each when present)."""
    tables = []
    if curve is not None:
        tables.append(f"### The SpecInfer curve: {curve['model']}\n\n{markdown(curve)}")
    if engine_table is not None:
        tables.append(f"### The default model, half its layers offloaded, c=1\n\n{engine_table}\n")
    if goals:
        tables.append(f"### Issue 27's weight-offload goals\n\n{md_table(GOAL_HEAD, goals)}\n")
    return "\n".join(tables) or md_table(["stage", "status"], [["offload", "no part finished"]])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.offload_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny", help="random:<shape>, an alias or a local model")
    ap.add_argument("--offload-layers", default="", metavar="N[,N2]",
                    help="layers to offload, one configuration each (the resident model is always measured)")
    ap.add_argument("--weights-device-gb", type=float, default=None, metavar="G",
                    help="also the configuration whose weights fit G GiB of device memory (layers_to_offload)")
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), metavar="Q1,Q2,...",
                    help="tokens per forward: 1 = a decode step, more = a token tree of that many nodes (<= 64)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--context", type=int, default=512, help="committed tokens before the measured forwards")
    ap.add_argument("--reps", type=int, default=10, help="timed forwards per shape")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--out", type=Path, default=None, metavar="DIR", help="writes offload_bench.md and .json")
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked before anything is loaded (ValueError naming the bad value)."""
    from benchmarks.options import parse_int_list

    args = build_parser().parse_args(argv)
    args.layers = parse_int_list("--offload-layers", args.offload_layers) if args.offload_layers else []
    args.token_list = parse_int_list("--tokens", args.tokens)
    if max(args.token_list) > 64:
        raise ValueError(f"--tokens {args.tokens!r}: at most 64 tokens per forward (a tree's node cap)")
    if not args.layers and args.weights_device_gb is None:
        raise ValueError("give --offload-layers N[,N2] and/or --weights-device-gb G: nothing would be offloaded")
    if args.weights_device_gb is not None and not args.weights_device_gb > 0:
        raise ValueError(f"--weights-device-gb {args.weights_device_gb}: must be above 0")
    for flag in ("context", "reps"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"offload_bench: error: {e}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads or torch.get_num_threads())
    try:
        doc = run(args.model, device, args.layers, args.token_list, args.context, args.reps, args.weights_device_gb)
    except ValueError as e:  # an unknown model, too many layers, a budget below what must stay on the device
        print(f"offload_bench: error: {e}", file=sys.stderr)
        return 2
    md = markdown(doc)
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "offload_bench.md").write_text(md, encoding="utf-8")
        (args.out / "offload_bench.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
