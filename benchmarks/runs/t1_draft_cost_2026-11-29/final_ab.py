"""The default draft before this session's policy and shape changes (width-3 trees, a steady
catch-up capped at a round) and after (width 2 on the CPU, the catch-up charged in full), each its
own engine in one process, alternated with plain decoding over rounds; greedy c=1, adaptive.
Usage: PYTHONPATH=. python <this> heldout|bench500 ROUNDS"""
import sys, time, torch
import cluster.drafting as D
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS[sys.argv[1]], 24 if sys.argv[1] == "bench500" else None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=0.0) for p in prompts]
steady_fn = D.steady_draft_s
MODE = {"old": False}
D.steady_draft_s = lambda d, c, k, steady=False: steady_fn(d, c, k, steady and not MODE["old"])
arms = {"plain": LLMEngine(EngineConfig(device="cpu")),
        "before": LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg("default", 5, tree_width=3, tree_nodes=10))),
        "after": LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg("default", 5)))}
for name, e in arms.items():
    MODE["old"] = name == "before"
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[2])):
    for name in (["plain", "before", "after"] if rnd % 2 == 0 else ["after", "before", "plain"]):
        e = arms[name]; MODE["old"] = name == "before"
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"{sys.argv[1]} {name:6s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f}", flush=True)
