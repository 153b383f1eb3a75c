"""Engine forward wall per step, split by rows in the step (1: no draft or a root-only tree, 2: one drafted
token), T=1 unseeded held-out prompts at c=1: plain decoding vs a fixed K=1 chain (guard off), the two
engines alternated in one process. Usage: PYTHONPATH=. python engine_forwards.py"""
import sys, time, torch
from collections import defaultdict
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.spec_guard import FallbackGuardConfig
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
n = 10
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts][:n]
params = [SamplingParams(max_tokens=p.budget(None), temperature=1.0) for p in prompts][:n]
spec = SpeculativeConfig.from_draft_arg("default", 1, None, adaptive=False)
spec.fallback_guard = FallbackGuardConfig(enabled=False)
engines = {"plain": LLMEngine(EngineConfig(device="cpu")), "k1": LLMEngine(EngineConfig(device="cpu", speculative=spec))}
T = defaultdict(float); C = defaultdict(int)
for name, e in engines.items():
    f = e._forward
    def w(chunks, rows, f=f, name=name):
        t = time.perf_counter()
        try:
            return f(chunks, rows)
        finally:
            nt = sum(len(c.token_ids) for c in chunks)
            key = (name, len(rows) if nt == len(rows) else "prefill")
            T[key] += time.perf_counter() - t; C[key] += 1
    e._forward = w
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(2):
    for name, e in engines.items():
        T.clear(); C.clear()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        print(rnd, name, {k[1]: (C[k], round(1e3 * T[k] / C[k], 2)) for k in sorted(T, key=str)}, flush=True)
