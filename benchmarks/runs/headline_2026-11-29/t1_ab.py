"""T=1.0 unseeded, held-out, c=1: plain vs the default draft (adaptive K<=5, guard on), alternated.
Usage: PYTHONPATH=. python benchmarks/runs/headline_2026-11-29/t1_ab.py ROUNDS"""
import sys

import torch

from benchmarks.alternate import alternate, heldout_requests, report
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine

torch.set_num_threads(2)
msgs, params = heldout_requests(temperature=1.0)
arms = {"plain": LLMEngine(EngineConfig(device="cpu", num_threads=2)),
        "default": LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
            "default", 5, None, adaptive=True)))}
runs = alternate(arms, msgs, params, rounds=int(sys.argv[1]),
                 on_run=lambda r: print(f"round {r.round} {r.arm}: {r.tokens} tokens, {r.tokens_per_s:.1f} tok/s, "
                                        f"{r.tokens_per_step:.2f} tokens/step", flush=True))
print(report(runs, baseline="plain"))
