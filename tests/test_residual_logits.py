"""Reading and drawing a sampled verification's distributions straight from the logits (kernels/csrc/
fused.cpp softmax_at and sample_residual_logits, actors/spec_verify.py): p(token) as the softmax
gives it; after a rejected draft, the token whose interval of norm(max(0, p - q)) holds u, for a
deterministic draft (q a delta) and for a head's q over its draft vocabulary; never a token the
residual leaves no mass; no residual mass is said (-2), rows it cannot take are refused (-1), bad
arguments are named; and the verifier's walk through them matches the probabilities' walk."""
from __future__ import annotations

import random

import pytest
import torch

from actors.sampling import logits_to_probs
from actors.sampling_params import SamplingParams
from actors.spec_verify import _residual, verify_sampling, verify_sampling_logits
from actors.tree import SubsetProposal, TokenTree
from kernels import cpu_native as cn

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")
INF = float("inf")


def _logits(v: int, seed: int) -> torch.Tensor:
    x = torch.randn(v, generator=torch.Generator().manual_seed(seed)) * 3
    x[::7] = -INF  # masked tokens: no mass
    x[v // 2] = 2.0
    return x


def _subset(v: int, s: int, seed: int) -> SubsetProposal:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(v, generator=g)[:s]
    q = torch.softmax(torch.randn(s, generator=g) * 2, 0)
    return SubsetProposal(q, ids, float(q[0]))


@pytest.mark.parametrize("v", [5, 37, 200])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_softmax_at_is_the_softmax(v, temperature):
    x = _logits(v, seed=v)
    p = torch.softmax(x.double() / temperature, 0)
    for t in range(v):
        assert cn.softmax_at(x, temperature, t) == pytest.approx(float(p[t]), rel=1e-5, abs=1e-12)


@pytest.mark.parametrize("v", [5, 37, 200])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("kind", ["delta", "subset"])
def test_the_residual_draw_is_the_token_whose_interval_holds_u(v, temperature, kind):
    x = _logits(v, seed=v + 1)
    p = torch.softmax(x.double() / temperature, 0)
    if kind == "delta":
        token, q, args = v // 2, None, ()
    else:
        q = _subset(v, max(2, v // 3), seed=v)
        token, args = int(q.ids[0]), (q.ids, q.probs)
    r = _residual(p, q, token)
    cdf = r.cumsum(0)
    for i in range(v):
        if r[i] < 1e-5:  # too thin to aim at, or no mass: never drawn (checked below)
            continue
        mid = float(((cdf[i - 1] if i else 0.0) + cdf[i]) / 2)
        assert cn.sample_residual_logits(x, temperature, mid, token, *args) == i, (i, kind)
    drawn = {cn.sample_residual_logits(x, temperature, u / 500, token, *args) for u in range(500)}
    assert all(r[t] > 0 for t in drawn)
    if kind == "delta":
        assert token not in drawn


def test_no_residual_mass_and_rows_it_cannot_take_are_said():
    x = torch.tensor([0.0, -INF, 0.0])  # p = (0.5, 0, 0.5)
    q = SubsetProposal(torch.tensor([0.5, 0.5]), torch.tensor([0, 2]), 0.5)  # q = p: no residual
    assert cn.sample_residual_logits(x, 1.0, 0.3, 0, q.ids, q.probs) == -2
    assert cn.sample_residual_logits(torch.tensor([0.0, float("nan")]), 1.0, 0.3, 0) == -1
    assert cn.softmax_at(torch.tensor([0.0, INF]), 1.0, 0) == -1.0


def test_bad_arguments_are_named():
    x = torch.zeros(6)
    with pytest.raises(RuntimeError, match="token 6 is outside the row's 6 logits"):
        cn.sample_residual_logits(x, 1.0, 0.5, 6)
    with pytest.raises(RuntimeError, match=r"ids\[1\] = 9 is outside the row's 6 logits"):
        cn.sample_residual_logits(x, 1.0, 0.5, 0, torch.tensor([0, 9]), torch.tensor([0.5, 0.5]))
    with pytest.raises(RuntimeError, match="one length"):
        cn.sample_residual_logits(x, 1.0, 0.5, 0, torch.tensor([0, 1]), torch.tensor([1.0]))
    with pytest.raises(RuntimeError, match="u must be a uniform draw in \\[0, 1\\), got 1"):
        cn.sample_residual_logits(x, 1.0, 1.0, 0)
    with pytest.raises(RuntimeError, match="softmax_at: token -1 is outside"):
        cn.softmax_at(x, 1.0, -1)


@pytest.mark.parametrize("kind", ["delta", "subset"])
def test_a_chains_native_walk_follows_the_probabilities_walk(kind):
    """verify_sampling_logits on rows the kernels read (temperature only, fp32) takes the walk and
    the draws verify_sampling takes over logits_to_probs: the same accepted nodes for every seed, and
    the same next token but where a uniform lands within rounding of a CDF step."""
    v, rng, same = 300, random.Random(5), 0
    params = SamplingParams(temperature=0.9)
    for seed in range(200):
        x = torch.stack([_logits(v, seed * 7 + i) for i in range(4)])
        tree = TokenTree.root(1)
        node = 0
        for _ in range(3):
            if kind == "delta":
                node = tree.add(node, int(x[node].argmax()) if rng.random() < 0.5 else rng.randrange(v))
            else:
                q = _subset(v, 40, seed=seed * 3 + node)
                node = tree.add(node, int(q.ids[0]), q)
        a = verify_sampling_logits(tree, x, params, torch.Generator().manual_seed(seed))
        b = verify_sampling(tree, logits_to_probs(x, 0.9), torch.Generator().manual_seed(seed))
        assert a.accepted_nodes == b.accepted_nodes and a.bonus == b.bonus
        same += a.next_token == b.next_token
    assert same >= 195, same
