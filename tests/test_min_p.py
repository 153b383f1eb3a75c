"""min-p (vLLM's extension): which tokens it keeps, where it stands among top-k and top-p, and that
the CPU fast path never draws a token it filtered. That speculative sampling keeps its distribution:
tests/test_sampling_lossless.py; the edges that take it: tests/test_request.py and the API tests."""
from __future__ import annotations

import torch

from actors.sampling import logits_to_probs, sample_unseeded
from actors.sampling_params import SamplingParams


def test_logits_to_probs_min_p():
    probs = torch.tensor([0.05, 0.4, 0.15, 0.3, 0.1], dtype=torch.float64)
    logits = probs.log()
    keep = lambda min_p: logits_to_probs(logits, 1.0, min_p=min_p).nonzero().flatten().tolist()  # noqa: E731
    assert keep(0.0) == [0, 1, 2, 3, 4]  # 0: off
    assert keep(0.2) == [1, 2, 3, 4]  # p >= 0.2 x 0.4 = 0.08
    assert keep(0.3) == [1, 2, 3]  # p >= 0.12
    assert keep(0.5) == [1, 3]  # p >= 0.2
    assert keep(1.0) == [1]  # only the most probable token (and its ties)
    torch.testing.assert_close(logits_to_probs(logits, 1.0, min_p=0.5)[[1, 3]], torch.tensor([0.4, 0.3]).double() / 0.7)
    # relative to the most probable token at the temperature: sharper rows keep fewer tokens
    assert logits_to_probs(logits, 0.5, min_p=0.3).nonzero().flatten().tolist() == [1, 3]  # p^2 >= 0.3 x 0.16


def test_min_p_comes_before_top_p_and_commutes_with_top_k():
    """vLLM's order: min-p on the distribution at the temperature, then top-k and top-p (min-p's
    threshold is a ratio to the most probable token, which top-k keeps: those two commute)."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        logits = torch.randn(4, 40, generator=g, dtype=torch.float64) * 2
        top_k, min_p = int(torch.randint(0, 20, (), generator=g)), 0.2
        top_p = 0.5 + 0.5 * float(torch.rand((), generator=g))
        after = logits_to_probs(logits, 0.9, top_k, top_p, min_p)
        base = logits_to_probs(logits, 0.9)
        first = logits.masked_fill(base < min_p * base.amax(-1, keepdim=True), float("-inf"))  # min-p first
        torch.testing.assert_close(after, logits_to_probs(first, 0.9, top_k, top_p))
        top_k_first = logits_to_probs(logits, 0.9, top_k=top_k)
        torch.testing.assert_close(logits_to_probs(logits, 0.9, top_k, 1.0, min_p),
                                   logits_to_probs(top_k_first.log(), 1.0, 0, 1.0, min_p))


def test_an_unseeded_draw_keeps_min_p():
    """An fp32 CPU row under min-p is drawn from the filtered distribution, not by the native kernel
    that reads the temperature alone (which would draw the small tokens too)."""
    logits = torch.tensor([2.0, 0.0, 1.5, -1.0, 0.5])  # p ~ 0.50, 0.07, 0.30, 0.02, 0.11
    params = SamplingParams(temperature=1.0, min_p=0.3)  # keeps p >= 0.15: tokens 0 and 2
    draws = {sample_unseeded(logits, params, torch.Generator().manual_seed(s)) for s in range(300)}
    assert draws == {0, 2}
    plain = {sample_unseeded(logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(s))
             for s in range(300)}
    assert plain == {0, 1, 2, 3, 4}


# --------------------------------------------------------------------------- greedy verification
