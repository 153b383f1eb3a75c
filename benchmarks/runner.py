"""`specray bench`: the sweep over methods x K x temperature x concurrency on a prompt set, in
process (every engine on the same loaded weights) or against an OpenAI-compatible ``--url``, with
per-category figures, optional transformers peers, and JSON + Markdown + PNG output.

tokens/s = output tokens of the whole set / wall time of the whole set (prompts served as one
continuous batch, at most ``concurrency`` in flight); speedups are against the no-speculation
baseline measured in the same run at the same concurrency and temperature.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.options import (DEFAULT_MAX_K, add_common_args, check_counts, check_tree, engine_options,
                                parse_float_list, parse_int_list, parse_methods, parse_spec_tokens, sampling_seed,
                                select_prompt_sets)
from benchmarks.results import add_speedups, run_row
from benchmarks.sweep import iter_runs, plan_groups


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="measure speedup per method, K, temperature and concurrency")
    add_common_args(b, concurrency="1,8", spec_tokens="5")
    b.add_argument("--draft", default=None, metavar="M1,M2,...",
                   help="methods: none | ngram | layerskip:N | default (prompt lookup where the text repeats, "
                        "the committed EAGLE head elsewhere) | eagle (that head alone) | eagle:PATH | "
                        "default:PATH (prompt lookup, then that head) | default-chain (lookup as K-token chains) | "
                        "draft model (default: ngram,default); "
                        "the no-speculation baseline is always measured")
    b.add_argument("--temperature", default="0", metavar="T1,T2,...",
                   help="sampling temperatures (seeded unless --unseeded)")
    b.add_argument("--tree-width", default=None, metavar="W1,W2,...",
                   help="for EAGLE methods (default, eagle, eagle:PATH): 1 = chains, W > 1 = dynamic trees keeping "
                        "W candidates per depth (up to W x K nodes); one run per width (default: the engine's, 3)")
    b.add_argument("--tree-nodes", default=None, metavar="N1,N2,...",
                   help="with a tree width W > 1: cap each dynamic tree at N draft nodes (default: 10 with the "
                        "default width, else W x K); one run per width and cap")
    b.add_argument("--url", default=None, help="benchmark an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000")
    b.add_argument("--peers", action="store_true",
                   help="also run transformers' generate: plain, prompt lookup, assisted (draft models)")
    b.add_argument("--out", default=None, metavar="DIR", help="write bench.json, bench.md and PNG plots here")
    b.set_defaults(func=cmd_bench)


def _command(args, methods: list[str], prompts_path: Path) -> str:
    """The run as an explicit command line (defaults spelled out), for the report."""
    parts = ["specray bench", f"--prompts {prompts_path}"]
    parts += [f"--sample {args.sample} --seed {args.seed}"] if args.sample else []
    parts += ["--unseeded"] if args.unseeded else []
    parts += [f"--url {args.url}"] if args.url else [f"--model {args.model}", f"--draft {','.join(methods)}"]
    parts += [f"--concurrency {args.concurrency}", f"--temperature {args.temperature}",
              f"--spec-tokens {args.spec_tokens}", f"--warmup {args.warmup}"]
    parts += [f"--tree {args.tree}"] if args.tree else []
    parts += [f"--tree-width {args.tree_width}"] if args.tree_width else []
    parts += [f"--tree-nodes {args.tree_nodes}"] if args.tree_nodes else []
    parts += [f"--max-tokens {args.max_tokens}"] if args.max_tokens else []
    parts += [f"--threads {args.threads}"] if args.threads else []
    parts += [f"--device {args.device}"] if args.device != "auto" else []
    parts += [f"--dtype {args.dtype}"] if args.dtype != "auto" else []
    parts += [f"--kv-cache-gb {args.kv_cache_gb:g}"] if args.kv_cache_gb else []
    parts += [f"--offload-layers {args.offload_layers}"] if args.offload_layers else []
    parts += ["--warmup-batch"] if args.warmup_batch else []
    parts += ["--peers"] if args.peers else []
    return " ".join(parts)


def _backend(args):
    if args.url:
        from benchmarks.http_bench import HttpBackend

        b = HttpBackend(args.url, args.max_tokens, sampling_seed(args), args.warmup)
        return b, [b.server_model]
    from benchmarks.engine_bench import EngineBackend

    return EngineBackend(args.model, args.max_tokens, sampling_seed(args), args.warmup, engine_options(args),
                         warmup_batch=args.warmup_batch), None


def cmd_bench(args) -> int:
    check_counts(args)
    if args.url and (args.draft or args.tree or args.tree_width or args.tree_nodes or args.dtype != "auto"):
        raise ValueError(f"--url {args.url}: the method and dtype are the server's; "
                         f"drop --draft/--tree/--tree-width/--tree-nodes/--dtype")
    methods = parse_methods(args.draft or "ngram,default")
    concurrency = parse_int_list("--concurrency", args.concurrency)
    temperatures = parse_float_list("--temperature", args.temperature)
    spec_tokens, adaptive = parse_spec_tokens(args.spec_tokens)
    tree = check_tree(args.tree)
    tree_widths = tuple(parse_int_list("--tree-width", args.tree_width)) if args.tree_width else None
    if tree_widths and max(tree_widths) > 8:
        raise ValueError(f"--tree-width {args.tree_width}: at most 8")
    tree_nodes = tuple(parse_int_list("--tree-nodes", args.tree_nodes)) if args.tree_nodes else None
    if args.tree_nodes and tree_widths and max(tree_widths) == 1:
        raise ValueError(f"--tree-nodes {args.tree_nodes} caps dynamic trees: add --tree-width W with W > 1")
    if tree_nodes and max(tree_nodes) > 64:
        raise ValueError(f"--tree-nodes {args.tree_nodes}: at most 64")
    sets = select_prompt_sets(args.prompts, args.sample, args.seed)
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir}: exists and is not a directory")
    backend, server_methods = _backend(args)
    methods = server_methods or methods
    from cluster.config import default_tree_width
    from cluster.runtime import resolve_device_dtype

    width = default_tree_width(resolve_device_dtype(args.device, "auto")[0].type)  # the engine's, on its device
    groups = plan_groups(methods, spec_tokens, tree, adaptive, tree_widths, tree_nodes, width)
    from benchmarks.report import document, markdown

    settings = {"backend": args.url or "in-process", "max_tokens": args.max_tokens or "per prompt",
                "warmup": args.warmup, "seed": args.seed, "sampling": "unseeded" if args.unseeded else "seeded"}
    docs = {}
    for label, prompts_path, prompts in sets:  # several sets: side by side, one section each
        rows = [run_row(r) for r in iter_runs(backend, groups, prompts, temperatures, concurrency)]
        add_speedups(rows)
        peers = _peers(args, prompts, methods, spec_tokens or [DEFAULT_MAX_K], rows) if args.peers else []
        doc = document(rows, prompts_path, prompts, settings, _command(args, methods, prompts_path), peers)
        md = markdown(doc) if len(sets) == 1 else f"# Prompt set `{label}`\n\n" + markdown(doc)
        if out_dir is not None:
            _write(out_dir if len(sets) == 1 else out_dir / label, doc, md, rows)
        docs[label] = doc
        if not args.json:
            sys.stdout.write(md)
            sys.stdout.flush()
    if args.json:
        sys.stdout.write(json.dumps(next(iter(docs.values())) if len(docs) == 1 else {"sets": docs}, indent=2) + "\n")
    return 0


def _peers(args, prompts, methods, spec_tokens, rows) -> list[dict]:
    from benchmarks.compiled_peers import compiled_peers
    from benchmarks.peers import attach_ratios, run_peers
    from cluster.runtime import resolve_device_dtype

    device = resolve_device_dtype(args.device, "auto")[0]
    print(f"# peers: transformers generate (greedy, {device})", file=sys.stderr, flush=True)
    peers = run_peers(args.model, prompts, args.max_tokens, methods, spec_tokens, args.threads, device)
    peers += compiled_peers(args.model, prompts, args.max_tokens, device)  # CUDA only; rows saying so elsewhere
    attach_ratios(peers, rows)
    return [p.to_dict() for p in peers]


def _write(out_dir: Path, doc: dict, md: str, rows: list[dict]) -> None:
    from benchmarks.plots import write_plots

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    (out_dir / "bench.md").write_text(md, encoding="utf-8")
    plots = write_plots(rows, out_dir)
    print(f"# wrote {out_dir / 'bench.json'}, {out_dir / 'bench.md'}, {', '.join(p.name for p in plots)}",
          file=sys.stderr, flush=True)
