"""Phase times of a verify forward of a K-chain at context 300 (B=1), native CPU path, 2 threads."""
import torch
import benchmarks.op_count as oc
from benchmarks.step_phases import step_phases
from actors.tree import TokenTree
from actors.model.attention_backends import set_attention_backend
from actors.model.loader import load_model
from kernels import cpu_native as cn
torch.set_num_threads(2)
cpu = torch.device("cpu")
model = load_model("smollm2-135m", device=cpu).model
set_attention_backend(model, "auto", cpu)
oc.TREE_PARENTS = [-1] + [0] * 40
r = oc.StepRunner(model, 1, 300, cpu)
def run(k):
    tree = TokenTree.chain(5, list(range(6, 6 + k))) if k else TokenTree.root(5)
    mask = tree.ancestor_mask() if tree.size > 1 else None
    chunks = [r._chunk(0, tree.tokens, tree.positions(300), mask)]
    return lambda: r.verifier.forward_logits(chunks, list(range(tree.size)))
print("rows", "wall", *cn.PHASES, "lm_head", sep=" | ")
for k in (0, 10, 14, 15, 16, 20, 23, 24, 32):
    ms = step_phases(run(k), 60)
    print(k + 1, f"{ms['wall']:.2f}", *[f"{ms[p]:.2f}" for p in cn.PHASES], f"{ms['lm_head']:.2f}", sep=" | ", flush=True)
