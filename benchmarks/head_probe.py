"""How well EAGLE heads draft on the benchmark's own prompts, without running the engine per head.

    python -m benchmarks.head_probe [--heads default,/tmp/eagle/head.safetensors] [--sample 48]
                                    [--prompts bench500,heldout] [--work DIR] [--max-tokens 128]
                                    [--threads 2] [--temperature T]

The target answers a stratified sample of the prompt set once (greedily, or sampled at
``--temperature``; cached under ``--work``, the same response/feature format as
``training.train``); each head is then scored teacher-forced on those answers with the
training recipe's own evaluation (``training.fit.evaluate``): top-1 agreement with the target
per draft depth, the acceptance of each position of a greedy chain, and of a chain sampled from
the head at T (speculative sampling, sum of min(p, q) per depth), per category. This is the head's
offline quality on benchmark-like text; the engine's acceptance on the same answers matches it
(tests/test_eagle.py pins the proposer to the teacher-forced prediction). Training never sees
these prompts. Two more groups split the sample by language: ``korean`` (a prompt with Hangul in
it: 146 of bench500's 500) and ``other``. By default two prompt sets side by side, each group named
``set:group``: ``bench500`` and ``heldout`` (prompts the target wrote itself, which neither the
training mix nor bench500 shares: tests/test_prompt_set.py).
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

DEPTH = 5


def answer_prompts(model: str, prompts: list[dict], work: Path, max_tokens: int, threads: int | None,
                   concurrency: int = 16, temperature: float = 0.0) -> None:
    """The target's answers (bf16 engine, no speculation; greedy, or sampled at ``temperature``
    with top-p 1) and their features, under ``work``."""
    from training.data import GREEDY, SampledShare, extract_features, generate_responses
    from actors.model.loader import load_model
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    cfg = EngineConfig(model=model, dtype="bfloat16", max_num_seqs=concurrency, max_num_batched_tokens=1024,
                       kv_cache_gb=1.0, num_threads=threads)
    engine = LLMEngine(cfg)
    share = SampledShare(frac=1.0, temperature=temperature, top_p=1.0) if temperature > 0 else GREEDY
    generate_responses(engine, prompts, work, float("inf"), concurrency, max_tokens=max_tokens, share=share)
    del engine
    target = load_model(model, dtype=torch.bfloat16).model
    extract_features(target, work, torch.device("cpu"))


def examples_by_category(work: Path, *labelings: list[str]) -> dict[str, list]:
    """The cached conversations grouped by a label of their prompt (shard order = feature order),
    read once: each labeling (one label per prompt index: category, language, ...) adds its groups,
    sorted by label, after the previous labeling's."""
    from training.data import load_examples

    indices = [json.loads(line)["index"] for f in sorted((work / "responses").glob("shard-*.jsonl"))
               for line in f.read_text().splitlines() if line]
    examples = load_examples(work)
    if len(indices) != len(examples):
        raise RuntimeError(f"{work}: {len(indices)} answers but {len(examples)} with features; delete it and rerun")
    groups: dict[str, list] = {}
    for labels in labelings:
        out: dict[str, list] = defaultdict(list)
        for i, ex in zip(indices, examples):
            out[labels[i]].append(ex)
        groups.update(sorted(out.items()))
    return groups


HANGUL = re.compile("[\uac00-\ud7a3]")


def language_of(messages: list[dict]) -> str:
    """``korean`` when any message has a Hangul syllable, else ``other``."""
    return "korean" if any(HANGUL.search(m.get("content") or "") for m in messages) else "other"


def score(head, examples: list, temperature: float = 1.0) -> dict:
    """Top-1 per depth, greedy-chain acceptance per position and mean accepted length at K=DEPTH;
    the same for a chain sampled at ``temperature`` (speculative-sampling acceptance)."""
    from training.fit import evaluate

    e = evaluate(head, examples, DEPTH, torch.device("cpu"), 4096, temperature)
    return {"top1": [round(a, 3) for a in e.top1], "chain": [round(a, 3) for a in e.chain],
            "mean_accepted_length": round(1 + sum(e.chain), 3),
            "sampled_chain": [round(a, 3) for a in e.sampled_chain],
            "sampled_mean_accepted_length": round(1 + sum(e.sampled_chain), 3)}


def head_path(name: str, model: str) -> Path:
    """``default``: the head committed for ``model`` (a path that does not exist when there is none)."""
    from actors.eagle.head import DEFAULT_HEADS

    return DEFAULT_HEADS.get(model, Path(f"<no head committed for {model}>")) if name == "default" else Path(name)


def prepare_set(p, args, items: list, work: Path) -> dict[str, list]:
    """One prompt set's answers (made once under ``work``) grouped by category, language and all."""
    marker = work / "temperature"
    if marker.is_file() and float(marker.read_text()) != args.temperature:
        p.error(f"--temperature {args.temperature}: {work} holds answers at temperature {marker.read_text()}; "
                "use another --work")
    if not list((work / "features").glob("*.pt")):
        t0 = time.time()
        work.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(args.temperature))
        answer_prompts(args.model, [it.messages for it in items], work, args.max_tokens, args.threads,
                       temperature=args.temperature)
        print(f"answers and features for {len(items)} prompts in {time.time() - t0:.0f} s under {work}")
    return examples_by_category(work, [it.category for it in items], [language_of(it.messages) for it in items],
                                ["all"] * len(items))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.options import select_prompt_sets

    p = argparse.ArgumentParser(prog="python -m benchmarks.head_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", default="default", help="comma-separated head files (`default`: the committed head)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", default="bench500,heldout",
                   help="comma-separated JSONL prompt sets, side by side (`bench500`: the benchmark's set; "
                        "`heldout`: benchmarks/prompts/heldout_magpie.jsonl, which training never sees)")
    p.add_argument("--sample", type=int, default=48, help="prompts per set, stratified by category")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128, help="longest answer")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy answers; T > 0: answers sampled at T (top-p 1), and the sampled columns at T "
                        "(at 0 they are at T=1 on the greedy answers)")
    p.add_argument("--work", default=None, help="cache of the answers and features (default: a temporary directory)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    args = p.parse_args(argv)
    if args.sample < 1 or args.max_tokens < 1:
        p.error(f"--sample {args.sample} and --max-tokens {args.max_tokens}: each must be at least 1")
    if not 0 <= args.temperature <= 10:
        p.error(f"--temperature {args.temperature}: must be within [0, 10]")
    paths = [head_path(h, args.model) for h in args.heads.split(",") if h]
    missing = [str(h) for h in paths if not h.is_file()]
    if not paths or missing:
        p.error(f"--heads {args.heads!r}: no such head file {', '.join(missing) or '(none given)'}")
    try:
        sets = select_prompt_sets(args.prompts, args.sample, args.seed)
    except ValueError as e:
        p.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="head-probe-"))
    groups: dict[str, list] = {}
    for label, _, items in sets:  # each set under its own folder, its groups named "set:group" (one set: "group")
        one = prepare_set(p, args, items, work / label if len(sets) > 1 else work)
        groups.update({f"{label}:{g}" if len(sets) > 1 else g: exs for g, exs in one.items()})
    return report(paths, groups, args.model, args.json, args.temperature or 1.0)


def report(paths: list[Path], groups: dict[str, list], model: str, as_json: bool, temperature: float = 1.0) -> int:
    from actors.eagle.head import load_head
    from actors.model.loader import load_model

    target = load_model(model).model
    results = {str(path): {cat: score(load_head(path).attach(target), exs, temperature) for cat, exs in groups.items()}
               for path in paths}
    if as_json:
        print(json.dumps(results, indent=1))
        return 0
    ntok = {cat: sum(len(e.tokens) - e.num_prompt for e in exs) for cat, exs in groups.items()}
    print("| head | category | answer tokens | top-1 by depth | chain acceptance by position | mean accepted length (K=5) "
          f"| sampled chain (T={temperature:g}) by position | sampled mean accepted length |")
    print("|---|---|---|---|---|---|---|---|")
    for path, cats in results.items():
        for cat, r in cats.items():
            print(f"| {Path(path).name} | {cat} | {ntok[cat]} | {', '.join(map(str, r['top1']))} | "
                  f"{', '.join(map(str, r['chain']))} | {r['mean_accepted_length']:.2f} | "
                  f"{', '.join(map(str, r['sampled_chain']))} | {r['sampled_mean_accepted_length']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
