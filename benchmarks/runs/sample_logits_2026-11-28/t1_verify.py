# one-off, 2026-11-28 session K (benchmarks/ARCHIVE.md, 23:00 entry): run from the repo root with PYTHONPATH=.
import sys, time, torch, collections
import cluster.engine as ce
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
acc = collections.defaultdict(float); cnt = collections.Counter()
real = ce.verify_tree
def vt(seq, tree, rows, argmax):
    t = time.perf_counter(); r = real(seq, tree, rows, argmax); d = time.perf_counter() - t
    k = "plain" if tree.size == 1 else "tree"
    acc[k] += d; cnt[k] += 1; acc[k + "_rows"] += tree.size
    return r
ce.verify_tree = vt
draft = sys.argv[1]
spec = SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True) if draft != "none" else None
e = LLMEngine(EngineConfig(device="cpu", speculative=spec) if spec else EngineConfig(device="cpu"))
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts][:12]
params = [SamplingParams(max_tokens=p.budget(None), temperature=1.0) for p in prompts][:12]
e.generate(msgs[:1], params[:1], chat=True)
acc.clear(); cnt.clear()
before = e.clock.snapshot(); t0 = time.perf_counter()
outs = [e.generate([m], [p], chat=True)[0] for m, p in zip(msgs, params)]
w = time.perf_counter() - t0; n = e.clock.snapshot()["steps"] - before["steps"]
tok = sum(len(o.token_ids) for o in outs)
print(draft, "tokens", tok, "steps", n, "tok/s", round(tok / w, 1), "ms/step", round(w / n * 1e3, 2))
for k in ("plain", "tree"):
    if cnt[k]:
        print(f"  {k}: {cnt[k]} verifies, {acc[k]/cnt[k]*1e3:.3f} ms each, {acc[k+'_rows']/cnt[k]:.1f} rows")
