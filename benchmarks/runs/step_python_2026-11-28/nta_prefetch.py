"""Tried, not kept: products.h prefetching the weight stream with another locality hint, built with
-DSPECRAY_STREAM_HINT=H (an experimental macro in vec16.h, not committed): HINT=0|1|2|3 python nta_prefetch.py 300."""
import time, statistics, torch, sys, os
from kernels import cpu_native
hint = os.environ.get("HINT")
if hint is not None:
    orig = cpu_native.build
    cpu_native.build = lambda *a, **k: orig((f"-DSPECRAY_STREAM_HINT={hint}",), **k)
from benchmarks.op_count import StepRunner
from cluster.config import EngineConfig
from cluster.engine import LLMEngine
torch.set_num_threads(2)
e = LLMEngine(EngineConfig(device="cpu"))
model = e.verifier.model
r = StepRunner(model, 1, int(sys.argv[1]), torch.device("cpu"))
out = []
for k in ["decode", "chain", "tree"]:
    f = r.step(k)
    for _ in range(5): f()
    meds = []
    for rnd in range(5):
        ts = []
        for _ in range(20):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        meds.append(statistics.median(ts))
    out.append(f"{k} {1e3*statistics.median(meds):.3f}")
print("hint", hint, " ".join(out))
