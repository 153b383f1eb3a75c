"""`specray` command line. Bad input: one line on stderr naming the value, exit code 2."""
from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError

EXIT_BAD_INPUT = 2


class BadInput(Exception):
    pass


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    from cluster.config import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, local HF dir or .gguf file")
    p.add_argument("--draft", default="none", help="none | ngram | layerskip:N | default (prompt lookup where the "
                   "text repeats, the model's committed EAGLE head elsewhere) | eagle (that head alone) | eagle:PATH "
                   "(an EAGLE head file) | default:PATH (prompt lookup, then that head file) | path of a draft model")
    p.add_argument("--spec-tokens", type=int, default=5, help="K: draft tokens per step (chain)")
    p.add_argument("--tree", default=None, help="expansion config, e.g. 1,1,3,1,1 (replaces the chain)")
    p.add_argument("--tree-width", type=int, default=None, metavar="W",
                   help="EAGLE drafts (--draft default/eagle): a dynamic tree keeping the W likeliest candidates per "
                        "depth, up to W x K nodes; 1 = a chain (default: 3, with --tree-nodes 10; other drafts: 1)")
    p.add_argument("--tree-nodes", type=int, default=None, metavar="N",
                   help="with a tree width > 1: verify at most N draft nodes of each dynamic tree, the likeliest "
                        "(default: 10 for the default width, else W x K)")
    p.add_argument("--fixed-spec", action="store_true",
                   help="always draft the full K / tree (default: adapt each sequence's depth, 0..K, to measured "
                        "acceptance and draft/verify cost)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--attention-backend", default="auto", choices=("auto", "torch", "triton"),
                   help="attention kernels: triton (paged KV read in place) or torch; auto = triton on CUDA")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="recompute every prompt (benchmarks that must not reuse earlier runs' prompts)")
    p.add_argument("--draft-overlap", type=int, default=1, metavar="N",
                   help="micro-batches per step so drafter workers overlap verification (with --ray --drafters)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specray", description="LLM serving with speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts (one continuous batch)")
    g.add_argument("prompts", nargs="*", help="prompt texts")
    _add_engine_args(g)
    _add_sampling_args(g)
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--prompts-file", default=None, help="JSONL with `prompt` or `messages`, optional `max_tokens`")
    g.add_argument("--concurrency", type=int, default=None, help="at most C prompts in flight (default all)")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    g.add_argument("--ray", action="store_true", help="run through Ray actors (local instance, or RAY_ADDRESS)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel verifier shards (with --ray)")
    g.add_argument("--drafters", type=int, default=0, help="drafter worker actors (with --ray)")
    g.add_argument("--allow-no-spec", action="store_true", help="serve without speculation if the drafter fails to load")
    from benchmarks.runner import add_bench_parser
    from benchmarks.tune import add_tune_parser

    add_bench_parser(sub)
    add_tune_parser(sub)
    from cluster.serve_cli import add_serve_parser

    add_serve_parser(sub)
    return parser


def engine_config_from_args(args):
    from cluster.config import EngineConfig, SpeculativeConfig

    spec = SpeculativeConfig.from_draft_arg(args.draft, args.spec_tokens, args.tree,
                                            adaptive=not getattr(args, "fixed_spec", False),
                                            tree_width=getattr(args, "tree_width", None),
                                            tree_nodes=getattr(args, "tree_nodes", None))
    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.num_kv_blocks,
        block_size=args.block_size, num_threads=args.threads, speculative=spec,
        enable_prefix_caching=not getattr(args, "no_prefix_caching", False),
        draft_overlap_micro_batches=args.draft_overlap,
        attention_backend=getattr(args, "attention_backend", "auto"),
    )


def sampling_params_from_args(args, **override):
    from actors.sampling_params import SamplingParams

    fields = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                  max_tokens=args.max_tokens, stop=args.stop or ())
    fields.update(override)
    return SamplingParams(**fields)


def read_prompts_file(path: str) -> list[dict]:
    """Lines with `prompt` (str) or `messages` (chat), optional `max_tokens`."""
    items = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        raise BadInput(f"--prompts-file {path!r}: {e.strerror}") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not ({"prompt", "messages"} & obj.keys()):
            raise BadInput(f"{path}:{n}: each line needs a 'prompt' or a 'messages' field")
        items.append(obj)
    if not items:
        raise BadInput(f"--prompts-file {path!r} holds no prompts")
    return items


def cmd_generate(args) -> int:
    engine_cfg = engine_config_from_args(args)
    items = [{"prompt": p} for p in args.prompts]
    if args.prompts_file:
        items += read_prompts_file(args.prompts_file)
    if not items:
        raise BadInput("no prompts: pass prompt texts or --prompts-file FILE.jsonl")
    if args.concurrency is not None and args.concurrency < 1:
        raise BadInput(f"--concurrency {args.concurrency}: must be at least 1")
    params = [sampling_params_from_args(args, **({"max_tokens": it["max_tokens"]} if "max_tokens" in it else {}))
              for it in items]
    prompts = [it.get("messages") or it["prompt"] for it in items]

    outs = _generate_ray(args, engine_cfg, prompts, params) if args.ray else \
        _generate_local(args, engine_cfg, prompts, params)
    for out in outs:
        if args.json:
            d = out.to_dict()
            d["token_ids"] = list(d["token_ids"])
            print(json.dumps(d, ensure_ascii=False), flush=True)
        else:
            print(out.text, flush=True)
    return 0


def _generate_local(args, engine_cfg, prompts, params):
    from cluster.engine import LLMEngine

    engine = LLMEngine(engine_cfg)
    for p in prompts:  # every prompt is checked before any is served
        engine.prompts.check_length(engine.prompts.encode(p, args.chat), engine.max_model_len,
                                    engine.model_config.vocab_size)
    return engine.generate(prompts, params, chat=args.chat, concurrency=args.concurrency)


def _generate_ray(args, engine_cfg, prompts, params):
    import ray

    from cluster.prompts import PromptEncoder
    from cluster.replica import RayOptions, RayReplicaClient, connect_or_start_ray, load_model_meta
    from cluster.topology import validate_tp

    for name in ("tp", "drafters"):
        if getattr(args, name) < (1 if name == "tp" else 0):
            raise BadInput(f"--{name} {getattr(args, name)}: must be at least {1 if name == 'tp' else 0}")
    meta = load_model_meta(engine_cfg.model)
    validate_tp(meta.config, args.tp, engine_cfg.model)
    enc = PromptEncoder(meta.tokenizer)
    for p in prompts:  # every prompt is checked before any actor starts
        enc.check_length(enc.encode(p, args.chat), meta.config.max_position_embeddings, meta.config.vocab_size)
    started = connect_or_start_ray()
    try:
        client = RayReplicaClient(engine_cfg, RayOptions(tp=args.tp, drafters=args.drafters,
                                                         allow_no_spec=args.allow_no_spec))
        try:
            return client.generate_all(prompts, params, args.chat, args.concurrency)
        finally:
            client.shutdown()
    finally:
        if started:
            ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from benchmarks.runner import cmd_bench
        from benchmarks.tune import cmd_tune
        from cluster.serve_cli import cmd_serve

        commands = {"generate": cmd_generate, "bench": cmd_bench, "tune": cmd_tune, "serve": cmd_serve}
        return commands[args.command](args)
    except ValidationError as e:
        from cluster.config import format_validation_error

        print(f"specray: error: {format_validation_error(e)}", file=sys.stderr)
    except (BadInput, ValueError) as e:
        print(f"specray: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
