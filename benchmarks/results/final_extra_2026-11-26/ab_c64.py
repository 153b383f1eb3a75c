"""ABBA at concurrency C: plain (spec_tokens=0), "auto0" (adaptive requests whose policy is forced to depth 0:
the bookkeeping alone) and adaptive. Usage: ab_c64.py C REPS [C1,C2,... run first as the policy's history]."""
import sys, time, torch
sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from benchmarks.engine_bench import EngineBackend
from benchmarks.prompt_set import default_prompts_path, load_prompt_set, stratified_sample
from benchmarks.results import Variant, summarize
import actors.spec_policy as SP
FORCE = [False]
orig = SP.SpecPolicy.choose
def choose(self, slots, *a, **k):
    d = orig(self, slots, *a, **k)
    if FORCE[0]: return [0] * len(d)
    STATS.append((len(d), sum(1 for x in d if x > 0), sum(d)))
    return d
STATS = []
SP.SpecPolicy.choose = choose
c = int(sys.argv[1]); reps = int(sys.argv[2])
prompts = stratified_sample(load_prompt_set(default_prompts_path()), 64)
be = EngineBackend("smollm2-135m", 64, warmup=0, engine_options={"num_threads": 2})
modes = {"none": Variant(spec_tokens=0), "auto0": Variant(spec_tokens=5, adaptive=True, tree_width=None), "auto": Variant(spec_tokens=5, adaptive=True, tree_width=None)}
with be.session("default", (modes["auto"],), prompts[0]) as run_once:
    run_once(modes["auto"], prompts[:16], 16, 0.0)
    for cc in [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else []:
        run = run_once(modes["auto"], prompts, cc, 0.0)
        print(f"history c={cc}: {summarize(run.records, run.wall_s)['tokens_per_s']:.2f}", flush=True)
    tps = {m: [] for m in modes}
    order = ["none", "auto0", "auto"]
    for r in range(reps):
        for m in (order if r % 2 == 0 else order[::-1]):
            FORCE[0] = m == "auto0"; STATS.clear()
            run = run_once(modes[m], prompts, c, 0.0)
            tps[m].append(summarize(run.records, run.wall_s)["tokens_per_s"])
            ns = sum(x[0] for x in STATS) or 1
            print(f"c={c} rep {r} {m}: {tps[m][-1]:.2f}  steps {len(STATS)} drafting frac {sum(x[1] for x in STATS)/ns:.3f} mean depth {sum(x[2] for x in STATS)/ns:.3f}", flush=True)
for m, v in tps.items():
    print(m, f"{sum(v)/len(v):.2f}", " ".join(f"{x:.1f}" for x in v))
