# one-off, 2026-11-28 session K (see benchmarks/ARCHIVE.md, 23:00 entry); phase.py loaded an instrumented copy of kernels/csrc from /tmp/s/prof, the prototype of benchmarks.step_phases
import time, torch, statistics
from kernels import cpu_native as cn
torch.set_num_threads(2)
cn.load()
L, ctx, bs, d = 30, 300, 16, 64
def setup(B, h, kvh):
    per = -(-(ctx) // bs)
    caches = [(torch.randn(B * per + 1, bs, kvh, d), torch.randn(B * per + 1, bs, kvh, d)) for _ in range(L)]
    tables = torch.arange(B * per).view(B, per)
    q = torch.randn(B, h, d)
    qsl = torch.arange(B + 1)
    lens = torch.full((B,), ctx)
    return caches, tables, q, qsl, lens
def run(setup_, reps=20):
    caches, tables, q, qsl, lens = setup_
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for k, v in caches:
            cn.paged_attention(q, k, v, qsl, lens, tables, 0.125, None)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
for B in (16, 4, 1):
    a = setup(B, 9, 3); b = setup(3 * B, 3, 1)
    ra, rb = [], []
    for _ in range(3):
        ra.append(run(a)); rb.append(run(b))
    mb = 2 * L * B * ctx * 3 * d * 4 / 1e6
    print(f"B={B}: interleaved heads {min(ra):.2f} ms, one head per sequence {min(rb):.2f} ms ({mb:.0f} MB: {mb/min(ra):.1f} vs {mb/min(rb):.1f} GB/s)")
