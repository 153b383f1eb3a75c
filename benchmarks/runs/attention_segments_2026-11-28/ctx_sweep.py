import statistics, time, torch
from actors.model.attention_backends import set_attention_backend
from actors.model.loader import load_model
from benchmarks.op_count import StepRunner
model = load_model("smollm2-135m", device=torch.device("cpu")).model
set_attention_backend(model, "native", torch.device("cpu"))
runs = {c: StepRunner(model, 1, c, torch.device("cpu")).step("decode") for c in (8, 40, 150, 300, 500)}
res = {c: [] for c in runs}
for r in range(6):
    for c, run in (runs.items() if r % 2 == 0 else reversed(list(runs.items()))):
        run(); ts = []
        for _ in range(20):
            t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
        res[c].append(statistics.median(ts) * 1e3)
print({c: round(statistics.median(v), 2) for c, v in res.items()})
