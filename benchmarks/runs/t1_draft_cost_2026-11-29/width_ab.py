"""Dynamic-tree shapes under the adaptive policy now that each verified row costs ~10% of a decode
step on this CPU: tree width / node cap alternated with plain decoding in one process over rounds;
greedy c=1, 24 held-out prompts or 24 stratified bench500 ones.
Usage: PYTHONPATH=. python <this> heldout|bench500 ROUNDS"""
import sys, time, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS[sys.argv[1]], 24 if sys.argv[1] == "bench500" else None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=0.0) for p in prompts]
shapes = {"plain": None, "w3 n10": (3, 10), "w2 n10": (2, 10), "w2 n6": (2, 6), "w3 n6": (3, 6), "w1": (1, None)}
arms = {}
for name, shape in shapes.items():
    if shape is None:
        arms[name] = LLMEngine(EngineConfig(device="cpu"))
    else:
        spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True, tree_width=shape[0], tree_nodes=shape[1])
        arms[name] = LLMEngine(EngineConfig(device="cpu", speculative=spec))
    arms[name].generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[2])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e = arms[name]
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"{sys.argv[1]} {name:7s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f}", flush=True)
