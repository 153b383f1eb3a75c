"""`specray bench`: run a prompt set through the in-process engine with several proposers and
concurrencies (plus transformers' own greedy generate as the peer), and print figures.

Every method runs in the same process on the same loaded weights; tokens/s = output tokens of
the whole set / wall time of the whole set (prompts served as one continuous batch, at most
``concurrency`` in flight)."""
from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

DEFAULT_PROMPTS = Path(__file__).parent / "prompts" / "chat20.jsonl"


@dataclass
class BenchResult:
    method: str
    concurrency: int
    num_prompts: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    acceptance_rate: float | None
    mean_accepted_length: float | None
    ttft_p50_s: float | None
    e2e_p50_s: float | None
    speedup: float | None = None  # vs the no-speculation engine at the same concurrency


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    items = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return items[:limit] if limit else items


def _spec_figures(outs) -> tuple[float | None, float | None]:
    drafts = sum(o.num_drafts for o in outs)
    draft_tokens = sum(o.num_draft_tokens for o in outs)
    accepted = sum(o.num_accepted_tokens for o in outs)
    if not draft_tokens:
        return None, None
    return accepted / draft_tokens, 1.0 + accepted / drafts


def run_engine(loaded, draft: str, concurrency: int, items: list[dict], max_tokens: int,
               spec_tokens: int, tree=None, threads: int | None = None) -> BenchResult:
    from actors.sampling_params import SamplingParams
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine

    spec = SpeculativeConfig.from_draft_arg(draft, spec_tokens, tree)
    eng = LLMEngine(EngineConfig(speculative=spec, num_threads=threads), loaded=loaded)
    prompts = [it.get("messages") or it["prompt"] for it in items]
    params = SamplingParams(max_tokens=max_tokens)
    eng.generate(prompts[:1], SamplingParams(max_tokens=8), chat=True)  # warm-up
    start = time.perf_counter()
    outs = eng.generate(prompts, params, chat=True, concurrency=concurrency)
    wall = time.perf_counter() - start
    ntok = sum(o.num_output_tokens for o in outs)
    rate, mal = _spec_figures(outs)
    return BenchResult(draft, concurrency, len(items), ntok, wall, ntok / wall, rate, mal,
                       statistics.median(o.ttft_s for o in outs), statistics.median(o.e2e_s for o in outs))


def run_transformers_generate(loaded, items: list[dict], max_tokens: int) -> BenchResult:
    """The peer: transformers' own greedy generate, one prompt at a time, same weights (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(loaded.model_dir, dtype=torch.float32).eval()
    tok = loaded.tokenizer
    encoded = []
    for it in items:
        msgs = it.get("messages") or [{"role": "user", "content": it["prompt"]}]
        ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        encoded.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    gen = dict(do_sample=False, max_new_tokens=max_tokens, pad_token_id=tok.eos_token_id)
    with torch.inference_mode():
        model.generate(torch.tensor([encoded[0]]), **{**gen, "max_new_tokens": 8})  # warm-up
        start = time.perf_counter()
        lat, ntok = [], 0
        for ids in encoded:
            t0 = time.perf_counter()
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **gen)
            ntok += out.shape[1] - len(ids)
            lat.append(time.perf_counter() - t0)
        wall = time.perf_counter() - start
    return BenchResult("transformers.generate", 1, len(items), ntok, wall, ntok / wall, None, None,
                       None, statistics.median(lat))


def add_speedups(results: list[BenchResult]) -> None:
    base = {r.concurrency: r.tokens_per_s for r in results if r.method == "none"}
    for r in results:
        if r.concurrency in base and r.method != "transformers.generate":
            r.speedup = r.tokens_per_s / base[r.concurrency]


def markdown_table(results: list[BenchResult]) -> str:
    head = ("| method | concurrency | output tokens | wall s | tokens/s | speedup vs none | acceptance rate "
            "| mean accepted length | TTFT p50 s | E2E p50 s |\n|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    rows = [f"| {r.method} | {r.concurrency} | {r.output_tokens} | {r.wall_s:.1f} | {r.tokens_per_s:.2f} | "
            f"{fmt(r.speedup, '{:.2f}x')} | {fmt(r.acceptance_rate)} | {fmt(r.mean_accepted_length)} | "
            f"{fmt(r.ttft_p50_s, '{:.3f}')} | {fmt(r.e2e_p50_s)} |" for r in results]
    return "\n".join([head, *rows])


def machine_line(threads: int) -> str:
    return (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads "
            f"(requested {threads}), torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")


def run_bench(args) -> list[BenchResult]:
    from actors.model.loader import load_model

    items = load_prompts(args.prompts, args.limit)
    loaded = load_model(args.model, dtype=torch.float32)
    results = []
    for c in args.concurrency:
        for draft in args.draft:
            r = run_engine(loaded, draft, c, items, args.max_tokens, args.spec_tokens, args.tree, args.threads)
            print(f"# {draft} c={c}: {r.tokens_per_s:.2f} tok/s", flush=True)
            results.append(r)
    if args.peers:
        results.append(run_transformers_generate(loaded, items, args.max_tokens))
    add_speedups(results)
    return results


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="measure tokens/s per proposer and concurrency (prints a table)")
    b.add_argument("--model", default="smollm2-135m")
    b.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSONL with messages or prompt")
    b.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    b.add_argument("--draft", type=lambda s: s.split(","), default=["none", "ngram", "layerskip:8"])
    b.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--spec-tokens", type=int, default=5)
    b.add_argument("--tree", default=None)
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--peers", action="store_true", help="also run transformers' greedy generate")
    b.add_argument("--json", default=None, help="write results to this JSON file")


def cmd_bench(args) -> int:
    for c in args.concurrency:
        if c < 1:
            raise ValueError(f"--concurrency {c}: must be at least 1")
    results = run_bench(args)
    print(f"\nmachine: {machine_line(args.threads or 0)}")
    print(markdown_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0
