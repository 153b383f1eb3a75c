import sys, time, torch
sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from benchmarks.engine_bench import EngineBackend
from benchmarks.prompt_set import default_prompts_path, load_prompt_set, stratified_sample
from cluster.config import EngineConfig
from actors.sampling_params import SamplingParams
import actors.model.attention as A, actors.verifier as V, collections
acc = collections.defaultdict(float)
def wrap(mod, name, key):
    f = getattr(mod, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; return r
    setattr(mod, name, g)
wrap(A, "paged_attention", "attention")
import actors.model.llama as L
if hasattr(L, "paged_attention"): wrap(L, "paged_attention", "attention_llama")
wrap(V.Verifier, "forward_logits_and_hidden", "forward")
prompts = stratified_sample(load_prompt_set(default_prompts_path()), 64)
be = EngineBackend("smollm2-135m", 64, warmup=0, engine_options={"num_threads": 2})
eng = be.engine(EngineConfig(model="smollm2-135m", num_threads=2))
t = time.perf_counter()
outs = eng.generate([p.prompt for p in prompts], [SamplingParams(max_tokens=64)] * 64, chat=True, concurrency=64)
print("wall %.1f s tokens %d" % (time.perf_counter() - t, sum(o.num_output_tokens for o in outs)), {k: round(v, 2) for k, v in acc.items()})
