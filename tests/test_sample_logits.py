"""An unseeded sampled token straight from the logits (kernels/csrc/fused.cpp sample_logits,
actors/sampling.py sample_unseeded): the token whose CDF interval holds u, never a token without mass,
the softmax's distribution at any temperature, one uniform draw as the torch path makes; rows it
cannot take (NaN, +inf, no mass; top-k or top-p) go the torch path, bad arguments are named."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from actors.sampling import logits_to_probs, sample, sample_unseeded
from actors.sampling_params import SamplingParams
from kernels import cpu_native as cn

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")
INF = float("inf")


def _logits(v: int, seed: int) -> torch.Tensor:
    x = torch.randn(v, generator=torch.Generator().manual_seed(seed)) * 3
    x[::7] = -INF  # masked tokens (logit bias, processing): no mass
    return x


@pytest.mark.parametrize("v", [1, 5, 16, 37, 200])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_the_drawn_token_is_the_one_whose_cdf_interval_holds_u(v, temperature):
    x = _logits(v, seed=v)
    x[v // 2] = 1.0  # one token with mass at least
    p = torch.softmax(x.double() / temperature, 0)
    cdf = p.cumsum(0)
    for i in range(v):
        if p[i] < 1e-6:  # an interval too thin to aim at (or none: masked)
            continue
        mid = float(((cdf[i - 1] if i else 0.0) + cdf[i]) / 2 / cdf[-1])
        assert cn.sample_logits(x, temperature, mid) == i, (i, v, temperature)
    with_mass = (p > 0).nonzero().flatten().tolist()
    assert cn.sample_logits(x, temperature, 0.0) == with_mass[0]
    assert cn.sample_logits(x, temperature, 1.0 - 2.0 ** -53) == with_mass[-1]


def test_rows_it_cannot_take_go_the_torch_path():
    for bad in (torch.tensor([1.0, float("nan"), 0.0]), torch.tensor([1.0, INF]), torch.full((20,), -INF)):
        assert cn.sample_logits(bad, 1.0, 0.5) == -1
    with pytest.raises(ValueError, match="positive mass"):  # the torch path's answer to a row without mass
        sample_unseeded(torch.full((20,), -INF), SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))


def test_unseeded_draws_follow_the_softmax_and_take_one_uniform(monkeypatch):
    probs = np.array([0.1, 0.0, 0.45, 0.3, 0.15])
    x = torch.tensor(probs, dtype=torch.float32).log()  # log 0 = -inf: no mass
    params = SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(1)
    draws = np.array([sample_unseeded(x, params, g) for _ in range(6000)])
    counts = np.bincount(draws, minlength=5)
    assert counts[1] == 0
    assert chisquare(counts[[0, 2, 3, 4]], 6000 * probs[[0, 2, 3, 4]]).pvalue > 1e-3
    hot = SamplingParams(temperature=2.0)  # p ** (1 / 2), renormalised
    draws = np.array([sample_unseeded(x, hot, g) for _ in range(6000)])
    flat = np.sqrt(probs) / np.sqrt(probs).sum()
    assert chisquare(np.bincount(draws, minlength=5)[[0, 2, 3, 4]], 6000 * flat[[0, 2, 3, 4]]).pvalue > 1e-3
    a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    sample_unseeded(x, params, a)
    sample(logits_to_probs(x, 1.0), b)  # the torch path's one draw: both generators end in the same state
    assert torch.equal(a.get_state(), b.get_state())


def test_top_k_and_top_p_take_the_torch_path(monkeypatch):
    calls = []
    real = cn.sample_logits
    monkeypatch.setattr(cn, "sample_logits", lambda *a: calls.append(1) or real(*a))
    x = torch.tensor([0.0, 2.0, 1.0, -1.0])
    g = torch.Generator().manual_seed(0)
    assert sample_unseeded(x, SamplingParams(temperature=1.0, top_k=1), g) == 1
    assert sample_unseeded(x, SamplingParams(temperature=1.0, top_p=0.01), g) == 1
    assert calls == []
    sample_unseeded(x, SamplingParams(temperature=1.0), g)
    sample_unseeded(x, SamplingParams(temperature=1.0, top_k=4), g)  # top-k over the whole row: no cut
    assert calls == [1, 1]


def test_bad_arguments_are_named():
    x = torch.zeros(8)
    for args, fragment in (((x.view(2, 4), 1.0, 0.5), "contiguous"), ((x[::2], 1.0, 0.5), "contiguous"),
                           ((x, 0.0, 0.5), "temperature must be > 0, got 0"), ((x, 1.0, 1.0), "got 1"),
                           ((x, 1.0, -0.1), "got -0.1"), ((x.double(), 1.0, 0.5), "float")):
        with pytest.raises(RuntimeError, match=fragment):
            cn.sample_logits(*args)


def test_a_plain_sampled_step_draws_from_the_logits_row():
    """The engine's verify phase: a sequence without a draft at T > 0, unseeded, gets one token drawn
    from its row (verify_sampling's one draw for a root-only tree)."""
    from actors.sequence import Sequence
    from actors.tree import TokenTree
    from cluster.verification import verify_tree

    rows = torch.full((1, 50), -INF)
    rows[0, 17] = 0.0
    seq = Sequence(0, [1, 2, 3], SamplingParams(temperature=0.8))
    res = verify_tree(seq, TokenTree.root(3), rows, None)
    assert (res.accepted_nodes, res.next_token, res.bonus) == ([], 17, True)
