"""The draft source from each sequence's kept occurrences vs the whole-history scan, every step:
two default-draft engines (adaptive K<=5) alternated on the held-out prompts, c=1, in one process;
per arm and round: tok/s and the engine step clock's schedule phase (where the source is looked up)
and whole step per step. Usage: PYTHONPATH=. python benchmarks/runs/draft_source_2026-11-29/ab.py TEMP ROUNDS"""
import sys

import torch

from benchmarks.alternate import PhaseLog, alternate, heldout_requests, report
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
PHASES = ("schedule", "draft", "forward", "verify", "bookkeeping")
runs = alternate(arms, msgs, params, rounds=rounds, on_run=PhaseLog(arms.get, PHASES))
print(report(runs, baseline="scan"))
