"""training.fit: the held-out figure for sampled drafts is speculative sampling's own acceptance."""
from __future__ import annotations

import pytest
import torch

from training.fit import sampled_acceptance


def test_sampled_acceptance_by_hand():
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.9, 0.05, 0.05])
    got = sampled_acceptance(p.clamp_min(1e-30).log(), q.log(), 1.0)
    assert float(got) == pytest.approx(0.5 + 0.05, abs=1e-6)
    same = torch.randn(4, 7)
    assert torch.allclose(sampled_acceptance(same, same, 0.7), torch.ones(4))
    # temperature scales both: a colder draft and target that agree on the argmax agree more
    t, d = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.5, -1.0])
    assert float(sampled_acceptance(t, d, 0.2)) > float(sampled_acceptance(t, d, 1.0))


def test_sampled_acceptance_is_what_rejection_sampling_accepts():
    """Draw x ~ q, accept with min(1, p(x) / q(x)): the accepted share converges to sum min(p, q)."""
    gen = torch.Generator().manual_seed(3)
    t, d = torch.randn(50, generator=gen) * 2, torch.randn(50, generator=gen) * 2
    p, q = torch.softmax(t, -1), torch.softmax(d, -1)
    n = 200_000
    x = torch.multinomial(q, n, replacement=True, generator=gen)
    accepted = (torch.rand(n, generator=gen) < (p[x] / q[x]).clamp(max=1)).float().mean()
    assert float(accepted) == pytest.approx(float(sampled_acceptance(t, d, 1.0)), abs=0.005)
    assert 0.05 < float(accepted) < 0.95  # a case where the two differ, not a trivial one


def test_sampled_acceptance_counts_target_mass_outside_the_draft_vocabulary():
    gen = torch.Generator().manual_seed(5)
    full, draft = torch.randn(3, 40, generator=gen), torch.randn(3, 10, generator=gen)
    vocab = torch.arange(0, 40, 4)  # the draft vocabulary: 10 of the 40 tokens
    lse = torch.logsumexp(full / 0.8, dim=-1)
    exact = sampled_acceptance(full[:, vocab], draft, 0.8, lse)
    # by hand: p over the whole vocabulary, q (zero outside the draft vocabulary) scattered into it
    p, q = torch.softmax(full / 0.8, -1), torch.zeros(3, 40)
    q[:, vocab] = torch.softmax(draft / 0.8, -1)
    assert torch.allclose(exact, torch.minimum(p, q).sum(-1), atol=1e-6)
    assert (exact < sampled_acceptance(full[:, vocab], draft, 0.8)).all()  # renormalised: overstated
