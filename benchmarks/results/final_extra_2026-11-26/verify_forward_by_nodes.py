import sys, time, torch, statistics
sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from benchmarks.engine_bench import EngineBackend
from cluster.config import EngineConfig, SpeculativeConfig
from actors.verifier import SeqChunk
from actors.tree import TokenTree
be = EngineBackend("smollm2-135m", None, seed=None, engine_options={"num_threads": 2})
eng = be.engine(EngineConfig(model="smollm2-135m", num_threads=2))
ver = eng.verifier
bs = ver.block_size
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 300
table = list(range(1, (ctx + 64) // bs + 2))
slot = lambda p: table[p // bs] * bs + p % bs
ids = [(i * 7919) % 40000 + 100 for i in range(ctx)]
ver.forward_logits_and_hidden([SeqChunk(ids, list(range(ctx)), [slot(p) for p in range(ctx)], ctx, table)], [ctx - 1])
def tree_of(shape):
    t = TokenTree.root(5)
    tips = [0]
    for w in shape:
        nodes = [t.add(tips[0], 100 + len(t.tokens) + j) for j in range(w)]
        tips = nodes
    return t
def chunk(tree):
    n = tree.size
    pos = tree.positions(ctx)
    mask = tree.ancestor_mask() if n > 1 else None
    return SeqChunk(tree.tokens, pos, [slot(ctx + i) for i in range(n)], ctx + n, table, mask)
shapes = {f"chain{k}": [1]*k for k in range(0, 12)}
shapes.update({"3,2,1": [3,2,1], "2,2,1": [2,2,1], "3,1,1": [3,1,1]})
times = {k: [] for k in shapes}
for rep in range(15):
    for k, sh in shapes.items():
        t = tree_of(sh)
        c = chunk(t)
        t0 = time.perf_counter()
        ver.forward_logits_and_hidden([c], list(range(t.size)))
        times[k].append(time.perf_counter() - t0)
for k, v in times.items():
    print(f"{k:8s} nodes={tree_of(shapes[k]).size} median {statistics.median(v)*1e3:.2f} ms  p25 {sorted(v)[7]*1e3:.2f}")
from torch.profiler import profile, ProfilerActivity
for k in ["chain0", "chain11"]:
    t = tree_of(shapes[k]); c = chunk(t)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            ver.forward_logits_and_hidden([c], list(range(t.size)))
    print(k); print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
