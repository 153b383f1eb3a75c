"""As ab.py, on ONE default-draft engine whose lookup takes turns between the whole-history scan and
the kept occurrences (round by round, ABBA): one adaptive policy learns from both, so the arms do
not drift apart in what they draft (two engines' policies did: 2.37 vs 2.50 tokens a step).
Usage: PYTHONPATH=. python benchmarks/runs/draft_source_2026-11-29/ab_one_engine.py TEMP ROUNDS"""
import sys

import torch

from benchmarks.alternate import PhaseLog, alternate, heldout_requests, report
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine

torch.set_num_threads(2)
temperature, rounds = float(sys.argv[1]), int(sys.argv[2])
msgs, params = heldout_requests(temperature=temperature)
eng = LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
    "default", 5, None, adaptive=True)))
lookup = eng.drafting.proposer.first
kept = lookup.draft_source


class Mode:
    """The engine, with the lookup's draft_source set for this arm on each generate."""

    def __init__(self, scan: bool):
        self.scan, self.clock = scan, eng.clock

    def generate(self, *args, **kwargs):
        lookup.draft_source = (lambda token_ids, seq_id=None: kept(token_ids)) if self.scan else kept
        return eng.generate(*args, **kwargs)


arms = {"scan": Mode(True), "kept": Mode(False)}
PHASES = ("schedule", "draft", "forward", "verify", "bookkeeping", "emit")
runs = alternate(arms, msgs, params, rounds=rounds, on_run=PhaseLog(lambda arm: eng, PHASES))
print(report(runs, baseline="scan"))
