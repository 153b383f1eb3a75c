"""In one process, alternated: what a step without drafts costs in the plain engine and in the
default-draft engine (T=1 held-out, c=1), per clock phase."""
import sys, time
import torch
from benchmarks.alternate import heldout_requests
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine

torch.set_num_threads(2)
temp = float(sys.argv[1]); rounds = int(sys.argv[2])
msgs, params = heldout_requests(temperature=temp)
arms = {"plain": LLMEngine(EngineConfig(device="cpu", num_threads=2)),
        "default": LLMEngine(EngineConfig(device="cpu", num_threads=2, speculative=SpeculativeConfig.from_draft_arg(
            "default", 5, None, adaptive=True)))}
def hook(eng):
    rows = []
    d, orig_measure, orig_step = eng.drafting, eng.drafting.measure, eng.step
    cur = {}
    def measure(part, trees, computed, seconds):
        y = orig_measure(part, trees, computed, seconds)
        cur.update(drafted=y.drafted_seqs, tokens=y.drafted_tokens + y.plain_seqs, decode=y.decode_only)
        return y
    def step():
        cur.clear(); s0 = eng.clock.snapshot(); t = time.perf_counter(); out = orig_step()
        cur["wall"] = time.perf_counter() - t
        s1 = eng.clock.snapshot(); cur["phases"] = {k: s1[k] - s0[k] for k in s1 if k != "steps"}
        if cur.get("decode"): rows.append(dict(cur))
        return out
    d.measure, eng.step = measure, step
    return rows
logs = {k: hook(e) for k, e in arms.items()}
for r in range(rounds):
    order = list(arms) if r % 2 == 0 else list(arms)[::-1]
    for name in order:
        rows = logs[name]; n0 = len(rows); t0 = time.perf_counter()
        for m, p in zip(msgs, params):
            arms[name].generate([m], [p], chat=True)
        wall = time.perf_counter() - t0
        rs = rows[n0:]; tok = sum(x["tokens"] for x in rs)
        pl = [x for x in rs if not x["drafted"]]; dr = [x for x in rs if x["drafted"]]
        ph = {k: round(1000 * sum(x["phases"][k] for x in pl) / max(len(pl), 1), 2) for k in pl[0]["phases"]}
        print(f"round {r} {name}: {tok} tok {tok/wall:.1f} tok/s; plain steps {len(pl)} "
              f"{1000*sum(x['wall'] for x in pl)/max(len(pl),1):.2f} ms {ph}; drafted steps {len(dr)} "
              f"{1000*sum(x['wall'] for x in dr)/max(len(dr),1):.2f} ms {sum(x['tokens'] for x in dr)/max(len(dr),1):.2f} tok", flush=True)
