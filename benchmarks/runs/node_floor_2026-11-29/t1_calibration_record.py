"""T=1.0 unseeded, the head's sampled chains (default draft, fixed K=3, one draw a depth), 24 held-out
prompts c=1: each drawn node's q(x), its path product, depth, and whether verification accepted it."""
import sys, json, torch
from actors.sampling_params import SamplingParams
from actors.tree import SubsetProposal
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
import cluster.engine as ce
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
REC = []
ov = ce.verify_tree
def vt(seq, tree, rows, argmax):
    res = ov(seq, tree, rows, argmax)
    if tree.size > 1 and all(isinstance(q, SubsetProposal) for q in tree.draft_probs[1:]):
        acc = set(res.accepted_nodes)
        path = 1.0; out = []
        for i in range(1, tree.size):
            qx = tree.draft_probs[i].token_prob; path *= qx
            qmax = float(tree.draft_probs[i].probs.max())
            out.append([qx, path, qmax, int(i in acc)])
        REC.append(out)
    return res
ce.verify_tree = vt
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
msgs = [p.messages for p in prompts]
e = LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg("default", 3, None, adaptive=False)))
for rep in range(2):
    for i, m in enumerate(msgs):
        p = SamplingParams(max_tokens=prompts[i].budget(None), temperature=1.0, spec_tokens=3)
        e.generate([m], [p], chat=True)
json.dump(REC, open("/tmp/s/t1_calib.json", "w"))
import numpy as np
nodes = [n + [d] for t in REC for d, n in enumerate(t, 1)]
a = np.array(nodes)
print("chains", len(REC), "nodes", len(a))
for col, name in ((0, "q(x)"), (1, "path q"), (2, "max q")):
    print("by", name)
    for lo, hi in [(0,.1),(.1,.2),(.2,.4),(.4,.6),(.6,.8),(.8,.95),(.95,1.01)]:
        for d in (1, 2, 3):
            m = (a[:, col] >= lo) & (a[:, col] < hi) & (a[:, 4] == d)
            # accepted given parent accepted: among nodes whose parent was accepted
            if d > 1:
                prev = np.array([True] + [False])  # placeholder
            if m.sum(): print(f"  [{lo:.2f},{hi:.2f}) depth {d}: n={m.sum():4d} accepted={a[m, 3].mean():.3f}")
