"""cProfile of T=1.0 unseeded held-out generation at c=1 with a fixed K chain (guard off).
Usage: PYTHONPATH=. python benchmarks/runs/t1_draft_cost_2026-11-29/prof.py K [N_PROMPTS]"""
import cProfile, pstats, sys, time, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.spec_guard import FallbackGuardConfig
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
k = int(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts][:n]
spec = SpeculativeConfig.from_draft_arg("default", k, None, adaptive=False)
spec.fallback_guard = FallbackGuardConfig(enabled=False)
e = LLMEngine(EngineConfig(device="cpu", speculative=spec))
params = [SamplingParams(max_tokens=p.budget(None), temperature=1.0) for p in prompts][:n]
e.generate(msgs[:2], params[:2], chat=True)
pr = cProfile.Profile()
before = e.clock.snapshot(); t0 = time.perf_counter()
pr.enable()
outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
pr.disable()
w = time.perf_counter() - t0; after = e.clock.snapshot(); steps = after["steps"] - before["steps"]
print("tokens", sum(len(o.token_ids) for o in outs), "steps", steps, "ms/step", 1e3 * w / steps)
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(35)
