"""T=1.0 unseeded, held-out c=1, the default draft (adaptive): verification reading p(token) and the
residual natively vs the tensor path (toggled per arm in one process), alternated with plain.
Usage: PYTHONPATH=. python <this> ROUNDS"""
import sys, time, torch
import actors.spec_verify as sv
from actors.sampling import native_row
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=1.0) for p in prompts]
spec = lambda: SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
arms = {"plain": (LLMEngine(EngineConfig(device="cpu")), native_row),
        "tensor verify": (LLMEngine(EngineConfig(device="cpu", speculative=spec())), lambda l, p: False),
        "native verify": (LLMEngine(EngineConfig(device="cpu", speculative=spec())), native_row)}
for e, _ in arms.values():
    e.generate(msgs[:2], params[:2], chat=True)
for rnd in range(int(sys.argv[1])):
    for name in (list(arms) if rnd % 2 == 0 else list(reversed(arms))):
        e, nr = arms[name]
        sv.native_row = nr
        before = e.clock.snapshot(); t0 = time.perf_counter()
        outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
        w = time.perf_counter() - t0; a = e.clock.snapshot(); n = a["steps"] - before["steps"]
        tok = sum(len(o.token_ids) for o in outs)
        print(f"T=1 {name:13s} tokens {tok} steps {n} tok/step {tok / n:.2f} tok/s {tok / w:.1f} "
              f"verify ms/step {1e3 * (a['verify'] - before['verify']) / n:.3f}", flush=True)
