"""Microseconds per call of the sampled verification pieces on one 49,152-logit row (2 threads): a
child rejected under a head SubsetProposal (8,192 ids) or a delta (lookup). Usage: PYTHONPATH=. python <this>"""
import time, torch
from actors.sampling import logits_to_probs, sample, sample_unseeded
from actors.spec_verify import _residual, verify_sampling_logits
from actors.sampling_params import SamplingParams
from actors.tree import TokenTree, SubsetProposal
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
V, S = 49152, 8192
logits = torch.randn(2, V, generator=g) * 3
ids = torch.randperm(V, generator=g)[:S]
q = torch.softmax(torch.randn(S, generator=g) * 3, 0)
tok_row = int(q.argmax()); tok = int(ids[tok_row])
prop = SubsetProposal(q, ids, float(q[tok_row]))
t = TokenTree.root(5); t.add(0, tok, prop)
params = SamplingParams(temperature=1.0)
def tm(f, n=300):
    f(); t0 = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t0) / n * 1e6
p = logits_to_probs(logits[0], 1.0)
print("logits_to_probs us", tm(lambda: logits_to_probs(logits[0], 1.0)))
print("p[token] us", tm(lambda: float(p[tok])))
r = _residual(p, prop, tok)
print("_residual subset us", tm(lambda: _residual(p, prop, tok)))
print("_residual delta us", tm(lambda: _residual(p, None, tok)))
print("sample(residual) us", tm(lambda: sample(r, g)))
print("sample_unseeded(row) us", tm(lambda: sample_unseeded(logits[1], params, g)))
print("verify_sampling_logits (mixed) us", tm(lambda: verify_sampling_logits(t, logits, params, g)))
t2 = TokenTree.root(5); t2.add(0, 7)  # a delta (lookup) draft, rejected where p(7) is small
print("verify_sampling_logits (delta, mixed) us", tm(lambda: verify_sampling_logits(t2, logits, params, g)))
