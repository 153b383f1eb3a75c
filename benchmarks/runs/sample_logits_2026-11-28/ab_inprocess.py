"""T=1.0 unseeded plain decoding (or --draft default adaptive) on the 24 held-out prompts at c=1, one
engine, the sampled token drawn by the native kernel (new) or by the torch path it replaced (old:
sample(logits_to_probs(...)), the code before), alternated old, new, new, old, ... in one process.
Usage (repo root): PYTHONPATH=. python benchmarks/runs/sample_logits_2026-11-28/ab_inprocess.py none|default ROUNDS"""
import sys, time, torch
import actors.sampling as S
import cluster.verification as V
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
new_fn = S.sample_unseeded
def old_fn(logits, params, generator=None):
    return S.sample(S.logits_to_probs(logits, params.temperature, params.top_k, params.top_p), generator)
def arm(fn):
    S.sample_unseeded = fn
    V.sample_unseeded = fn
draft, rounds = sys.argv[1], int(sys.argv[2])
spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True) if draft != "none" else None
e = LLMEngine(EngineConfig(device="cpu", speculative=spec) if spec else EngineConfig(device="cpu"))
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=1.0) for p in prompts]
e.generate(msgs[:2], params[:2], chat=True)
for r in range(rounds):
    for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
        arm(new_fn if name == "new" else old_fn)
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; after = e.clock.snapshot()
        n = after["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"{name}: tokens {tok} steps {n} tok/s {tok / w:.1f} ms/step {w / n * 1e3:.3f}", flush=True)
