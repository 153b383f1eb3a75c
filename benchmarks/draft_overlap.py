"""Draft/verify overlap: step time with one micro-batch (draft, then verify) vs two micro-batches
(draft B while the target verifies A), for the default target with a separate draft model running
in a DrafterWorker actor.

    python -m benchmarks.draft_overlap [--batch 8] [--spec-tokens 4] [--max-tokens 48]

The draft model defaults to the default target's own cached HF directory: same tokenizer, accepts
everything, and costs as much per token as the target, so it is a slow draft but a clear probe of
how much drafting can hide behind verification. Figures are per decode step (steps where every
micro-batch drafted), averaged; tokens/s is output tokens / wall time of the whole batch.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.prompt_set import CHAT20_PROMPTS, load_prompt_set


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--draft-model", default=None, help="default: the target's own cached HF directory")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--spec-tokens", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--target-threads", type=int, default=1, help="torch threads of the driver (the target)")
    p.add_argument("--draft-threads", type=int, default=1, help="torch threads inside the drafter actor")
    p.add_argument("--micro-batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--repeat", type=int, default=2, help="runs per mode, alternating; medians compared")
    p.add_argument("--prompts", default=str(CHAT20_PROMPTS))
    return p.parse_args(argv)


def _summary(timings) -> dict:
    """Mean figures over decode steps (every micro-batch drafted)."""
    steps = [t for t in timings if t.micro and all(m.draft_compute_s > 0 for m in t.micro)]
    if not steps:
        return {}
    mean = lambda f: statistics.fmean(f(t) for t in steps) * 1e3  # noqa: E731
    per_micro = [[t.micro[i] for t in steps] for i in range(len(steps[0].micro))]
    return {
        "steps": len(steps),
        "step_ms": mean(lambda t: t.step_s),
        "draft_ms": mean(lambda t: t.draft_compute_s),
        "draft_wait_ms": mean(lambda t: t.draft_wait_s),
        "verify_ms": mean(lambda t: t.verify_s),
        "micro_draft_ms": [statistics.fmean(m.draft_compute_s for m in ms) * 1e3 for ms in per_micro],
        "micro_verify_ms": [statistics.fmean(m.verify_s for m in ms) * 1e3 for ms in per_micro],
    }


def _run(loaded, proposer, n_micro: int, prompts, args):
    from actors.sampling_params import SamplingParams
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine

    # fixed K (the budget; drafts come from the workers): the comparison is of the overlap alone
    spec = SpeculativeConfig(method="ngram", num_spec_tokens=args.spec_tokens, adaptive=False)
    eng = LLMEngine(EngineConfig(model=args.model, speculative=spec, num_threads=args.target_threads), loaded=loaded)
    eng.drafting.proposer = proposer
    stepper = eng.set_draft_overlap(n_micro)
    eng.generate(prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True), chat=True)  # warm-up
    stepper.timings.clear()
    t0 = time.perf_counter()
    outs = eng.generate(prompts, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True), chat=True)
    wall = time.perf_counter() - t0
    proposer.flush()
    tokens = sum(len(o.token_ids) for o in outs)
    drafts = sum(o.num_draft_tokens for o in outs)
    accepted = sum(o.num_accepted_tokens for o in outs)
    return [o.token_ids for o in outs], {"tokens_per_s": tokens / wall, "wall_s": wall,
                                         "acceptance": accepted / drafts if drafts else None,
                                         **_summary(stepper.timings)}


def _print(n_micro: int, r: dict) -> None:
    hidden = max(0.0, r["draft_ms"] - r["draft_wait_ms"])
    print(f"micro-batches={n_micro}: {r['tokens_per_s']:.1f} tok/s, decode step {r['step_ms']:.1f} ms over "
          f"{r['steps']} steps = exposed draft wait {r['draft_wait_ms']:.1f} + verify {r['verify_ms']:.1f} ms "
          f"(+ overhead); worker drafting {r['draft_ms']:.1f} ms, of which hidden {hidden:.1f} ms "
          f"({100 * hidden / r['draft_ms']:.0f}%); per micro-batch draft "
          f"{[round(x, 1) for x in r['micro_draft_ms']]} ms, verify {[round(x, 1) for x in r['micro_verify_ms']]} ms; "
          f"acceptance {r['acceptance']:.2f}")


def _pipelined_estimate(r: dict) -> float | None:
    """Across steps (draft A of step t+1 while verifying B of step t): max(V_A, D_B) + max(V_B, D_A)."""
    d, v = r.get("micro_draft_ms"), r.get("micro_verify_ms")
    if not d or len(d) != 2:
        return None
    return max(v[0], d[1]) + max(v[1], d[0])


def measure_round_trip(batch: int, steps: int = 100, history: int = 300) -> tuple[float, float]:
    """Per-step Ray cost of a drafter call: an n-gram worker (negligible compute) answering ``batch``
    requests with ``history``-token contexts, one new token per sequence per step (the delta protocol
    at work). Returns (median round trip, median time inside the worker), in ms."""
    from actors.proposers.base import DraftRequest
    from actors.proposers.worker import DrafterSpec
    from actors.sampling_params import SamplingParams
    from actors.proposers.remote import RemoteProposer

    rp = RemoteProposer([DrafterSpec("ngram")])
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 49152, (history,), generator=gen).tolist() for _ in range(batch)]
    for _ in range(steps):
        rp.propose([DraftRequest(i, s, [1] * 4, 4, SamplingParams(), None, []) for i, s in enumerate(seqs)])
        for s in seqs:
            s.append(s[len(s) // 2])
    lat, comp = sorted(rp.draft_latency_s)[10:], sorted(rp.worker_compute_s)[10:]  # minus warm-up
    rp.shutdown()
    return statistics.median(lat) * 1e3, statistics.median(comp) * 1e3


def _compare(results: dict, outputs: dict) -> None:
    """Median over repeats per micro-batch count, against one micro-batch (no overlap)."""
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("step_ms", "tokens_per_s")}
           for n, rs in results.items()}
    base = med.get(1)
    for n, m in med.items():
        line = f"micro-batches={n}: median decode step {m['step_ms']:.1f} ms, {m['tokens_per_s']:.1f} tok/s"
        if base and n != 1:
            line += (f"; vs one micro-batch: step speed-up {base['step_ms'] / m['step_ms']:.2f}x, tok/s "
                     f"{m['tokens_per_s'] / base['tokens_per_s']:.2f}x; greedy outputs identical: "
                     f"{all(o == outputs[1][0] for o in outputs[n])}")
        est = [e for e in map(_pipelined_estimate, results[n]) if e is not None]
        if est:
            line += f"; estimated step if drafting also overlapped across steps: {statistics.median(est):.1f} ms"
        print(line)


def main(argv=None) -> None:
    import ray

    from actors.proposers.worker import DrafterSpec
    from actors.model.loader import load_model, resolve_model_dir
    from actors.proposers.remote import RemoteProposer

    args = _args(argv)
    torch.set_num_threads(args.target_threads)
    draft_dir = str(args.draft_model or resolve_model_dir(args.model))
    prompts = [p.prompt for p in load_prompt_set(args.prompts)[: args.batch or None]]
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    loaded = load_model(args.model)
    spec = DrafterSpec("draft", draft_model=draft_dir, num_threads=args.draft_threads, num_blocks=512)
    proposer = RemoteProposer([spec], timeout_s=120.0)
    print(f"target {args.model} ({args.target_threads} thread(s), in the driver); drafter {spec.describe()} "
          f"({args.draft_threads} thread(s), Ray actor); batch {args.batch}, K={args.spec_tokens}, "
          f"{args.max_tokens} tokens each, {args.repeat} repeat(s)")
    for b in sorted({1, args.batch}):
        rt, inside = measure_round_trip(b)
        print(f"drafter call round trip (n-gram worker, batch {b}): {rt:.2f} ms, of which {inside:.2f} ms "
              f"inside the worker -> Ray overhead {rt - inside:.2f} ms per step")
    results: dict[int, list] = {n: [] for n in args.micro_batches}
    outputs: dict[int, list] = {n: [] for n in args.micro_batches}
    for _ in range(args.repeat):  # modes alternate, so drift in machine load hits both
        for n in args.micro_batches:
            out, r = _run(loaded, proposer, n, prompts, args)
            outputs[n].append(out)
            results[n].append(r)
            _print(n, r)
    _compare(results, outputs)
    print("proposer stats:", proposer.stats())
    proposer.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
