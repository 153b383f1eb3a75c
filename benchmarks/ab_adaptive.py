"""Interleaved A/B of plain decoding against adaptive speculation, for noisy machines.

``specray bench`` runs each variant's whole sweep in turn, so drift of a shared machine (±10% over
minutes on the 2-core box) lands on one variant. Here both run on one engine stack (one KV cache,
one proposer, one adaptive policy that goes on learning, as in a long-lived server) and alternate
ABBA within each repetition; the ratio of summed tokens/s and the paired ratios are printed.

    python -m benchmarks.ab_adaptive --prompts /tmp/shortqa.jsonl --concurrency 16,64 --reps 4
"""
from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", default="ngram", help="proposer (as specray --draft)")
    ap.add_argument("--spec-tokens", type=int, default=5, help="the policy's maximum depth K")
    ap.add_argument("--prompts", default=None, help="a prompt-set JSONL (default: bench500)")
    ap.add_argument("--sample", type=int, default=64, help="stratified sample of the prompt set")
    ap.add_argument("--concurrency", default="16,64", help="comma-separated concurrencies")
    ap.add_argument("--reps", type=int, default=4, help="ABBA repetitions per concurrency")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    from actors.model.loader import load_model
    from actors.sampling_params import SamplingParams
    from benchmarks.prompt_set import default_prompts_path, load_prompt_set, stratified_sample
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine
    from cluster.runtime import resolve_device_dtype

    concurrencies = [int(c) for c in args.concurrency.split(",")]
    prompts = stratified_sample(load_prompt_set(args.prompts or default_prompts_path()), args.sample)
    device, dtype = resolve_device_dtype("auto", "auto")
    spec = SpeculativeConfig.from_draft_arg(args.draft, args.spec_tokens, None, adaptive=True)
    cfg = EngineConfig(model=args.model, speculative=spec, num_threads=args.threads)
    loaded = load_model(args.model, dtype=dtype, device=device)
    first = LLMEngine(cfg, loaded=loaded)
    warm = prompts[: min(16, len(prompts))]
    first.generate([p.prompt for p in warm], SamplingParams(max_tokens=args.max_tokens), chat=True, concurrency=16)

    def run(mode: str, c: int) -> float:
        eng = LLMEngine(cfg, loaded=loaded, verifier=first.verifier, proposer=first.proposer,
                        spec_policy=first.spec_policy)
        params = [SamplingParams(max_tokens=p.budget(args.max_tokens), spec_tokens=0 if mode == "none" else None)
                  for p in prompts]
        start = time.perf_counter()
        outs = eng.generate([p.prompt for p in prompts], params, chat=True, concurrency=c)
        return sum(o.num_output_tokens for o in outs) / (time.perf_counter() - start)

    for c in concurrencies:
        tps: dict[str, list[float]] = {"none": [], "auto": []}
        for r in range(args.reps):
            for mode in ("none", "auto") if r % 2 == 0 else ("auto", "none"):
                tps[mode].append(run(mode, c))
                print(f"# c={c} rep {r} {mode}: {tps[mode][-1]:.2f} tok/s", flush=True)
        none, auto = tps["none"], tps["auto"]
        paired = ", ".join(f"{a / n:.3f}" for a, n in zip(auto, none))
        print(f"c={c}: none {sum(none) / len(none):.2f} tok/s, adaptive {sum(auto) / len(auto):.2f} tok/s, "
              f"ratio {sum(auto) / sum(none):.3f} (paired: {paired})", flush=True)


if __name__ == "__main__":
    main()
