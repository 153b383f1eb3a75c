"""Train the EAGLE head for a target by self-distillation, within a wall-clock budget.

    python -m training.train --out /tmp/eagle/run [--model smollm2-135m] [--minutes 60] [--device cuda]

Stages (each cached under --out, so a re-run resumes after a crash):
1. ``gen``: prompt mix (training.prompt_mix) -> the target's answers via the engine, with their
   features from the engine's own forwards (``--gen-dtype``, default fp32 on the CPU, bf16 on a GPU:
   the native CPU kernels made fp32 the faster one on the 2-core CPU);
   ``text``: offline conversations (training.offline_text), no generation needed;
   ``magpie`` (not in the default stages): conversations the target writes itself, multi-turn,
   translations both ways, long documents (training.magpie), for ``--magpie-frac`` of the budget;
2. ``features``: teacher-forced target forward -> features f_t and greedy next tokens for the
   conversations that have none yet (offline text, the hf backend's answers;
   ``--feature-dtype``, default as ``--gen-dtype``);
3. ``train``: fit the head (training.fit), save ``--out/head.safetensors``.
``--minutes`` is the whole budget: generation stops at ``--gen-frac`` of it, the magpie stage
``--magpie-frac`` later, features ``--feat-frac`` after that, training uses the rest.
On a GPU: ``--device cuda --concurrency 256 --num-prompts 50000`` and a larger budget.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from training.data import SAMPLED, SampledShare

log = logging.getLogger("specray.eagle.train")


def _init_arg(value: str) -> str:
    if value in ("random", "target") or Path(value).is_file():
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is neither 'random', 'target' nor an existing head file")


def _data_dirs(value: str) -> list[str]:
    dirs = [d for d in value.split(",") if d]
    for d in dirs:
        if not (Path(d) / "features").is_dir():
            raise argparse.ArgumentTypeError(f"{d!r} has no features/ directory (run its features stage first)")
    return dirs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="working directory (cached stages, log, head.safetensors)")
    p.add_argument("--model", default="smollm2-135m", help="target: alias, HF dir or .gguf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of the whole run")
    p.add_argument("--gen-frac", type=float, default=0.45,
                   help="share of --minutes for generating answers (the engine's answers come with their features)")
    p.add_argument("--feat-frac", type=float, default=0.1,
                   help="share of --minutes for the features pass over what has none yet: offline text, the hf "
                        "backend's answers (~550 tokens/s on 2 CPU cores)")
    p.add_argument("--magpie-frac", type=float, default=0.0,
                   help="share of --minutes for the magpie stage (give it in --stages too)")
    p.add_argument("--magpie-wave", type=int, default=192, help="conversations per magpie wave (one shard each)")
    p.add_argument("--text-items", type=int, default=6000, help="offline conversations (docstrings, code)")
    p.add_argument("--num-prompts", type=int, default=8000,
                   help="size of the prompt mix (generation stops early at its budget)")
    p.add_argument("--korean-frac", type=float, default=0.0,
                   help="share of the prompt mix written in Korean (training/korean_mix.py)")
    p.add_argument("--concurrency", type=int, default=48, help="answers generated at once")
    p.add_argument("--max-tokens", type=int, default=160, help="longest answer")
    p.add_argument("--sampled-frac", type=float, default=SAMPLED.frac,
                   help="share of the answers sampled rather than greedy (the head then sees the contexts that "
                        "sampled requests produce)")
    p.add_argument("--sample-temperature", type=float, default=SAMPLED.temperature,
                   help="temperature of the sampled answers")
    p.add_argument("--sample-top-p", type=float, default=SAMPLED.top_p, help="top-p of the sampled answers")
    p.add_argument("--backend", default="engine", choices=["engine", "hf"],
                   help="who runs the gen and features stages: our engine (default), or transformers' padded "
                        "batches (hf: --concurrency answers per generate call; the faster one on a GPU before "
                        "the engine had CUDA graphs: README, Training)")
    p.add_argument("--kv-cache-gb", type=float, default=2.0,
                   help="KV cache of the generating engine (raise it with --concurrency on a GPU)")
    p.add_argument("--max-batched-tokens", type=int, default=1024,
                   help="tokens per generation step (prefill chunks; raise it on a GPU)")
    p.add_argument("--gen-dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"],
                   help="auto: float32 on the CPU (faster there than bf16 with the native kernels), bf16 on a GPU")
    p.add_argument("--feature-dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"],
                   help="dtype of the teacher-forced pass (auto: as --gen-dtype's)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="rows of the head's reduced LM head")
    p.add_argument("--unroll", type=int, default=3, help="draft steps unrolled in training (1 = teacher forcing only)")
    p.add_argument("--init", default="random", type=_init_arg,
                   help="head start: random (default; measured better: top-1 0.18 vs 0.02 after 25 steps) "
                        "or the target's last layer, or a head file to continue training (it keeps its vocabulary "
                        "unless --revocab)")
    p.add_argument("--revocab", action="store_true",
                   help="with --init FILE: choose the draft vocabulary from this run's data instead of keeping the "
                        "file's (the head's weights do not depend on it: its LM head rows are the target's)")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (AdamW, warm-up then cosine)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per training batch")
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32 (default: bf16 autocast)")
    p.add_argument("--max-steps", type=int, default=None, help="stop training after this many steps (smoke runs)")
    p.add_argument("--max-epochs", type=float, default=4.0,
                   help="stop after this many passes over the data even if time is left (a GPU finishes many "
                        "passes over a small data set and overfits it); 0 = no cap")
    p.add_argument("--data", default="", type=_data_dirs,
                   help="comma-separated working directories of earlier runs whose features the train stage "
                        "also uses (e.g. answers to another prompt-mix seed)")
    p.add_argument("--stages", default="gen,text,features,train",
                   help="comma-separated subset of gen,text,magpie,features,train")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    return p


def _setup_logging(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(name)s %(message)s", "%H:%M:%S")
    root = logging.getLogger("specray")
    root.setLevel(logging.INFO)
    for h in (logging.FileHandler(out / "train.log"), logging.StreamHandler()):
        h.setFormatter(fmt)
        root.addHandler(h)


def _share(args) -> SampledShare:
    return SampledShare(args.sampled_frac, args.sample_temperature, args.sample_top_p)


def _prompt_mix(args, tokenizer) -> list:
    from training.prompt_mix import build_prompt_mix, vocabulary_words

    return build_prompt_mix(args.num_prompts, args.seed, vocabulary_words(tokenizer), korean_frac=args.korean_frac)


def _engine(args):
    """The generating engine: plain decoding at --concurrency, --gen-dtype."""
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    return LLMEngine(EngineConfig(model=args.model, dtype=args.gen_dtype, device=args.device,
                                  max_num_seqs=args.concurrency, max_num_batched_tokens=args.max_batched_tokens,
                                  kv_cache_gb=args.kv_cache_gb, num_threads=args.threads))


def stage_generate(args, out: Path, deadline: float) -> None:
    if args.backend == "hf":
        from training.hf_data import hf_generate_responses, load_hf_model
        from actors.model.loader import load_tokenizer, resolve_model_dir
        from cluster.prompts import PromptEncoder
        from cluster.runtime import resolve_device_dtype

        model_dir = resolve_model_dir(args.model)
        encoder = PromptEncoder(load_tokenizer(model_dir))
        device, dtype = resolve_device_dtype(args.device, args.gen_dtype)
        model = load_hf_model(model_dir, device, dtype)
        n = hf_generate_responses(model, encoder, _prompt_mix(args, encoder.tokenizer), out, deadline, device,
                                  batch=args.concurrency, max_tokens=args.max_tokens, seed=args.seed,
                                  share=_share(args))
        log.info("stage 1 done: %d answers", n)
        return
    from training.data import generate_responses

    engine = _engine(args)
    n = generate_responses(engine, _prompt_mix(args, engine.prompts.tokenizer), out, deadline, args.concurrency,
                           max_tokens=args.max_tokens, seed=args.seed, share=_share(args))
    log.info("stage 1 done: %d answers", n)


def stage_magpie(args, out: Path, deadline: float) -> None:
    from training.magpie import engine_complete, generate_magpie, hf_complete
    from training.prompt_mix import vocabulary_words
    from actors.model.loader import load_tokenizer, resolve_model_dir
    from cluster.prompts import PromptEncoder

    if args.backend == "hf":
        from training.hf_data import load_hf_model
        from cluster.runtime import resolve_device_dtype

        model_dir = resolve_model_dir(args.model)
        encoder = PromptEncoder(load_tokenizer(model_dir))
        device, dtype = resolve_device_dtype(args.device, args.gen_dtype)
        complete = hf_complete(load_hf_model(model_dir, device, dtype), encoder.tokenizer, device)
    else:
        engine = _engine(args)
        encoder, complete = engine.prompts, engine_complete(engine, args.concurrency)
    n = generate_magpie(complete, encoder, vocabulary_words(encoder.tokenizer), out, deadline, wave=args.magpie_wave,
                        seed=args.seed, share=_share(args), max_tokens=args.max_tokens)
    log.info("magpie stage done: %d answers", n)


def stage_text(args, out: Path) -> None:
    from training.data import write_offline_shards
    from training.offline_text import offline_conversations
    from actors.model.loader import load_tokenizer, resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir(args.model))
    n = write_offline_shards(tokenizer, offline_conversations(args.text_items, args.seed), out)
    log.info("offline text: %d shards", n)


def stage_features(args, out: Path, device: torch.device, deadline: float) -> None:
    from training.data import extract_features
    from actors.model.loader import load_model
    from cluster.runtime import resolve_device_dtype

    _, dtype = resolve_device_dtype(args.device, args.feature_dtype)
    if args.backend == "hf":
        from training.hf_data import hf_extract_features, load_hf_model
        from actors.model.loader import resolve_model_dir

        n = hf_extract_features(load_hf_model(resolve_model_dir(args.model), device, dtype), out, device, deadline)
    else:
        n = extract_features(load_model(args.model, dtype=dtype, device=device).model, out, device, deadline)
    log.info("stage 2 done: %d feature shards", n)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes {args.minutes}: must be positive")
    fracs = (args.gen_frac, args.magpie_frac, args.feat_frac)
    if not (min(fracs) >= 0 and sum(fracs) <= 1):
        parser.error(f"--gen-frac {args.gen_frac}, --magpie-frac {args.magpie_frac} and --feat-frac "
                     f"{args.feat_frac}: each >= 0, together <= 1")
    if args.max_epochs < 0:
        parser.error(f"--max-epochs {args.max_epochs}: must be >= 0 (0 = no cap)")
    args.max_epochs = args.max_epochs or None
    try:
        _share(args)
    except ValueError as e:
        parser.error(f"--sampled-frac/--sample-temperature/--sample-top-p: {e}")
    stages = set(args.stages.split(","))
    if not stages <= {"gen", "text", "magpie", "features", "train"}:
        parser.error(f"--stages {args.stages!r}: use a comma-separated subset of gen,text,magpie,features,train")
    out = Path(args.out)
    _setup_logging(out)
    device = torch.device(args.device)
    if device.type == "cpu":
        import os

        torch.set_num_threads(args.threads or os.cpu_count() or 1)
    start = time.time()
    log.info("args: %s", json.dumps(vars(args)))
    if "gen" in stages:
        stage_generate(args, out, start + 60 * args.minutes * args.gen_frac)
    if "text" in stages:
        stage_text(args, out)
    if "magpie" in stages:
        stage_magpie(args, out, start + 60 * args.minutes * (args.gen_frac + args.magpie_frac))
    if "features" in stages:
        stage_features(args, out, device, start + 60 * args.minutes * sum(fracs))
    if "train" in stages:
        from training.fit import fit_head

        fit_head(args, out, device, deadline=start + 60 * args.minutes)
    log.info("whole run: %.1f min", (time.time() - start) / 60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
