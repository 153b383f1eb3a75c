"""Per-step diagnosis of the default draft at T=1 on a fresh engine: predicted vs realised goodput."""
import sys, time, json
import torch
from benchmarks.alternate import heldout_requests
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine

torch.set_num_threads(2)
msgs, params = heldout_requests(temperature=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
arm = sys.argv[2] if len(sys.argv) > 2 else "default"
spec = None if arm == "plain" else SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)
eng = LLMEngine(EngineConfig(device="cpu", num_threads=2, **({} if spec is None else {"speculative": spec})))
rows = []
d = eng.drafting
orig_measure, orig_step = d.measure, eng.step
cur = {}
def measure(part, trees, computed, seconds):
    y = orig_measure(part, trees, computed, seconds)
    cur.update(seconds=seconds, drafted=y.drafted_seqs, tokens=y.drafted_tokens + y.plain_seqs,
               depth=max((t.max_depth for t in trees.values()), default=0),
               nodes=sum(t.size - 1 for t in trees.values()),
               goodput=d.policy.last_goodput if d.policy else None, decode=y.decode_only,
               src=sorted(map(str, d.drafted_sources(part, trees))) if d.policy else [])
    return y
def step():
    cur.clear(); s0 = eng.clock.snapshot(); t = time.perf_counter(); out = orig_step(); cur["wall"] = time.perf_counter() - t
    s1 = eng.clock.snapshot(); cur["phases"] = {k: s1[k] - s0[k] for k in s1 if k != "steps"}
    if cur.get("decode"): rows.append(dict(cur))
    return out
d.measure, eng.step = measure, step
t0 = time.perf_counter()
for i, (m, p) in enumerate(zip(msgs, params)):
    n0 = len(rows)
    o = eng.generate([m], [p], chat=True)[0]
    r = rows[n0:]
    w = sum(x["wall"] for x in r); tok = sum(x["tokens"] for x in r)
    dr = [x for x in r if x["drafted"]]
    print(f"req {i:2d}: {tok:4d} tok {tok/w:6.1f} tok/s steps {len(r)} drafted {len(dr)} "
          f"mean depth {sum(x['depth'] for x in dr)/max(len(dr),1):.2f} tok/drafted step {sum(x['tokens'] for x in dr)/max(len(dr),1):.2f} "
          f"drafted step ms {1000*sum(x['wall'] for x in dr)/max(len(dr),1):.1f} plain step ms {1000*sum(x['wall'] for x in r if not x['drafted'])/max(len(r)-len(dr),1):.1f}", flush=True)
print("total s", time.perf_counter() - t0)
import collections
for label, sel in (("plain", lambda x: not x["drafted"]), ("drafted", lambda x: x["drafted"])):
    rs = [x for x in rows if sel(x)]
    for depth in sorted({x["nodes"] for x in rs}):
        r2 = [x for x in rs if x["nodes"] == depth]
        ph = {k: round(1000 * sum(x["phases"][k] for x in r2) / len(r2), 2) for k in r2[0]["phases"]}
        print(label, "nodes", depth, "n", len(r2), "tok/step", round(sum(x["tokens"] for x in r2)/len(r2), 2), "ms", ph)
json.dump(rows, open(f"/tmp/s/diag_{arm}.json", "w"))
pol = d.policy
if pol:
    for src, est in pol.acceptance.items():
        print("src", src, [round(x, 3) for x in est.global_rates()], [round(x,1) for x in est.glob.offered])
    print("verify", pol.verify_cost.buckets if hasattr(pol.verify_cost, "buckets") else pol.verify_cost)
    print("draft", {k: v.buckets for k, v in pol.draft_cost_by_source.items()})
