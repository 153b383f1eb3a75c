# one-off, 2026-11-28 session K (benchmarks/ARCHIVE.md, 23:00 entry): run from the repo root with PYTHONPATH=.
import time, torch
from actors.sampling import logits_to_probs, sample
torch.set_num_threads(2)
x = torch.randn(49152) * 3
buf = torch.empty(50_000_000)
def t(fn, n=300, cold=True):
    ts = []
    for _ in range(n):
        if cold: buf.add_(1.0) if False else buf.fill_(1.0)
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    ts.sort(); return ts[len(ts)//2] * 1e6
p = logits_to_probs(x, 1.0)
for cold in (False, True):
    print("cold" if cold else "warm",
          f"logits_to_probs {t(lambda: logits_to_probs(x, 1.0), cold=cold):.0f} us,",
          f"sample {t(lambda: sample(p), cold=cold):.0f} us,",
          f"div {t(lambda: x / 1.0, cold=cold):.0f} us, softmax {t(lambda: torch.softmax(x, -1), cold=cold):.0f} us,",
          f"double {t(lambda: p.double(), cold=cold):.0f} us, cumsum64 {t(lambda: p.double().cumsum(0), cold=cold):.0f} us")
