"""The node floor from the verify table's slope at one more token (as committed) vs its mean slope
over the next 10 tokens (where a tree's rows are), alternated with plain; greedy c=1.
Usage: PYTHONPATH=. python <this> heldout|bench500 ROUNDS"""
import sys, time, types, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS[sys.argv[1]], 24 if sys.argv[1] == "bench500" else None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=0.0) for p in prompts]
arms = {"plain": LLMEngine(EngineConfig(device="cpu"))}
for name in ("slope+1", "slope+10"):
    spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
    arms[name] = LLMEngine(EngineConfig(device="cpu", speculative=spec))
def floor10(self, base_tokens, num_seqs=None):
    if self.last_goodput is None or not self.verify_cost.measured:
        return 0.0
    v = self.verify_model(num_seqs)
    return min(max((v(base_tokens + 10) - v(base_tokens)) / 10 * self.last_goodput, 0.0), 0.5)
pol = arms["slope+10"].drafting.policy
pol.node_floor = types.MethodType(floor10, pol)
for e in arms.values():
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[2])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e = arms[name]
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        extra = ""
        if e.drafting.policy is not None:
            p = e.drafting.policy
            extra = f" floor now {p.node_floor(1, 1):.3f}"
        print(f"{sys.argv[1]} {name:8s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f}{extra}", flush=True)
