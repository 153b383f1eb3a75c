"""ms per verify forward of a K-chain at context 300 (B=1), native CPU backend, 2 threads."""
import time, torch
import benchmarks.op_count as oc
from actors.tree import TokenTree
from actors.model.attention_backends import set_attention_backend
from actors.model.loader import load_model
torch.set_num_threads(2)
cpu = torch.device("cpu")
model = load_model("smollm2-135m", device=cpu).model
set_attention_backend(model, "auto", cpu)
oc.TREE_PARENTS = [-1] + [0] * 40  # room for 41 tokens per sequence
r = oc.StepRunner(model, 1, 300, cpu)
def run(k):
    tree = TokenTree.chain(5, list(range(6, 6 + k))) if k else TokenTree.root(5)
    mask = tree.ancestor_mask() if tree.size > 1 else None
    chunks = [r._chunk(0, tree.tokens, tree.positions(300), mask)]
    return lambda: r.verifier.forward_logits(chunks, list(range(tree.size)))
for rep in range(2):
    for k in (0, 5, 10, 16, 20, 24, 32):
        f = run(k); f()
        ts = []
        for _ in range(40):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        ts.sort()
        print(f"K={k:2d} rows {k+1:2d}: {1e3*ts[len(ts)//2]:.2f} ms", flush=True)
