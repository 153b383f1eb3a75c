"""Record each head-grown tree's node path scores and which nodes greedy verification accepted
(default draft, adaptive K<=5, w2 n10, held-out + bench500 24, c=1)."""
import sys, json, math, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
import cluster.engine as ce
from actors.proposers import dynamic_tree
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
SC = {}
orig = dynamic_tree.DraftPool.to_tree
def to_tree(self, n):
    t = orig(self, n)
    # rebuild the score of each tree node: walk nodes by (token, parent) matching pool order
    keep = []; kept = {-1}
    for i in sorted(range(len(self.tokens)), key=self._rank):
        if len(keep) >= n: break
        if self.parents[i] in kept: keep.append(i); kept.add(i)
    order = sorted(keep, key=lambda i: (self.depths[i], self._rank(i)))
    SC[id(t)] = [0.0] + [self.scores[i] for i in order]
    return t
dynamic_tree.DraftPool.to_tree = to_tree
REC = []
ov = ce.verify_tree
def vt(seq, tree, rows, argmax):
    res = ov(seq, tree, rows, argmax)
    s = SC.pop(id(tree), None)
    if s is not None and tree.size > 1:
        acc = set(res.accepted_nodes)
        REC.append([[s[i], tree.parents[i], int(i in acc)] for i in range(1, tree.size)])
    return res
ce.verify_tree = vt
out = {}
for name in ("heldout", "bench500"):
    _, prompts = select_prompts(PROMPT_SETS[name], 24 if name == "bench500" else None, 0)
    msgs = [p.messages for p in prompts]
    params = [SamplingParams(max_tokens=p.budget(None), temperature=0.0) for p in prompts]
    e = LLMEngine(EngineConfig(device="cpu", speculative=SpeculativeConfig.from_draft_arg("default", 5, None, adaptive=True)))
    e.generate(msgs[:2], params[:2], chat=True)
    REC.clear()
    for m, p in zip(msgs, params):
        e.generate([m], [p], chat=True)
    out[name] = list(REC)
    print(name, len(REC), "head trees", flush=True)
json.dump(out, open("/tmp/s/scores.json", "w"))
