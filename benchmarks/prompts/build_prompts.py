"""Builds the 500-prompt benchmark set, bench500.jsonl, deterministically from the seeded generators.

    python -m benchmarks.prompts.build_prompts              # rewrite benchmarks/prompts/bench500.jsonl
    python -m benchmarks.prompts.build_prompts --out X.jsonl

The category mix follows a production traffic profile (see README.md here): the same seed always
gives the same file, byte for byte, with no network, model or installed-package text involved.
Each category draws from its own random stream, so changing one generator leaves the others' prompts
unchanged."""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from types import ModuleType

from benchmarks.prompts import (code_generation, creative_writing, short_qa, structured_output, summarization,
                                translation)

SEED = 20260500
OUT = Path(__file__).with_name("bench500.jsonl")
# category -> (generator, number of prompts); the order here is the order in the file.
CATEGORIES: dict[str, tuple[ModuleType, int]] = {
    "short_qa": (short_qa, 150),
    "summarization": (summarization, 100),
    "code_generation": (code_generation, 80),
    "creative_writing": (creative_writing, 50),
    "translation": (translation, 70),
    "structured_output": (structured_output, 50),
}


def build(seed: int = SEED) -> list[dict]:
    """All prompts, each {"id", "category", "messages", "max_tokens"}, ids numbered per category."""
    items = []
    for category, (module, count) in CATEGORIES.items():
        rng = random.Random(f"{seed}:{category}")
        for i, prompt in enumerate(module.generate(rng, count), start=1):
            items.append({"id": f"{category}-{i:03d}", "category": category, **prompt})
    return items


def to_jsonl(items: list[dict]) -> str:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output JSONL path (default {OUT})")
    parser.add_argument("--seed", type=int, default=SEED, help="change only to build a different set")
    args = parser.parse_args(argv)
    items = build(args.seed)
    args.out.write_text(to_jsonl(items), encoding="utf-8", newline="\n")
    print(f"wrote {len(items)} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
