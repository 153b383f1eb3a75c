"""policy_ab.py at c=16: the steady catch-up charged in full (new) or capped at a round (old), two
engines of the default draft alternated with plain decoding, T=1.0 unseeded or greedy, 48
stratified bench500 prompts x 64 tokens. Usage: PYTHONPATH=. python <this> t1|greedy ROUNDS"""
import sys, time, torch
import cluster.drafting as D
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
temp = 0.0 if sys.argv[1] == "greedy" else 1.0
_, prompts = select_prompts(PROMPT_SETS["bench500"], 48, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=64, temperature=temp, ignore_eos=True) for _ in prompts]
steady_fn = D.steady_draft_s
MODE = {"old": False}
D.steady_draft_s = lambda d, c, k, steady=False: steady_fn(d, c, k, steady and not MODE["old"])
spec = lambda: SpeculativeConfig.from_draft_arg("default", 5)
arms = {"plain": LLMEngine(EngineConfig(device="cpu")), "old": LLMEngine(EngineConfig(device="cpu", speculative=spec())),
        "new": LLMEngine(EngineConfig(device="cpu", speculative=spec()))}
for name, e in arms.items():
    MODE["old"] = name == "old"
    e.generate(msgs[:16], params[:16], chat=True, concurrency=16)
for rnd in range(int(sys.argv[2])):
    for name in (["plain", "old", "new"] if rnd % 2 == 0 else ["new", "old", "plain"]):
        e = arms[name]; MODE["old"] = name == "old"
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = e.generate(msgs, params, chat=True, concurrency=16)
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"c16 {sys.argv[1]} {name:5s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f}", flush=True)
