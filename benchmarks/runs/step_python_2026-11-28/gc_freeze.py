"""Tried, no change: the cyclic garbage collector frozen (gc.freeze) vs on, alternated in one process, plain
c=1 on 12 held-out prompts: Python per step 0.545/0.534/0.543/0.560 (on) vs 0.521/0.523/0.551/0.567 ms (frozen). 20:27."""
import time, sys, torch, gc
from kernels import cpu_native
acc = {}
def wrap(name):
    f = getattr(cpu_native, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[name] = acc.get(name, 0.0) + time.perf_counter() - t; return r
    setattr(cpu_native, name, g)
for n in ["decoder_layers", "linear", "head_step", "argmax_rows"]:
    wrap(n)
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
draft = sys.argv[1]
fixed = draft.endswith("-fixed"); draft = draft.removesuffix("-fixed")
spec = SpeculativeConfig.from_draft_arg(draft, 5, None, adaptive=not fixed) if draft != "none" else None
e = LLMEngine(EngineConfig(device="cpu", speculative=spec) if spec else EngineConfig(device="cpu"))
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts][:12]
params = [SamplingParams(max_tokens=p.budget(None)) for p in prompts][:12]
e.generate(msgs[:2], params[:2], chat=True)
res = {"gc on": [], "frozen": []}
for rnd in range(4):
    for mode in (["gc on", "frozen"] if rnd % 2 == 0 else ["frozen", "gc on"]):
        gc.collect()
        if mode == "frozen": gc.freeze()
        acc.clear(); t0 = time.perf_counter(); n0 = e.clock.steps
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; n = e.clock.steps - n0
        res[mode].append(1e3 * (w - sum(acc.values())) / n)
        if mode == "frozen": gc.unfreeze()
        print(mode, gc.get_count(), f"other ms/step {res[mode][-1]:.3f}", flush=True)
