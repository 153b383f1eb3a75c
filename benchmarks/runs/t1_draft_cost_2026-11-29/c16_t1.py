"""T=1.0 unseeded at c=16: the CPU default (one sampled draw) against three draws at a chain's first
depth, adaptive, 48 stratified bench500 prompts x 64 tokens, own engines alternated with plain over
rounds. Usage: PYTHONPATH=. python <this> ROUNDS"""
import sys, time, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS["bench500"], 48, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=64, temperature=1.0, ignore_eos=True) for _ in prompts]
arms = {"plain": LLMEngine(EngineConfig(device="cpu")),
        "one draw": LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg("default", 5))),
        "three draws": LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg(
            "default", 5, tree_width=3, tree_nodes=10, sampled_siblings=3)))}
for e in arms.values():
    e.generate(msgs[:16], params[:16], chat=True, concurrency=16)
for rnd in range(int(sys.argv[1])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e = arms[name]
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = e.generate(msgs, params, chat=True, concurrency=16)
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"c16 T=1 {name:11s} tokens {tok} steps {n} tok/s {tok / w:.1f}", flush=True)
