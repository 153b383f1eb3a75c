"""Python per engine step = wall time - time inside the native ops (decoder_layers, the LM head's linear,
argmax_rows, head_step), on the 24 held-out prompts at c=1, twice in one process.
Usage (repo root): python step_python.py none | default | default-fixed  (default-fixed: K=5 dynamic tree, no
adaptive policy, so both code versions run the same steps). Run by ab_other.sh, 2026-11-28 19:30-20:20."""
import time, sys, torch
from kernels import cpu_native
acc = {}
def wrap(name):
    f = getattr(cpu_native, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[name] = acc.get(name, 0.0) + time.perf_counter() - t; return r
    setattr(cpu_native, name, g)
for n in ["decoder_layers", "linear", "head_step", "argmax_rows", "top_logprobs", "paged_attention", "rmsnorm"]:
    wrap(n)
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
draft = sys.argv[1]
fixed = draft.endswith("-fixed")
draft = draft.removesuffix("-fixed")
spec = SpeculativeConfig.from_draft_arg(draft, 5, None, adaptive=not fixed) if draft != "none" else None
e = LLMEngine(EngineConfig(device="cpu", speculative=spec) if spec else EngineConfig(device="cpu"))
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None)) for p in prompts]
e.generate(msgs[:2], params[:2], chat=True)
for rep in range(2):
    acc.clear()
    before = e.clock.snapshot(); t0=time.perf_counter()
    outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
    w=time.perf_counter()-t0; after=e.clock.snapshot(); n=after["steps"]-before["steps"]
    tok = sum(len(o.token_ids) for o in outs)
    ops = sum(acc.values())
    print("tokens", tok, "steps", n, "tok/s", round(tok/w,1), "ms/step", round(1e3*w/n,3), "ops ms/step", round(1e3*ops/n,3),
          {k: round(1e3*v/n,3) for k,v in acc.items()}, "other ms/step", round(1e3*(w-ops)/n,3), flush=True)
