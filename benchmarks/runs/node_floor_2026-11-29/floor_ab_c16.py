"""Dynamic trees pruned at the policy's node floor vs the same engine without the floor, alternated
with plain decoding in one process over rounds; greedy c=1, every prompt's own max_tokens.
c=16 (48 bench500 prompts). Usage: PYTHONPATH=. python <this> heldout|bench500 ROUNDS"""
import sys, time, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS[sys.argv[1]], 48 if sys.argv[1] == "bench500" else None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=0.0) for p in prompts]
arms = {"plain": LLMEngine(EngineConfig(device="cpu"))}
for name in ("no floor", "floor"):
    spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
    arms[name] = LLMEngine(EngineConfig(device="cpu", speculative=spec))
arms["no floor"].drafting.policy.node_floor = lambda *a, **k: 0.0
for e in arms.values():
    e.generate(msgs[:2], params[:2], chat=True)
ref = {}
for rnd in range(int(sys.argv[2])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e = arms[name]
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = e.generate(msgs, params, chat=True, concurrency=16)
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        toks = [list(o.token_ids) for o in outs]
        same = ref.setdefault("t", toks) == toks
        tok = sum(len(t) for t in toks)
        print(f"{sys.argv[1]} {name:8s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f} same {same}", flush=True)
