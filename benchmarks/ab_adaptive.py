"""Interleaved A/B of plain decoding against adaptive speculation, for noisy machines.

``specray bench`` runs each variant's whole sweep in turn, so drift of a shared machine (±10% over
minutes on the 2-core box) lands on one variant. Here both run on one engine stack (one KV cache,
one proposer, one adaptive policy that goes on learning, as in a long-lived server) and alternate
ABBA within each repetition; the ratio of summed tokens/s and the paired ratios are printed.

    python -m benchmarks.ab_adaptive --prompts /tmp/shortqa.jsonl --concurrency 16,64 --reps 4
"""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", default="ngram", help="proposer (as specray --draft)")
    ap.add_argument("--spec-tokens", type=int, default=5, help="the policy's maximum depth K")
    ap.add_argument("--tree-width", type=int, default=None,
                    help="EAGLE drafts: dynamic trees of this width (1 = chains; default: the engine's)")
    ap.add_argument("--tree-nodes", type=int, default=None, help="those trees' cap on draft nodes (default: the engine's)")
    ap.add_argument("--prompts", default=None, help="a prompt-set JSONL (default: bench500)")
    ap.add_argument("--sample", type=int, default=64, help="stratified sample of the prompt set")
    ap.add_argument("--concurrency", default="16,64", help="comma-separated concurrencies")
    ap.add_argument("--reps", type=int, default=4, help="ABBA repetitions per concurrency")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    from benchmarks.engine_bench import EngineBackend
    from benchmarks.prompt_set import default_prompts_path, load_prompt_set, stratified_sample
    from benchmarks.results import Variant, summarize

    concurrencies = [int(c) for c in args.concurrency.split(",")]
    prompts = stratified_sample(load_prompt_set(args.prompts or default_prompts_path()), args.sample)
    backend = EngineBackend(args.model, args.max_tokens, warmup=0, engine_options={"num_threads": args.threads})
    modes = {"none": Variant(spec_tokens=0),
             "auto": Variant(spec_tokens=args.spec_tokens, adaptive=True, tree_width=args.tree_width,
                             tree_nodes=args.tree_nodes)}
    # one engine stack for both modes: a bench session shares KV cache, proposer and policy
    with backend.session(args.draft, (modes["auto"],), prompts[0]) as run_once:
        run_once(modes["auto"], prompts[: min(16, len(prompts))], 16, 0.0)  # the policy's warm-up
        for c in concurrencies:
            tps: dict[str, list[float]] = {"none": [], "auto": []}
            for r in range(args.reps):
                for mode in ("none", "auto") if r % 2 == 0 else ("auto", "none"):
                    run = run_once(modes[mode], prompts, c, 0.0)
                    tps[mode].append(summarize(run.records, run.wall_s)["tokens_per_s"])
                    print(f"# c={c} rep {r} {mode}: {tps[mode][-1]:.2f} tok/s", flush=True)
            none, auto = tps["none"], tps["auto"]
            paired = ", ".join(f"{a / n:.3f}" for a, n in zip(auto, none))
            print(f"c={c}: none {sum(none) / len(none):.2f} tok/s, adaptive {sum(auto) / len(auto):.2f} tok/s, "
                  f"ratio {sum(auto) / sum(none):.3f} (paired: {paired})", flush=True)

if __name__ == "__main__":
    main()
