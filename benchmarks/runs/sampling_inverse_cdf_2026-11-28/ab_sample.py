"""A/B in one process: inverse-CDF sample() (new) vs the exponential race (old), plain decoding at T=1."""
import sys, time, json
import actors.sampling as S
from actors.sampling_params import SamplingParams
from benchmarks.options import select_prompts
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
new = S.sample
def old(probs, generator=None):
    return S._race_winner(probs, S.exponential_draws(probs.shape[0], generator, probs.device))
conc, n, max_tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
_, prompts = select_prompts(None, n, 0)
msgs = [p.messages for p in prompts]
engine = LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig(method="none"), max_num_seqs=max(conc, 1), num_threads=2))
params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True) for _ in prompts]
engine.generate(msgs[:2], params[:2], chat=True, concurrency=conc)
res = {"old": [], "new": []}
for name in ("old", "new", "new", "old"):
    S.sample = old if name == "old" else new
    b = engine.clock.snapshot(); t = time.perf_counter()
    outs = engine.generate(msgs, params, chat=True, concurrency=conc)
    wall = time.perf_counter() - t; a = engine.clock.snapshot(); steps = a["steps"] - b["steps"]
    toks = sum(len(o.token_ids) for o in outs)
    r = dict(tok_s=round(toks / wall, 2), verify_ms_per_step=round((a["verify"] - b["verify"]) * 1e3 / steps, 2), steps=steps, tokens=toks)
    res[name].append(r); print(name, r, flush=True)
print(json.dumps(res))
