"""Wall time inside named functions per step for T=1.0 unseeded held-out generation at c=1, fixed
K chain of single draws (guard off): where a drafted step's extra time goes.
Usage: PYTHONPATH=. python <this> K SIBLINGS [N_PROMPTS] [greedy]"""
import sys, time, torch, importlib
from collections import defaultdict
from actors.proposers.eagle import EagleProposer
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.spec_guard import FallbackGuardConfig
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
k, sib = int(sys.argv[1]), int(sys.argv[2]); n = int(sys.argv[3]) if len(sys.argv) > 3 else 24
temp = 0.0 if "greedy" in sys.argv else 1.0
EagleProposer.sampled_siblings = lambda self, source: sib if source == self.name else 1
T = defaultdict(float); C = defaultdict(int)
def wrap(modname, qual):
    mod = importlib.import_module(modname)
    owner, attr = (mod, qual) if "." not in qual else (getattr(mod, qual.split(".")[0]), qual.split(".")[1])
    f = getattr(owner, attr)
    def w(*a, **kw):
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            T[qual] += time.perf_counter() - t; C[qual] += 1
    setattr(owner, attr, w)
for m, q in [("cluster.drafting", "Drafting.propose"), ("actors.proposers.combined", "FallbackProposer.propose"),
             ("actors.proposers.ngram", "NgramProposer.propose"), ("actors.proposers.eagle", "EagleProposer._catch_up"),
             ("actors.proposers.eagle", "EagleProposer._choose"), ("actors.proposers.eagle", "EagleProposer._draft_step"),
             ("actors.proposers.head_kv", "native_head_step"), ("actors.proposers.eagle", "head_step"),
             ("cluster.engine", "verify_tree"), ("cluster.engine", "LLMEngine._verify_and_commit"),
             ("cluster.engine", "LLMEngine._forward"), ("cluster.engine", "LLMEngine._plan_forward"),
             ("cluster.drafting", "Drafting.requests"), ("cluster.drafting", "Drafting.observe_features"),
             ("cluster.drafting", "Drafting.learn"), ("cluster.drafting", "Drafting.measure")]:
    try:
        wrap(m, q)
    except AttributeError as e:
        print("skip", q, e)
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts][:n]
params = [SamplingParams(max_tokens=p.budget(None), temperature=temp) for p in prompts][:n]
if k:
    spec = SpeculativeConfig.from_draft_arg("default", k, None, adaptive=False)
    spec.fallback_guard = FallbackGuardConfig(enabled=False)
    e = LLMEngine(EngineConfig(device="cpu", speculative=spec))
else:
    e = LLMEngine(EngineConfig(device="cpu"))
e.generate(msgs[:2], params[:2], chat=True)
T.clear(); C.clear()
before = e.clock.snapshot(); t0 = time.perf_counter()
outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
w = time.perf_counter() - t0; after = e.clock.snapshot(); steps = after["steps"] - before["steps"]
tok = sum(len(o.token_ids) for o in outs)
print(f"K={k} siblings={sib} T={temp}: tokens {tok} steps {steps} tok/step {tok / steps:.2f} ms/step {1e3 * w / steps:.2f} ms/tok {1e3 * w / tok:.2f}")
for q in sorted(T, key=T.get, reverse=True):
    print(f"  {q:34s} {1e3 * T[q] / steps:7.3f} ms/step  ({C[q] / steps:.2f} calls/step)")
