"""Step clock at c=16, T=1.0 unseeded: plain decoding against the default draft (which the policy keeps
at depth 0 there), 48 bench500 prompts x 64 tokens, two rounds alternated. Usage: PYTHONPATH=. python <this>"""
import sys, time, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.step_clock import PHASES
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS["bench500"], 48, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=64, temperature=1.0, ignore_eos=True) for _ in prompts]
arms = {"plain": LLMEngine(EngineConfig(device="cpu")), "default": LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg("default", 5)))}
for e in arms.values():
    e.generate(msgs, params, chat=True, concurrency=16)
for rnd in range(2):
    for name, e in (arms.items() if rnd == 0 else reversed(arms.items())):
        b = e.clock.snapshot(); t0 = time.perf_counter()
        e.generate(msgs, params, chat=True, concurrency=16)
        w = time.perf_counter() - t0; a = e.clock.snapshot(); n = a["steps"] - b["steps"]
        print(name, f"ms/step {1e3*w/n:.2f}", " ".join(f"{k} {1e3*(a[k]-b[k])/n:.2f}" for k in PHASES), flush=True)
