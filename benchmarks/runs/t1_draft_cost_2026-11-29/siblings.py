"""T=1.0 unseeded, 24 held-out prompts, c=1: sampled siblings at the first depth (3, today's, vs 1)
with the adaptive default draft, and fixed K=1/K=2 chains of one draw (guard off), against plain;
arms alternated over rounds in one process. Usage: PYTHONPATH=. python <this> ROUNDS"""
import sys, time, torch
from actors.proposers.eagle import EagleProposer
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.spec_guard import FallbackGuardConfig
from cluster.step_clock import PHASES
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=1.0) for p in prompts]
SIB = {"sib": 3}
EagleProposer.sampled_siblings = lambda self, source: SIB["sib"] if source == self.name else 1
def engine(k, guard=True):
    if k is None:
        return LLMEngine(EngineConfig(device="cpu"))
    spec = SpeculativeConfig.from_draft_arg("default", 5 if k == "auto" else k, None, adaptive=k == "auto")
    if not guard:
        spec.fallback_guard = FallbackGuardConfig(enabled=False)
    return LLMEngine(EngineConfig(device="cpu", speculative=spec))
arms = {"none": (engine(None), 1), "auto sib3": (engine("auto"), 3), "auto sib1": (engine("auto"), 1),
        "K1 sib1 noguard": (engine(1, False), 1), "K2 sib1 noguard": (engine(2, False), 1),
        "K1 sib3 noguard": (engine(1, False), 3)}
for name, (e, s) in arms.items():
    SIB["sib"] = s
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[1])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e, s = arms[name]
        SIB["sib"] = s
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; after = e.clock.snapshot()
        n = after["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        ph = " ".join(f"{k} {1e3 * (after[k] - before[k]) / n:.2f}" for k in PHASES)
        print(f"{name:16s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f} ms/tok {w / tok * 1e3:.2f} ms/step {w / n * 1e3:.2f} | {ph}", flush=True)
