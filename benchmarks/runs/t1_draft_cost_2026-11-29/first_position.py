"""What the head's first draft position could be accepted at T=1.0 (unseeded, held-out, c=1, fixed
K=1 chain, guard off): at each drafted step, the target's root distribution p and the head's
logits l over its draft vocabulary; acceptance of one draw from q_tau = softmax(l / tau)
(sum min(p, q_tau)), of the head's top-w tokens as deterministic proposals (sum of p over them:
recursive rejection with deltas), and p's own top-1 mass. Usage: PYTHONPATH=. python <this>"""
import sys, torch
import cluster.verification as V
from actors.proposers.eagle import EagleProposer
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.spec_guard import FallbackGuardConfig
from benchmarks.options import select_prompts, PROMPT_SETS

torch.set_num_threads(2)
_, prompts = select_prompts(PROMPT_SETS["heldout"], None, 0)
spec = SpeculativeConfig.from_draft_arg("eagle", 1, None, adaptive=False)
spec.fallback_guard = FallbackGuardConfig(enabled=False)
e = LLMEngine(EngineConfig(device="cpu", speculative=spec))
head_logits = {}
orig_choose = EagleProposer._choose
def choose(self, scores, reqs, depth, trees, live, tips):
    if depth == 0:
        for j, r in enumerate(reqs):
            head_logits[r.seq_id] = (scores.logits[j].float().clone(), self.head.draft_vocab)
    return orig_choose(self, scores, reqs, depth, trees, live, tips)
EagleProposer._choose = choose
taus = [0.5, 0.7, 0.85, 1.0, 1.2]
acc = {f"sampled tau={t}": 0.0 for t in taus}
acc.update({f"top-{w} deterministic": 0.0 for w in (1, 2, 3, 4)})
acc["p top-1 mass"] = 0.0
acc["target top-1 in head top-3"] = 0.0
n = [0]
orig_verify = V.verify_tree
def verify(seq, tree, rows, argmax):
    if tree.size > 1 and seq.seq_id in head_logits:
        l, vocab = head_logits.pop(seq.seq_id)
        p = torch.softmax(rows[0].float(), -1)
        pv = p[vocab]
        for t in taus:
            acc[f"sampled tau={t}"] += float(torch.minimum(pv, torch.softmax(l / t, -1)).sum())
        top = l.topk(4).indices
        for w in (1, 2, 3, 4):
            acc[f"top-{w} deterministic"] += float(pv[top[:w]].sum())
        acc["p top-1 mass"] += float(p.max())
        acc["target top-1 in head top-3"] += float(int(p.argmax()) in vocab[top[:3]].tolist())
        n[0] += 1
    return orig_verify(seq, tree, rows, argmax)
V.verify_tree = verify
import cluster.engine as E
if hasattr(E, "verify_tree"):
    E.verify_tree = verify
msgs = [p.messages for p in prompts]
params = [SamplingParams(max_tokens=p.budget(None), temperature=1.0) for p in prompts]
for m, p in zip(msgs, params):
    e.generate([m], [p], chat=True)
print("drafted steps", n[0])
for k, v in acc.items():
    print(f"{k:30s} {v / max(1, n[0]):.3f}")
