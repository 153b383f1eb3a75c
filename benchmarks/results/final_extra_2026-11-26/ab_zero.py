"""c=64: requests with spec_tokens=0 vs adaptive requests whose policy always picks depth 0 (pure bookkeeping cost)."""
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
    return [0] * len(d) if FORCE[0] else d
SP.SpecPolicy.choose = choose
c = int(sys.argv[1]); reps = int(sys.argv[2])
prompts = stratified_sample(load_prompt_set(default_prompts_path()), 64)
be = EngineBackend("smollm2-135m", 64, warmup=0, engine_options={"num_threads": 2})
modes = {"none": Variant(spec_tokens=0), "auto0": Variant(spec_tokens=5, adaptive=True, tree_width=None), "auto": Variant(spec_tokens=5, adaptive=True, tree_width=None)}
with be.session("default", (modes["auto"],), prompts[0]) as run_once:
    run_once(modes["auto"], prompts[:16], 16, 0.0)
    tps = {m: [] for m in modes}
    order = ["none", "auto0", "auto"]
    for r in range(reps):
        for m in (order if r % 2 == 0 else order[::-1]):
            FORCE[0] = m == "auto0"
            run = run_once(modes[m], prompts, c, 0.0)
            tps[m].append(summarize(run.records, run.wall_s)["tokens_per_s"])
            print(f"c={c} rep {r} {m}: {tps[m][-1]:.2f}", flush=True)
for m, v in tps.items():
    print(m, f"{sum(v)/len(v):.2f}", " ".join(f"{x:.1f}" for x in v))
