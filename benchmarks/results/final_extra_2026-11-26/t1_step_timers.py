import sys, time, torch, random, collections
sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from benchmarks.engine_bench import EngineBackend
from benchmarks.prompt_set import load_prompt_set, default_prompts_path
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
import cluster.engine as E, actors.verifier as V, cluster.drafting as D
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; cnt[key] += 1; return r
    setattr(obj, name, g)
wrap(E.LLMEngine, "_propose", "propose")
bysize = collections.defaultdict(list)
f0 = V.Verifier.forward_logits_and_hidden
def fwd(self, chunks, rows, *a):
    t = time.perf_counter(); r = f0(self, chunks, rows, *a); dt = time.perf_counter() - t
    acc["forward"] += dt; cnt["forward"] += 1
    n = sum(len(c.token_ids) for c in chunks)
    bysize[(n, chunks[0].window_mask is not None) if n < 20 else "prefill"].append(dt)
    return r
V.Verifier.forward_logits_and_hidden = fwd
wrap(E.LLMEngine, "_apply", "apply")
import actors.eagle.proposer as P, actors.eagle.head as H, actors.sampling as S, cluster.engine as CE
wrap(P.EagleProposer, "_catch_up", "p.catchup")
wrap(P.EagleProposer, "_choose", "p.choose")
wrap(P.EagleProposer, "_draft_step", "p.dstep")
wrap(P.EagleProposer, "_whole_vocab", "p.whole")
wrap(H.EagleHead, "logits", "h.logits")
wrap(P, "sample_distinct", "p.sdistinct")
wrap(P, "logits_to_probs", "p.l2p")
wrap(E.LLMEngine, "_verify", "a.verify")
wrap(CE, "sample_next", "a.sample_next")
import actors.drafter as DR
wrap(P.EagleProposer, "propose", "p.propose_eagle")

wrap(E, "observe_committed", "observe")
wrap(E.LLMEngine, "run_step", "step")
n = int(sys.argv[2]); mode = sys.argv[1]
ps = load_prompt_set(default_prompts_path()); random.seed(3); ps = random.sample(ps, n)
be = EngineBackend("smollm2-135m", None, seed=None, engine_options={"num_threads": 2})
K = None if mode == "none" else int(mode)
spec = SpeculativeConfig.from_draft_arg("none" if K is None else "default", K or 3, None, adaptive=False)
eng = be.engine(EngineConfig(model="smollm2-135m", speculative=spec, num_threads=2))
eng.generate([ps[0].prompt], SamplingParams(max_tokens=8), chat=True)
acc.clear(); cnt.clear()
temp = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
params = [SamplingParams(max_tokens=min(p.max_tokens, 128), temperature=temp, seed=None, spec_tokens=K) for p in ps]
torch.manual_seed(0)
t = time.perf_counter()
outs = eng.generate([p.prompt for p in ps], params, chat=True, concurrency=1)
wall = time.perf_counter() - t
ntok = sum(o.num_output_tokens for o in outs)
steps = cnt["step"]
print(mode, "T", temp, "tokens", ntok, "steps", steps, "tok/step %.2f" % (ntok / steps), "wall %.2f" % wall, "tok/s %.2f" % (ntok / wall))
for k in acc: print(f"  {k:8s} {acc[k]*1e3/steps:7.2f} ms/step  (n={cnt[k]})")
print("  other   %.2f ms/step" % ((wall - acc['step']) * 1e3 / steps))

import statistics
for k in sorted(bysize, key=str):
    v = bysize[k]; print("  fwd", k, "n=%d" % len(v), "median %.2f ms" % (statistics.median(v)*1e3), "sum %.2f s" % sum(v))
