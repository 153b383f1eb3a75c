"""floor vs floor with the policy charging each depth one row (width 1), alternated with plain."""
import sys, time, torch
import numpy as np
from actors.sampling_params import SamplingParams
from actors.spec_policy import DecodeSlot
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS[sys.argv[1]], 24 if sys.argv[1] == "bench500" else None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=0.0) for p in prompts]
arms = {"plain": LLMEngine(EngineConfig(device="cpu"))}
for name in ("floor", "floor w1"):
    spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
    arms[name] = LLMEngine(EngineConfig(device="cpu", speculative=spec))
d = arms["floor w1"].drafting
def adapt(scheduled, cands, d=d):
    slots = [DecodeSlot(s.seq.seq_id, len(exp), fixed=s.seq.params.spec_tokens is not None,
                        source=d.source(s.seq), width=1, node_cap=d._draft_nodes(s.seq, exp), siblings=d._siblings(s.seq, exp))
             for s, exp in cands]
    depths = d.policy.choose(slots, base_tokens=sum(s.num_query for s in scheduled),
                             base_yield=sum(1 for s in scheduled if s.is_decode), num_seqs=len(scheduled))
    return [(s, exp[:k]) for (s, exp), k in zip(cands, depths) if k > 0]
d._adapt_depths = adapt
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
