"""`specray` command line. Bad input: one line on stderr naming the value, exit code 2."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys

from pydantic import ValidationError

EXIT_BAD_INPUT = 2


class BadInput(Exception):
    pass


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags (model, draft, speculation shape, batch and KV sizes, device): every command
    that builds an engine takes them (generate, serve, the batch job)."""
    from cluster.config import DEFAULT_MODEL, engine_choices

    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, local HF dir or .gguf file")
    p.add_argument("--draft", default="none", help="none | ngram | layerskip:N | default (prompt lookup where the "
                   "text repeats, the model's committed EAGLE head elsewhere) | eagle (that head alone) | eagle:PATH "
                   "(an EAGLE head file) | default:PATH (prompt lookup, then that head file) | default-chain (default with lookup "
                   "drafting K-token chains instead of filling the head's node budget) | path of a draft model")
    p.add_argument("--spec-tokens", type=int, default=5, help="K: draft tokens per step (chain)")
    p.add_argument("--tree", default=None, help="expansion config, e.g. 1,1,3,1,1 (replaces the chain)")
    p.add_argument("--tree-width", type=int, default=None, metavar="W",
                   help="EAGLE drafts (--draft default/eagle): a dynamic tree keeping the W likeliest candidates per "
                        "depth, up to W x K nodes; 1 = a chain (default: 3, with --tree-nodes 10; other drafts: 1)")
    p.add_argument("--tree-nodes", type=int, default=None, metavar="N",
                   help="with a tree width > 1: verify at most N draft nodes of each dynamic tree, the likeliest "
                        "(default: 10 for the default width, else W x K)")
    p.add_argument("--sampled-siblings", type=int, default=None, metavar="S",
                   help="EAGLE drafts with a tree width > 1: distinct draws at the first depth of an unseeded sampled "
                        "request's chain, at most W (default: W on a GPU, 1 on the CPU, where each verified row costs "
                        "~10%% of a decode step)")
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
    p.add_argument("--attention-backend", default="auto", choices=engine_choices("attention_backend"),
                   help="attention and fused ops: triton (CUDA), native (C++ CPU kernels) or torch (reference); "
                        "auto = triton on CUDA, native on CPU for float32 models")
    p.add_argument("--kv-cache-dtype", default="auto", choices=engine_choices("kv_cache_dtype"),
                   help="the KV cache's dtype (auto: the model's); bfloat16 under a float32 model on CPU halves "
                        "what decode attention reads and doubles the blocks per GB, but changes the logits")
    p.add_argument("--cpu-activations", default="auto", choices=engine_choices("cpu_activations"),
                   help="CPU products over a GGUF model's blocks: int16 (auto's default, SPECRAY_CPU_ACTIVATIONS), "
                        "int8 (faster verification, logits further from the fp32 model's) or float32 (its bits)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="CUDA: run every step eagerly instead of replaying CUDA graphs of the decode/verify buckets")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="recompute every prompt (benchmarks that must not reuse earlier runs' prompts)")
    p.add_argument("--kv-host-gb", type=float, default=None, metavar="G",
                   help="host KV tier of G GiB: prefix-cache blocks the device pool evicts are kept in host memory "
                        "and loaded back on a prefix hit instead of recomputed (default/0: off)")
    p.add_argument("--kv-disk-dir", default=None, metavar="D",
                   help="disk KV tier in directory D (one engine per directory): blocks the host tier overflows "
                        "go to a preallocated file there and are loaded back on a prefix hit (needs --kv-host-gb "
                        "and --kv-disk-gb)")
    p.add_argument("--kv-disk-gb", type=float, default=None, metavar="G", help="size of the disk KV tier in GiB")
    p.add_argument("--kv-tier-gb", type=float, default=None, metavar="G",
                   help="shared KV tier of G GiB across replicas (a Ray actor over the object store): prompt blocks "
                        "one replica computes are fetched by the others instead of recomputed (default: off)")
    p.add_argument("--kv-preemption", default="auto", metavar="MODE",
                   help="a preempted request's KV: swap (to the host tier and back; needs --kv-host-gb), recompute, "
                        "or auto (default: swap when the host tier has room and copying is measured cheaper)")
    p.add_argument("--offload-layers", type=int, default=0, metavar="N",
                   help="keep the last N decoder layers' weights in host memory and stream them in per forward "
                        "(a model larger than the device; speculation amortises the transfer; default 0: none)")
    p.add_argument("--weights-device-gb", type=float, default=None, metavar="G",
                   help="offload as many layers as needed for the weights to fit G GiB of device memory "
                        "(instead of --offload-layers)")
    p.add_argument("--draft-overlap", type=int, default=1, metavar="N",
                   help="micro-batches per step so drafter workers overlap verification (with --ray --drafters)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below this fraction of the most probable token's probability (0 = off)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specray", description="LLM serving with speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts (one continuous batch)")
    g.add_argument("prompts", nargs="*", help="prompt texts")
    add_engine_args(g)
    _add_sampling_args(g)
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--prompts-file", default=None,
                   help="JSONL with `prompt` or `messages`, optional `max_tokens`, `prediction` (text the answer "
                        "is expected to repeat: a draft source for lookup) and `response_format`")
    g.add_argument("--response-format", default=None, metavar="JSON",
                   help='structured output for every prompt, an OpenAI response_format object, e.g. '
                        '\'{"type": "json_object"}\' or {"type": "json_schema", "json_schema": {"name": ..., '
                        '"schema": ...}} (also regex, grammar, choice); a prompts-file line\'s own wins')
    g.add_argument("--concurrency", type=int, default=None, help="at most C prompts in flight (default all)")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    g.add_argument("--ray", action="store_true", help="run through Ray actors (local instance, or RAY_ADDRESS)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel verifier shards (with --ray)")
    g.add_argument("--drafters", type=int, default=0, help="drafter worker actors (with --ray)")
    g.add_argument("--allow-no-spec", action="store_true", help="serve without speculation if the drafter fails to load")
    g.set_defaults(func=cmd_generate)
    _add_plugin_commands(sub)
    from cluster.serve_cli import add_serve_parser

    add_serve_parser(sub)
    return parser


# Packages beside the serving code that add subcommands with ``register(subparsers)`` when installed.
PLUGIN_COMMANDS = ("benchmarks.cli",)  # specray bench, specray tune


def _add_plugin_commands(sub) -> None:
    for name in PLUGIN_COMMANDS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its package is not installed
            found = False
        if found:
            importlib.import_module(name).register(sub)


def engine_config_from_args(args):
    from cluster.config import EngineConfig, SpeculativeConfig

    spec = SpeculativeConfig.from_draft_arg(args.draft, args.spec_tokens, args.tree,
                                            adaptive=not getattr(args, "fixed_spec", False),
                                            tree_width=getattr(args, "tree_width", None),
                                            tree_nodes=getattr(args, "tree_nodes", None),
                                            sampled_siblings=getattr(args, "sampled_siblings", None))
    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.num_kv_blocks,
        block_size=args.block_size, num_threads=args.threads, speculative=spec,
        enable_prefix_caching=not getattr(args, "no_prefix_caching", False),
        draft_overlap_micro_batches=args.draft_overlap,
        attention_backend=getattr(args, "attention_backend", "auto"),
        kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
        cpu_activations=getattr(args, "cpu_activations", "auto"),
        enforce_eager=getattr(args, "enforce_eager", False),
        kv_offload={"host_gb": getattr(args, "kv_host_gb", None), "disk_dir": getattr(args, "kv_disk_dir", None),
                    "disk_gb": getattr(args, "kv_disk_gb", None),
                    "preemption": getattr(args, "kv_preemption", "auto")},
        kv_tier=_kv_tier_from_args(args),
        offload={"layers": getattr(args, "offload_layers", 0) or 0,
                 "weights_device_gb": getattr(args, "weights_device_gb", None)},
    )


def _kv_tier_from_args(args) -> dict:
    gb = getattr(args, "kv_tier_gb", None)
    return {} if gb is None or gb == 0 else {"enabled": True, "capacity_gb": gb}  # 0: off, < 0: named error


SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop")  # --max-tokens: the default of each prompt


def engine_requests(args, lines: list):
    """One engine request per prompt line (``cluster.prompt_file.PromptLine``: its messages, else its
    text; optional ``max_tokens``, ``prediction`` and ``response_format``), the sampling flags (and
    ``--response-format``) applying to all; RequestError (a ValueError) names the first bad value."""
    from cluster.request import RequestError, engine_request, is_chat, structured_output

    flags = {name: getattr(args, name) for name in SAMPLING_FLAGS}
    fmt = getattr(args, "response_format", None)
    if fmt is not None:
        try:
            fmt = json.loads(fmt)
        except json.JSONDecodeError as e:
            raise RequestError(f"--response-format {fmt!r}: not valid JSON ({e})", "response_format") from None
    out = []
    for line in lines:
        prompt = {"messages" if is_chat(line.prompt) else "prompt": line.prompt}
        own = {"max_tokens": line.fields.get("max_tokens"), "prediction": line.fields.get("prediction")}
        line_fmt = line.fields.get("response_format", fmt)
        own["structured"] = None if line_fmt is None else structured_output(line_fmt)
        out.append(engine_request({**flags, **prompt, **own}, args.max_tokens))
    return out


def cmd_generate(args) -> int:
    from cluster.prompt_file import PromptLine, read_prompt_file

    engine_cfg = engine_config_from_args(args)
    items = [PromptLine(0, {"prompt": p}) for p in args.prompts]
    if args.prompts_file:
        items += read_prompt_file(args.prompts_file, "--prompts-file")
    if not items:
        raise BadInput("no prompts: pass prompt texts or --prompts-file FILE.jsonl")
    if args.concurrency is not None and args.concurrency < 1:
        raise BadInput(f"--concurrency {args.concurrency}: must be at least 1")
    requests = engine_requests(args, items)
    prompts, params = [r.prompt for r in requests], [r.params for r in requests]

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
        return args.func(args)
    except ValidationError as e:
        from cluster.validation import format_validation_error

        print(f"specray: error: {format_validation_error(e)}", file=sys.stderr)
    except (BadInput, ValueError) as e:
        print(f"specray: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
