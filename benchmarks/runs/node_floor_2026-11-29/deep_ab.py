"""Lookup as deep as its acceptance pays (up to 32 nodes) vs lookup within the 10-node cap, alternated
with plain decoding in one process over rounds; greedy c=1, every prompt's own max_tokens.
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
arms = {"plain": LLMEngine(EngineConfig(device="cpu"))}
for name in ("cap 10", "deep lookup"):
    spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
    arms[name] = LLMEngine(EngineConfig(device="cpu", speculative=spec))
arms["cap 10"].drafting._paying_depth = lambda seq: 0
for e in arms.values():
    e.generate(msgs[:2], params[:2], chat=True)
ref = {}
for rnd in range(int(sys.argv[2])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e = arms[name]
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        toks = [list(o.token_ids) for o in outs]
        same = ref.setdefault("t", toks) == toks
        tok = sum(len(t) for t in toks)
        print(f"{sys.argv[1]} {name:8s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f} same {same}", flush=True)
