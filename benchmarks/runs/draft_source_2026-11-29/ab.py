"""The draft source from each sequence's kept occurrences vs the whole-history scan, every step:
two default-draft engines (adaptive K<=5) alternated on the held-out prompts, c=1, in one process;
per arm and round: tok/s and the engine step clock's schedule phase (where the source is looked up)
and whole step per step. Usage: PYTHONPATH=. python benchmarks/runs/draft_source_2026-11-29/ab.py TEMP ROUNDS"""
import sys

import torch

from benchmarks.alternate import alternate, heldout_requests, report
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine

torch.set_num_threads(2)
temperature, rounds = float(sys.argv[1]), int(sys.argv[2])
msgs, params = heldout_requests(temperature=temperature)


def engine():
    return LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
        "default", 5, None, adaptive=True)))


arms = {"scan": engine(), "kept": engine()}
scan = arms["scan"].drafting
scan.proposer.first.draft_source = lambda token_ids, seq_id=None, f=scan.proposer.first.draft_source: f(token_ids)
last = {name: (eng.clock.snapshot()) for name, eng in arms.items()}


def on_run(r):
    eng = arms[r.arm]
    now = eng.clock.snapshot()
    before = last[r.arm]
    last[r.arm] = now
    steps = now["steps"] - before["steps"]
    ms = {k: 1e3 * (now[k] - before[k]) / steps for k in now if k != "steps"}
    print(f"round {r.round} {r.arm}: {r.tokens} tokens, {r.tokens_per_s:.1f} tok/s, {r.tokens_per_step:.2f} tokens/step, "
          f"schedule {ms['schedule']:.3f} ms/step, step {sum(ms.values()):.2f} ms "
          f"(draft {ms['draft']:.2f}, forward {ms['forward']:.2f}, verify {ms['verify']:.2f}, "
          f"bookkeeping {ms['bookkeeping']:.2f})", flush=True)


runs = alternate(arms, msgs, params, rounds=rounds, on_run=on_run)
print(report(runs, baseline="scan"))
