"""Exploration one position past the chosen depth (full depth 1 in 4) vs always full depth, the
default draft (adaptive, guard on), alternated with plain; held-out c=1.
Usage: PYTHONPATH=. python <this> TEMPERATURE ROUNDS"""
import sys, time, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
temp = float(sys.argv[1])
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=temp) for p in prompts]
arms = {"plain": LLMEngine(EngineConfig(device="cpu"))}
for name, full in (("full every time", 1), ("+1, full 1 in 4", 4)):
    arms[name] = LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)))
    arms[name].drafting.policy.full_explore_every = full
for e in arms.values():
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[2])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e = arms[name]
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"T={temp} {name:16s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f}", flush=True)
