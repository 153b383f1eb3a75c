"""Tests for actors.sampling and actors.spec_verify: logits_to_probs, sampling, greedy verification, and the edge cases
and path validity of sampling verification (its losslessness: tests/test_sampling_lossless.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import actors.sampling as sampling_module
from actors.sampling import greedy, logits_to_probs, sample, sample_distinct, sample_next
from actors.sampling_params import SamplingParams
from actors.spec_verify import VerifyResult, _residual, verify_greedy, verify_sampling
from actors.tree import TokenTree
from kernels import cpu_native

# --------------------------------------------------------------------------- logits_to_probs, sample


def test_logits_to_probs_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    for t in (0.5, 1.0, 3.0):
        torch.testing.assert_close(logits_to_probs(logits, t), torch.softmax(logits / t, -1))
    sharp, flat = logits_to_probs(logits, 0.2), logits_to_probs(logits, 5.0)
    assert sharp[0] > torch.softmax(logits, -1)[0] > flat[0]


def test_logits_to_probs_top_k():
    logits = torch.tensor([0.1, 3.0, -2.0, 2.0, 1.0])
    probs = logits_to_probs(logits, 1.0, top_k=2)
    assert probs.nonzero().flatten().tolist() == [1, 3]
    torch.testing.assert_close(probs[[1, 3]], torch.softmax(logits[[1, 3]], -1))
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_k=5), torch.softmax(logits, -1))  # k >= V: off
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_k=0), torch.softmax(logits, -1))  # 0: off


def test_logits_to_probs_top_p():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3], dtype=torch.float64)
    logits = probs.log()
    keep = lambda top_p: logits_to_probs(logits, 1.0, top_p=top_p).nonzero().flatten().tolist()  # noqa: E731
    assert keep(0.1) == [1]  # the most probable token is always kept
    assert keep(0.7) == [1, 3]  # 0.5 < 0.7, then 0.8 >= 0.7: stop
    assert keep(0.9) == [1, 2, 3]
    assert keep(1.0) == [0, 1, 2, 3]
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_p=0.7)[[1, 3]], torch.tensor([0.5, 0.3]).double() / 0.8)


def test_logits_to_probs_top_k_then_top_p_batched():
    logits = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(0))
    probs = logits_to_probs(logits, 0.7, top_k=10, top_p=0.8)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 5))
    kept = probs > 0
    assert (kept.sum(-1) <= 10).all() and (kept.sum(-1) >= 1).all()
    # kept tokens are the most probable ones: every kept logit >= every dropped logit
    lowest_kept = torch.where(kept, logits, torch.inf).amin(-1)
    highest_dropped = torch.where(kept, -torch.inf, logits).amax(-1)
    assert (lowest_kept >= highest_dropped).all()
    assert logits_to_probs(logits.double(), 1.0).dtype == torch.float64
    assert logits_to_probs(logits.bfloat16(), 1.0).dtype == torch.float32


def _full_sort_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:  # [..., V] -> [..., V]
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep_sorted = sorted_probs.cumsum(-1) - sorted_probs < top_p
    kept = probs * torch.zeros_like(probs).scatter(-1, order, keep_sorted.to(probs.dtype))
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("prefix", [2, 8, 1024])
def test_top_p_prefix_shortcut_matches_full_sort(monkeypatch, prefix):
    monkeypatch.setattr(sampling_module, "_TOP_P_PREFIX", prefix)
    g = torch.Generator().manual_seed(3)
    for trial in range(100):
        logits = torch.randn(4, 40, generator=g, dtype=torch.float64) * (0.5 + trial % 6)
        top_p = float(torch.rand((), generator=g)) * 0.98 + 0.01
        expected = _full_sort_top_p(torch.softmax(logits, -1), top_p)
        torch.testing.assert_close(logits_to_probs(logits, 1.0, top_p=top_p), expected)


@settings(max_examples=150, deadline=None)
@given(
    # no subnormals: 5e-324 / temperature underflows to 0 and turns distinct logits into a tie
    st.lists(st.floats(-4, 4, allow_subnormal=False), min_size=2, max_size=12),
    st.floats(0.05, 4.0),
    st.integers(0, 14),
    st.floats(0.01, 1.0),
)
def test_logits_to_probs_properties(values, temperature, top_k, top_p):
    logits = torch.tensor(values, dtype=torch.float64)
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    assert torch.isclose(probs.sum(), torch.tensor(1.0, dtype=torch.float64))
    kept = probs > 0
    base = torch.softmax(logits / temperature, -1)
    assert kept[base == base.max()].any()  # a most probable token is always kept
    if top_k:
        pivot = logits.topk(min(top_k, len(values))).values[-1]
        assert not kept[logits < pivot].any()
    # kept tokens keep their relative odds
    torch.testing.assert_close(probs[kept], base[kept] / base[kept].sum())
    # top-p keeps a minimal most-probable set reaching top_p of the top-k distribution
    if top_k:
        base = torch.where(logits < pivot, 0.0, base)
    base = base / base.sum()
    kept_mass = base[kept].sum()
    assert kept_mass >= top_p - 1e-9 and kept_mass - base[kept].min() < top_p + 1e-9


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=1.0, top_k=-1), "top_k"),
        (dict(temperature=1.0, top_p=0.0), "top_p"),
        (dict(temperature=1.0, top_p=1.5), "top_p"),
        (dict(temperature=1.0, min_p=-0.1), "min_p"),
        (dict(temperature=1.0, min_p=1.5), "min_p"),
    ],
)
def test_logits_to_probs_rejects_bad_settings(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        logits_to_probs(torch.zeros(4), **kwargs)


def test_sample_distribution_and_support():
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    g = torch.Generator().manual_seed(1)
    draws = np.array([sample(p, g) for _ in range(6000)])
    counts = np.bincount(draws, minlength=4)
    assert counts[1] == 0
    assert chisquare(counts[[0, 2, 3]], 6000 * np.array([0.1, 0.6, 0.3])).pvalue > 1e-3
    assert sample(torch.tensor([0.0, 0.0, 1.0]), g) == 2
    with pytest.raises(ValueError, match="positive mass"):
        sample(torch.zeros(3), g)
    with pytest.raises(ValueError, match=r"\[V\]"):
        sample(torch.ones(2, 3), g)


def test_sample_never_draws_a_token_without_mass_at_the_ends_of_the_range(monkeypatch):
    """Inverse-CDF sampling: u = 0 and u rounded up to the total mass land on tokens with mass."""
    p = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0, 0.0])
    for u in (0.0, 1.0):
        monkeypatch.setattr(sampling_module.torch, "rand", lambda *a, u=u, **k: torch.full((1,), u, dtype=torch.float64))
        assert sample(p) == (1 if u == 0.0 else 3)
    monkeypatch.undo()
    g = torch.Generator().manual_seed(3)
    assert {sample(p, g) for _ in range(300)} == {1, 3}


def test_sample_distinct_draws_without_replacement():
    q = torch.tensor([0.5, 0.0, 0.3, 0.2])
    g = torch.Generator().manual_seed(2)
    firsts, seconds = [], []
    for _ in range(6000):
        picks, proposals = sample_distinct(q, 3, g)
        assert len(set(picks.tolist())) == 3 and 1 not in picks.tolist()  # distinct, only tokens with mass
        assert torch.allclose(proposals[0], q)
        for k in range(1, 3):  # each sibling's proposal: q without the earlier picks, renormalised
            expected = q.clone()
            expected[picks[:k]] = 0
            assert torch.allclose(proposals[k], expected / expected.sum())
        firsts.append(int(picks[0]))
        if picks[0] == 0:
            seconds.append(int(picks[1]))
    counts = np.bincount(firsts, minlength=4)
    assert chisquare(counts[[0, 2, 3]], 6000 * np.array([0.5, 0.3, 0.2])).pvalue > 1e-3  # the first is a draw from q
    after0 = np.bincount(seconds, minlength=4)  # the second, given the first was token 0: q without it
    assert chisquare(after0[[2, 3]], len(seconds) * np.array([0.6, 0.4])).pvalue > 1e-3
    picks, _ = sample_distinct(torch.tensor([0.0, 1.0, 0.0]), 3, g)
    assert picks.tolist() == [1]  # no more siblings than tokens with mass
    with pytest.raises(ValueError, match="positive mass"):
        sample_distinct(torch.zeros(3), 2, g)
    with pytest.raises(ValueError, match=r"\[S\]"):
        sample_distinct(torch.ones(2, 3), 2, g)


def test_greedy_and_sample_next():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    assert greedy(logits).tolist() == [1, 0]
    assert sample_next(logits[0], SamplingParams(temperature=0.0)) == 1
    params = SamplingParams(temperature=0.8, top_k=2)  # unseeded: the generator's stream
    draws = [sample_next(logits[0], params, torch.Generator().manual_seed(s)) for s in range(200)]
    assert set(draws) == {1, 2}  # top-k=2 excludes token 0
    again = [sample_next(logits[0], params, torch.Generator().manual_seed(s)) for s in range(200)]
    assert draws == again


def test_verify_greedy_full_accept_gives_bonus():
    tree = TokenTree.chain(5, [1, 2, 3])
    res = verify_greedy(tree, [1, 2, 3, 9])
    assert res == VerifyResult([1, 2, 3], [1, 2, 3], 9, bonus=True)
    assert res.output_tokens == [1, 2, 3, 9]


def test_verify_greedy_first_token_rejected_recovers():
    tree = TokenTree.chain(5, [1, 2, 3])
    assert verify_greedy(tree, torch.tensor([7, 2, 3, 9])) == VerifyResult([], [], 7, bonus=False)


def test_verify_greedy_rejects_mid_chain():
    tree = TokenTree.chain(5, [1, 2, 3])
    assert verify_greedy(tree, [1, 2, 4, 9]) == VerifyResult([1, 2], [1, 2], 4, bonus=False)


def test_verify_greedy_picks_matching_branch():
    tree = TokenTree.root(0)
    for token in (4, 5, 6):
        tree.add(0, token)
    tree.add(2, 8)  # node 4 under token 5
    tree.add(1, 8)  # node 5 under token 4
    res = verify_greedy(tree, [5, 0, 8, 0, 1, 0])
    assert res == VerifyResult([2, 4], [5, 8], 1, bonus=True)


def test_verify_greedy_takes_longest_path_among_duplicates():
    tree = TokenTree.root(0)
    tree.add(0, 3)  # node 1: leaf
    tree.add(0, 3)  # node 2: same token, longer subtree
    tree.add(2, 4)  # node 3
    tree.add(3, 6)  # node 4
    res = verify_greedy(tree, [3, 9, 4, 6, 2])
    assert res.accepted_nodes == [2, 3, 4] and res.next_token == 2 and res.bonus
    # same depth everywhere: the first in index order wins
    assert verify_greedy(tree, [3, 9, 5, 6, 2]) == VerifyResult([1], [3], 9, bonus=True)


def test_verify_greedy_checks_length():
    with pytest.raises(ValueError, match="3 entries"):
        verify_greedy(TokenTree.chain(0, [1]), [1, 2, 3])


@st.composite
def trees_and_argmax(draw, vocab=3):
    n = draw(st.integers(1, 14))
    tree = TokenTree.root(0)
    for i in range(1, n):
        tree.add(draw(st.integers(0, i - 1)), draw(st.integers(0, vocab - 1)))
    return tree, draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))


@settings(max_examples=200, deadline=None)
@given(trees_and_argmax())
def test_verify_greedy_matches_brute_force(case):
    tree, argmax = case

    def fully_matched(i):  # every node on the path matches its parent's argmax
        return all(tree.tokens[j] == argmax[tree.parents[j]] for j in tree.path_to(i)[1:])

    longest = max(len(tree.path_to(i)) - 1 for i in range(tree.size) if fully_matched(i))
    res = verify_greedy(tree, argmax)
    assert len(res.accepted_nodes) == longest
    path = [0, *res.accepted_nodes]
    assert all(tree.parents[b] == a for a, b in zip(path, path[1:]))
    assert fully_matched(path[-1])
    assert res.accepted_tokens == [tree.tokens[i] for i in res.accepted_nodes]
    assert res.next_token == argmax[path[-1]]
    assert res.bonus == (not tree.children(path[-1]))


# --------------------------------------------------------------------------- sampling verification: edge cases


def _delta(token: int, vocab: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), vocab).float()


def test_verify_sampling_certain_accept_and_bonus():
    tree = TokenTree.chain(0, [1, 2], draft_probs=torch.full((2, 4), 0.25))
    target = torch.stack([_delta(1), _delta(2), _delta(3)])
    for seed in range(20):
        res = verify_sampling(tree, target, torch.Generator().manual_seed(seed))
        assert res == VerifyResult([1, 2], [1, 2], 3, bonus=True)


def test_verify_sampling_impossible_token_is_rejected_and_never_recovered():
    tree = TokenTree.root(0)
    tree.add(0, 1)  # deterministic proposal of a token the target never emits
    tree.add(0, 2, q=torch.tensor([0.0, 0.0, 1.0, 0.0]))
    target = torch.tensor([[0.5, 0.0, 0.0, 0.5], [0.25] * 4, [0.25] * 4])
    for seed in range(50):
        res = verify_sampling(tree, target, torch.Generator().manual_seed(seed))
        assert res.accepted_nodes == [] and res.next_token in (0, 3) and not res.bonus


def test_verify_sampling_zero_draft_probability_accepts():
    # q[token] == 0 (a proposal outside q's support) with p[token] > 0: ratio is infinite, accept
    tree = TokenTree.chain(0, [2], draft_probs=torch.tensor([[0.5, 0.5, 0.0, 0.0]]))
    target = torch.tensor([[0.1, 0.1, 0.4, 0.4], [0.25] * 4])
    for seed in range(20):
        assert verify_sampling(tree, target, torch.Generator().manual_seed(seed)).accepted_tokens == [2]


def test_residual_falls_back_when_no_mass_left():
    p = torch.tensor([0.5, 0.5])
    assert torch.equal(_residual(p, torch.tensor([0.5, 0.5]) + 1e-7, 0), p)
    torch.testing.assert_close(_residual(p, torch.tensor([1.0, 0.0]), 0), torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(_residual(p, None, 1), torch.tensor([1.0, 0.0]))
    # through verify: an (unnormalised) q dominating p everywhere still yields a valid token
    tree = TokenTree.chain(0, [0], draft_probs=torch.tensor([[1.0, 1.0]]))
    target = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    tokens = {verify_sampling(tree, target, torch.Generator().manual_seed(s)).output_tokens[0] for s in range(40)}
    assert tokens == {0, 1}


def test_verify_sampling_checks_shape():
    with pytest.raises(ValueError, match=r"\[2, V\]"):
        verify_sampling(TokenTree.chain(0, [1]), torch.full((3, 4), 0.25))


@st.composite
def trees_and_target(draw, vocab=4):
    n = draw(st.integers(1, 10))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    mask = torch.rand(n, vocab, generator=g) < 0.7
    mask[:, 0] = True
    target = torch.rand(n, vocab, generator=g) * mask
    target = target / target.sum(-1, keepdim=True)
    tree = TokenTree.root(0)
    for i in range(1, n):
        q = torch.softmax(torch.randn(vocab, generator=g), -1) if draw(st.booleans()) else None
        tree.add(draw(st.integers(0, i - 1)), draw(st.integers(0, vocab - 1)), q)
    return tree, target, draw(st.integers(0, 2**31))


@settings(max_examples=150, deadline=None)
@given(trees_and_target())
def test_verify_sampling_result_is_a_valid_path(case):
    tree, target, seed = case
    res = verify_sampling(tree, target, torch.Generator().manual_seed(seed))
    path = [0, *res.accepted_nodes]
    assert all(tree.parents[b] == a for a, b in zip(path, path[1:]))
    assert all(target[a, tree.tokens[b]] > 0 for a, b in zip(path, path[1:]))
    assert target[path[-1], res.next_token] > 0
    assert res.bonus == (not tree.children(path[-1]))
    assert res == verify_sampling(tree, target, torch.Generator().manual_seed(seed))


@pytest.mark.skipif(not cpu_native.load(), reason="the native CPU kernels are not built here")
def test_greedy_on_cpu_answers_as_torch_argmax():
    """greedy() takes fp32 CPU rows to the native kernel (cpu_native.argmax_rows): the first maximum
    (ties: the lowest index), rows of every length around the 16 lanes, strided rows, and rows with
    NaN or infinities (torch: the first NaN wins)."""
    g = torch.Generator().manual_seed(9)
    for v in (1, 5, 16, 17, 49152 + 3):
        x = torch.randn(7, v, generator=g)
        x[1] = x[1].round()  # many ties
        x[2, v // 2:] = x[2].max()  # the maximum from the middle on
        assert torch.equal(cpu_native.argmax_rows(x), x.argmax(-1)), v
        assert torch.equal(greedy(x), x.argmax(-1)), v
    x = torch.randn(6, 40, generator=g)
    x[0, 30], x[1, 3], x[1, 20] = float("inf"), float("nan"), float("nan")
    x[2, 7], x[3] = float("-inf"), float("-inf")
    x[4, 39], x[5, 0] = float("nan"), float("inf")
    assert torch.equal(cpu_native.argmax_rows(x), x.argmax(-1))
    wide = torch.randn(3, 64, generator=g)[:, 8:48]  # rows 64 apart
    assert torch.equal(cpu_native.argmax_rows(wide), wide.argmax(-1))
    assert torch.equal(greedy(wide), wide.argmax(-1))
    with pytest.raises(RuntimeError, match="argmax_rows: rows of 0 values"):
        cpu_native.argmax_rows(torch.empty(2, 0))
