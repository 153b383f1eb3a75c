"""Train the EAGLE head for a target by self-distillation, within a wall-clock budget.

    python -m actors.eagle.train --out /tmp/eagle/run [--model smollm2-135m] [--minutes 60] [--device cuda]

Stages (each cached under --out, so a re-run resumes after a crash):
1. prompt mix (actors.eagle.prompt_mix) -> target answers via the engine (``--gen-dtype``, default
   bf16: 1.7x faster on this CPU than fp32; the answers only need to be the target's style);
2. teacher-forced target forward (the run-time dtype) -> features f_t and greedy next tokens;
3. train the head (actors.eagle.fit) and save it as ``--out/head.safetensors``.
``--minutes`` is split: ``--gen-frac`` of it for stage 1, stage 2 takes what it needs, stage 3
the rest. On a GPU pass ``--device cuda`` (and a larger ``--minutes``/``--num-prompts`` budget).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

log = logging.getLogger("specray.eagle.train")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m actors.eagle.train", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="working directory (cached stages, log, head.safetensors)")
    p.add_argument("--model", default="smollm2-135m", help="target: alias, HF dir or .gguf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of the whole run")
    p.add_argument("--gen-frac", type=float, default=0.5, help="share of --minutes for generating answers")
    p.add_argument("--num-prompts", type=int, default=8000, help="size of the prompt mix (generation stops early at its budget)")
    p.add_argument("--concurrency", type=int, default=48, help="answers generated at once")
    p.add_argument("--max-tokens", type=int, default=160, help="longest answer")
    p.add_argument("--gen-dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--feature-dtype", default=None, help="dtype of the teacher-forced pass (default: run-time dtype)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="rows of the head's reduced LM head")
    p.add_argument("--unroll", type=int, default=3, help="draft steps unrolled in training (1 = teacher forcing only)")
    p.add_argument("--max-steps", type=int, default=None, help="stop training after this many steps (smoke runs)")
    p.add_argument("--stages", default="gen,features,train", help="comma-separated subset of gen,features,train")
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


def stage_generate(args, out: Path, deadline: float) -> None:
    from actors.eagle.data import generate_responses
    from actors.eagle.prompt_mix import build_prompt_mix
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    prompts = build_prompt_mix(args.num_prompts, args.seed)
    cfg = EngineConfig(model=args.model, dtype=args.gen_dtype, device=args.device, max_num_seqs=args.concurrency,
                       max_num_batched_tokens=1024, kv_cache_gb=2.0, num_threads=args.threads)
    engine = LLMEngine(cfg)
    n = generate_responses(engine, prompts, out, deadline, args.concurrency, max_tokens=args.max_tokens,
                           seed=args.seed)
    log.info("stage 1 done: %d answers", n)


def stage_features(args, out: Path, device: torch.device) -> None:
    from actors.eagle.data import extract_features
    from actors.model.loader import load_model
    from cluster.runtime import resolve_device_dtype

    _, dtype = resolve_device_dtype(args.device, args.feature_dtype or "auto")
    loaded = load_model(args.model, dtype=dtype, device=device)
    n = extract_features(loaded.model, out, device)
    log.info("stage 2 done: %d feature shards", n)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    _setup_logging(out)
    device = torch.device(args.device)
    if device.type == "cpu":
        import os

        torch.set_num_threads(args.threads or os.cpu_count() or 1)
    start = time.time()
    log.info("args: %s", json.dumps(vars(args)))
    stages = set(args.stages.split(","))
    if not stages <= {"gen", "features", "train"}:
        raise SystemExit(f"--stages {args.stages!r}: use a comma-separated subset of gen,features,train")
    if "gen" in stages:
        stage_generate(args, out, start + 60 * args.minutes * args.gen_frac)
    if "features" in stages:
        stage_features(args, out, device)
    if "train" in stages:
        from actors.eagle.fit import fit_head

        fit_head(args, out, device, deadline=start + 60 * args.minutes)
    log.info("whole run: %.1f min", (time.time() - start) / 60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
