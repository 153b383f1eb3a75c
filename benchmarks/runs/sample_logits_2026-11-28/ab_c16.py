"""T=1.0 unseeded plain decoding at concurrency 16 (32 bench500 prompts, 64 tokens each, ignore_eos),
one engine, old (torch path) and new (native) sampled-token draw alternated in one process; prints
tok/s and the step clock's verify phase (ms per step). Usage (repo root):
PYTHONPATH=. python benchmarks/runs/sample_logits_2026-11-28/ab_c16.py ROUNDS"""
import sys, time, torch
import actors.sampling as S
import cluster.verification as V
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
new_fn = S.sample_unseeded
def old_fn(logits, params, generator=None):
    return S.sample(S.logits_to_probs(logits, params.temperature, params.top_k, params.top_p), generator)
e = LLMEngine(EngineConfig(device="cpu"))
_, prompts = select_prompts(PROMPT_SETS["bench500"], 32, 0)
msgs = [p.messages for p in prompts]
params = SamplingParams(max_tokens=64, temperature=1.0, ignore_eos=True)
e.generate(msgs[:16], params, chat=True, concurrency=16)
for r in range(int(sys.argv[1])):
    for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
        S.sample_unseeded = V.sample_unseeded = new_fn if name == "new" else old_fn
        b = e.clock.snapshot(); t0 = time.perf_counter()
        outs = e.generate(msgs, params, chat=True, concurrency=16)
        w = time.perf_counter() - t0; a = e.clock.snapshot(); n = a["steps"] - b["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"{name}: tokens {tok} steps {n} tok/s {tok / w:.1f} ms/step {w / n * 1e3:.2f} "
              f"verify ms/step {(a['verify'] - b['verify']) / n * 1e3:.2f}", flush=True)
