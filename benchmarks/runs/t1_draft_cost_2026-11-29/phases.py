"""Where a T=1.0 unseeded step's time goes on the 24 held-out prompts at c=1: per arm (plain,
--draft default adaptive, fixed chains K=1..3), tok/s, tokens per step and the engine's step clock
(ms per step per phase). Usage (repo root): PYTHONPATH=. python benchmarks/runs/t1_draft_cost_2026-11-29/phases.py [greedy]"""
import sys, time, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.step_clock import PHASES
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
temp = 0.0 if "greedy" in sys.argv else 1.0
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
arms = [("none", None, None), ("adaptive", "auto", None), ("K1", 1, None), ("K2", 2, None), ("K3", 3, None)]
engines = {}
for name, k, _ in arms:
    if k is None:
        engines[name] = LLMEngine(EngineConfig(device="cpu"))
    else:
        spec = SpeculativeConfig.from_draft_arg("default", 5 if k == "auto" else k, None, adaptive=k == "auto")
        engines[name] = LLMEngine(EngineConfig(device="cpu", speculative=spec))
params = [SamplingParams(max_tokens=p.budget(None), temperature=temp) for p in prompts]
for name, e in engines.items():
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 1):
    order = list(engines) if rnd % 2 == 0 else list(reversed(engines))
    for name in order:
        e = engines[name]
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; after = e.clock.snapshot()
        n = after["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        ph = " ".join(f"{k} {1e3 * (after[k] - before[k]) / n:.2f}" for k in PHASES)
        print(f"{name:9s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f} ms/step {w / n * 1e3:.2f} | {ph}", flush=True)
