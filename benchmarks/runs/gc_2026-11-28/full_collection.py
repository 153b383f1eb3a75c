# A full garbage collection in a process that has loaded the engine, with and without freezing the
# loaded objects first; and the collections an 8-prompt c=1 run triggers.
# usage: python benchmarks/runs/gc_2026-11-28/full_collection.py none [freeze]   (from the repository root)
import gc, sys, time, json, torch
torch.set_num_threads(2)
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from actors.sampling_params import SamplingParams
eng = LLMEngine(EngineConfig(speculative=SpeculativeConfig(method=sys.argv[1])))
if len(sys.argv) > 2 and sys.argv[2] == "freeze":
    from actors.gc_pauses import freeze_loaded
    freeze_loaded()
print("objects tracked", len(gc.get_objects()), "frozen", gc.get_freeze_count())
events = []; start = {}
def cb(phase, info):
    if phase == "start": start["t"] = time.perf_counter()
    else: events.append((info["generation"], (time.perf_counter() - start["t"]) * 1e3))
gc.callbacks.append(cb)
prompts = [json.loads(l)["messages"] for l in open("benchmarks/runs/gc_2026-11-28/h8.jsonl")]
t = time.perf_counter()
out = eng.generate(prompts, SamplingParams(max_tokens=128), chat=True, concurrency=1)
wall = time.perf_counter() - t
gc.callbacks.remove(cb)
ntok = sum(len(o.token_ids) for o in out)
by = {}
for g, ms in events: by.setdefault(g, []).append(ms)
print(f"wall {wall:.2f}s tokens {ntok}")
for g in sorted(by): print(f"gen{g}: {len(by[g])} collections, total {sum(by[g]):.1f} ms, max {max(by[g]):.2f} ms")
t=time.perf_counter(); gc.collect(); print("full collect ms", (time.perf_counter()-t)*1e3)
