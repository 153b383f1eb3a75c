"""The adaptive policy charging a steady catch-up in full (new) or capped at a round (old: the
commit before), two engines in one process alternated with plain decoding over rounds: 24 held-out
prompts at c=1, greedy or T=1.0 unseeded. Usage: PYTHONPATH=. python <this> greedy|t1 ROUNDS"""
import sys, time, torch
import cluster.drafting as D
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
temp = 0.0 if sys.argv[1] == "greedy" else 1.0
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=temp) for p in prompts]
steady_fn = D.steady_draft_s
MODE = {"old": False}
D.steady_draft_s = lambda d, c, k, steady=False: steady_fn(d, c, k, steady and not MODE["old"])
spec = lambda: SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
arms = {"plain": LLMEngine(EngineConfig(device="cpu")), "old": LLMEngine(EngineConfig(device="cpu", speculative=spec())),
        "new": LLMEngine(EngineConfig(device="cpu", speculative=spec()))}
for name, e in arms.items():
    MODE["old"] = name == "old"
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[2])):
    for name in (["plain", "old", "new"] if rnd % 2 == 0 else ["new", "old", "plain"]):
        e = arms[name]; MODE["old"] = name == "old"
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"{sys.argv[1]} {name:5s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f}", flush=True)
