"""Head-alone fixed K=5 width-3 trees of up to 24 nodes at every step (greedy, c=1): each tree's node
scores/parents/tokens and its root position, and each prompt's final tokens."""
import sys, json, torch
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from actors.proposers import dynamic_tree
from actors.proposers.eagle import EagleProposer
from benchmarks.options import select_prompts, PROMPT_SETS
torch.set_num_threads(2)
name = sys.argv[1]
CUR = {}
orig = dynamic_tree.DraftPool.to_tree
def to_tree(self, n):
    keep = []; kept = {-1}
    for i in sorted(range(len(self.tokens)), key=self._rank):
        if self.parents[i] in kept: keep.append(i); kept.add(i)
    CUR["pool"] = dict(tokens=[self.tokens[i] for i in keep], parents=[keep.index(self.parents[i]) if self.parents[i] >= 0 else -1 for i in keep],
                       scores=[self.scores[i] for i in keep], depths=[self.depths[i] for i in keep])
    return orig(self, n)
dynamic_tree.DraftPool.to_tree = to_tree
steps = []
op = EagleProposer.propose
def propose(self, reqs):
    out = op(self, reqs)
    if "pool" in CUR:
        steps.append([reqs[0].seq_id, len(reqs[0].token_ids), CUR.pop("pool")])
    return out
EagleProposer.propose = propose
_, prompts = select_prompts(PROMPT_SETS[name], 24 if name == "bench500" else None, 0)
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=0.0, spec_tokens=5) for p in prompts]
spec = SpeculativeConfig.from_draft_arg("eagle", 5, None, adaptive=False, tree_width=3, tree_nodes=24)
e = LLMEngine(EngineConfig(device="cpu", speculative=spec))
res = []
for m, p, pr in zip(msgs, params, prompts):
    steps.clear()
    o = e.generate([m], [p], chat=True)[0]
    res.append(dict(category=pr.category, out=list(o.token_ids), steps=[[s[1], s[2]] for s in steps], prompt_len=o.num_prompt_tokens if hasattr(o, "num_prompt_tokens") else None))
json.dump(res, open(f"/tmp/s/full_{name}.json", "w"))
print(name, sum(len(r["steps"]) for r in res), "steps")
