"""paged_attention of b15ff4f against this tree's, alternated in one process: run from the repository
root, `PYTHONPATH=. python benchmarks/runs/attention_2026-11-28/attention_before_after.py`."""
import torch, time, statistics
from kernels import cpu_native as cn
torch.set_num_threads(2)
# the previous kernel (b15ff4f) built under another op namespace, then the tree's own
import subprocess
from pathlib import Path
src = Path("kernels/csrc/attention.cpp")
new_src = src.read_text()
src.write_text(subprocess.run(["git", "show", "b15ff4f:kernels/csrc/attention.cpp"], capture_output=True, text=True,
                              check=True).stdout)
try:
    cn.build(namespace="specray_cpu_old2")
finally:
    src.write_text(new_src)
cn.load()
variants = {"before": torch.ops.specray_cpu_old2.paged_attention, "after": torch.ops.specray_cpu.paged_attention}
g = torch.Generator().manual_seed(0)
h, kvh, d, bs, L = 9, 3, 64, 16, 30
parents = [-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7]
m = torch.zeros(11, 11, dtype=torch.bool)
for i in range(11):
    j = i
    while j >= 0: m[i, j] = True; j = parents[j]
print("| keys | sequences | tokens each | before ms | after ms |\n|---|---|---|---|---|")
for ctx in (300, 1500):
    for B in (1, 4):
        nblk = B * (ctx // bs + 2)
        ks = [torch.randn(nblk, bs, kvh, d, generator=g) for _ in range(L)]; vs = [torch.randn(nblk, bs, kvh, d, generator=g) for _ in range(L)]
        tables = torch.arange(nblk).view(B, -1)
        for qlen in (1, 6, 11):
            q = torch.randn(B * qlen, h, d, generator=g)
            qsl = torch.arange(0, B * qlen + 1, qlen); lens = torch.full((B,), ctx + qlen)
            wins = [m] * B if qlen == 11 else []
            ts = {k: [] for k in variants}
            for rep in range(10):
                for name in (("before", "after") if rep % 2 else ("after", "before")):
                    t0 = time.perf_counter()
                    for l in range(L): variants[name](q, ks[l], vs[l], qsl, lens, tables, 0.125, wins)
                    ts[name].append((time.perf_counter() - t0) * 1e3)
            print(f"| {ctx} | {B} | {qlen}{' (tree)' if qlen == 11 else ''} | {statistics.median(ts['before']):.2f} | {statistics.median(ts['after']):.2f} |", flush=True)
