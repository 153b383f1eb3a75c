import statistics, time, torch
from actors.model.attention_backends import set_attention_backend
from actors.model.loader import load_model
from benchmarks.op_count import StepRunner
model = load_model("smollm2-135m", device=torch.device("cpu")).model
set_attention_backend(model, "native", torch.device("cpu"))
for b, ctx in ((1, 2000), (4, 2000), (16, 1000)):
    runs = {dt: StepRunner(model, b, ctx, torch.device("cpu"), kv_dtype=getattr(torch, dt)).step("decode") for dt in ("float32", "bfloat16")}
    res = {c: [] for c in runs}
    for r in range(6):
        for c, run in (runs.items() if r % 2 == 0 else reversed(list(runs.items()))):
            run(); ts = []
            for _ in range(15):
                t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
            res[c].append(statistics.median(ts) * 1e3)
    print(f"B={b} ctx {ctx} decode ms:", {c: round(statistics.median(v), 2) for c, v in res.items()}, flush=True)
    del runs
