"""ABBA of unseeded T=1 draft shapes at K=3 (monkeypatched DraftPlanning)."""
import sys, time, torch, random, json
sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from benchmarks.engine_bench import EngineBackend
from benchmarks.prompt_set import load_prompt_set, default_prompts_path
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
import cluster.drafting as CD
SHAPE = None
orig_ws, orig_dn = CD.DraftPlanning._with_siblings, CD.DraftPlanning._draft_nodes
def ws(self, seq, exp, slots):
    if SHAPE is None or seq.params.deterministic: return orig_ws(self, seq, exp, slots)
    return list(SHAPE[:len(exp)])
def dn(self, seq, exp):
    if SHAPE is None or seq.params.deterministic: return orig_dn(self, seq, exp)
    return sum(SHAPE[:len(exp)])
CD.DraftPlanning._with_siblings, CD.DraftPlanning._draft_nodes = ws, dn
shapes = [json.loads(s) for s in sys.argv[1].split(";")]
n = int(sys.argv[2]); rounds = int(sys.argv[3])
ps = load_prompt_set(default_prompts_path()); random.seed(11); ps = random.sample(ps, n)
be = EngineBackend("smollm2-135m", None, seed=None, engine_options={"num_threads": 2})
spec = SpeculativeConfig.from_draft_arg("default", 3, None, adaptive=False)
cfg = EngineConfig(model="smollm2-135m", speculative=spec, num_threads=2)
first = be.engine(cfg)
first.generate([ps[0].prompt], SamplingParams(max_tokens=8), chat=True)
prop = first.proposer
res = {json.dumps(s): [] for s in shapes}
order = []
for r in range(rounds):
    order += shapes if r % 2 == 0 else shapes[::-1]
for s in order:
    SHAPE = s
    eng = be.engine(cfg, prop)
    params = [SamplingParams(max_tokens=min(p.max_tokens, 256), temperature=1.0, seed=None, spec_tokens=3 if s else 0) for p in ps]
    t = time.perf_counter()
    outs = eng.generate([p.prompt for p in ps], params, chat=True, concurrency=1)
    wall = time.perf_counter() - t
    tok = sum(o.num_output_tokens for o in outs); drafts = sum(o.num_drafts for o in outs); acc = sum(o.num_accepted_tokens for o in outs)
    pos = [sum(o.accepted_per_pos[i] if i < len(o.accepted_per_pos) else 0 for o in outs) / max(drafts, 1) for i in range(3)]
    res[json.dumps(s)].append((tok / wall, tok, drafts, acc))
    print(json.dumps(s), f"tok/s {tok/wall:.2f} tokens {tok} drafts {drafts} acc/draft {acc/max(drafts,1):.3f} pos {[round(x,3) for x in pos]}", flush=True)
print("summary")
for k, v in res.items():
    tps = sum(x[0] for x in v) / len(v); d = sum(x[2] for x in v); a = sum(x[3] for x in v)
    print(k, f"mean tok/s {tps:.2f}  acc/draft {a/max(d,1):.3f}")
