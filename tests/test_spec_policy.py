"""Adaptive speculation policy: the math is exact against brute force, estimates converge, and the
policy turns speculation off when it cannot pay and fully on when it clearly does."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.cost_table import CostTable, monotone_fit
from actors.spec_policy import AcceptanceEstimator, DecodeSlot, SpecPolicy, choose_depths, expected_tokens


def test_expected_tokens():
    assert expected_tokens([1.0, 1.0, 1.0], 3) == 4.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)
    assert expected_tokens([0.9, 0.9], 0) == 1.0


def _goodput(gains, depths, base, verify, draft):
    B = len(depths)
    tokens = B + sum(float(gains[b, :d].sum()) for b, d in enumerate(depths))
    n_draft = sum(1 for d in depths if d)
    t = verify(base + sum(depths)) + (max(depths) * draft(n_draft) if n_draft else 0.0)
    return tokens / t


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), K=st.integers(1, 4), seed=st.integers(0, 10_000),
       a=st.floats(0.005, 0.05), b=st.floats(0.0, 0.01), c=st.floats(0.0, 0.02))
def test_choose_depths_matches_brute_force(B, K, seed, a, b, c):
    """Affine verify cost and a per-round draft cost: the chosen depths reach the optimum goodput."""
    rng = np.random.default_rng(seed)
    gains = np.cumprod(rng.uniform(0.0, 1.0, size=(B, K)), axis=1)
    max_depths = rng.integers(0, K + 1, size=B)
    verify = lambda n: a + b * n  # noqa: E731
    draft = lambda n: c  # noqa: E731
    depths, rate = choose_depths(gains, max_depths, B, verify, draft)
    assert all(0 <= d <= m for d, m in zip(depths, max_depths))
    assert rate == pytest.approx(_goodput(gains, list(depths), B, verify, draft), rel=1e-6)
    best = max(_goodput(gains, list(ds), B, verify, draft)
               for ds in itertools.product(*[range(m + 1) for m in max_depths]))
    assert rate >= best * (1 - 1e-6)


def test_compute_bound_low_acceptance_turns_speculation_off():
    """Time proportional to tokens: a chain with rates < 1 brings fewer tokens than it costs."""
    gains = np.cumprod(np.full((8, 5), 0.6), axis=1)
    depths, _ = choose_depths(gains, np.full(8, 5), 8, lambda n: 0.002 * n, lambda n: 0.0)
    assert depths.tolist() == [0] * 8


def test_memory_bound_high_acceptance_takes_full_depth():
    gains = np.cumprod(np.full((2, 5), 0.9), axis=1)
    depths, rate = choose_depths(gains, np.full(2, 5), 2, lambda n: 0.04, lambda n: 0.001)
    assert depths.tolist() == [5, 5]
    assert rate > 2 / 0.04


def test_streamed_weights_make_the_policy_draft_deeper():
    """Weight offload (actors/model/weight_offload.py) adds the transfer of the offloaded layers to
    every forward whatever its size: the same drafts at the same per-token cost go from not worth it
    (or short) to deep, as SpecInfer's offloading argument says."""
    gains = np.cumprod(np.full((8, 5), 0.6), axis=1)  # 8 sequences, compute-bound: 2 ms per token
    draft = lambda n: 0.0002 * n  # noqa: E731
    depth = [choose_depths(gains, np.full(8, 5), 8, lambda n: 0.01 + stream_s + 0.002 * n, draft)[0].min()
             for stream_s in (0.0, 0.03, 0.1)]  # seconds of streamed weights per forward
    assert depth[0] == 0 and 0 < depth[1] < depth[2]


def test_expensive_draft_shortens_or_stops_the_chain():
    gains = np.cumprod(np.full((1, 5), 0.7), axis=1)
    flat = lambda n: 0.04  # noqa: E731
    cheap, _ = choose_depths(gains, np.array([5]), 1, flat, lambda n: 0.001)
    mid, _ = choose_depths(gains, np.array([5]), 1, flat, lambda n: 0.01)
    dear, _ = choose_depths(gains, np.array([5]), 1, flat, lambda n: 0.05)
    assert cheap[0] == 5 and 0 < mid[0] < 5 and dear[0] == 0


def test_a_marginal_gain_is_not_taken():
    """16 sequences, one of which has a draft worth 0.9 tokens for 5.5% more step time: a predicted
    gain of ~0.2%, well inside the noise of the estimates. Plain decoding unless the margin is 0."""
    gains = np.zeros((16, 1))
    gains[0, 0] = 0.9
    verify = lambda n: 0.085 * (1 + 0.055 * (n - 16))  # noqa: E731
    cautious, rate = choose_depths(gains, np.ones(16, dtype=np.int64), 16, verify, lambda b: 0.0, min_gain=0.02)
    eager, _ = choose_depths(gains, np.ones(16, dtype=np.int64), 16, verify, lambda b: 0.0)
    assert cautious.tolist() == [0] * 16 and rate == pytest.approx(16 / 0.085)
    assert eager[0] == 1
    cheap = lambda n: 0.085 * (1 + 0.01 * (n - 16))  # noqa: E731  a draft token costs 1% of the step
    taken, _ = choose_depths(gains, np.ones(16, dtype=np.int64), 16, cheap, lambda b: 0.0, min_gain=0.02)
    assert taken.tolist() == [1] + [0] * 15  # 5.6% more tokens for 1% more time


def test_acceptance_estimates_converge_to_true_conditional_rates():
    true = [0.8, 0.5, 0.2]
    est = AcceptanceEstimator(3, global_decay=1.0)
    rng = random.Random(0)
    for i in range(3000):
        n = 0
        while n < 3 and rng.random() < true[n]:
            n += 1
        est.record(seq_id=i % 7, depth=3, num_accepted=n)
    assert est.global_rates() == pytest.approx(true, abs=0.04)
    assert est.rates(0) == pytest.approx(true, abs=0.1)  # own counts + the prior
    est.release(0)
    assert est.rates(0) == est.global_rates()


def test_acceptance_rejects_impossible_counts():
    with pytest.raises(ValueError, match="num_accepted=4"):
        AcceptanceEstimator(3).record(1, depth=3, num_accepted=4)


def test_per_sequence_estimates_separate_easy_and_hard_sequences():
    est = AcceptanceEstimator(4)
    for _ in range(50):
        est.record(1, 4, 4)
        est.record(2, 4, 0)
    assert est.rates(1)[0] > 0.9 and est.rates(2)[0] < 0.15


def test_cost_table_interpolates_and_extrapolates_pessimistically():
    t = CostTable(alpha=1.0)
    assert t(10) == 0.0 and not t.measured
    t.observe(4, 0.04)
    assert t(8) == pytest.approx(0.08)  # one point: proportional above
    assert t(1) == pytest.approx(0.01)  # and below
    t.observe(64, 0.10)
    assert 0.04 < t(32) < 0.10
    assert t(124) == pytest.approx(0.16)  # the last slope above
    t.observe(60, 0.2)  # same bucket as 64: averaged, not a new point
    assert len(t.buckets) == 2
    t.observe(-1, 1.0)
    t.observe(5, float("nan"))
    assert len(t.buckets) == 2


def test_monotone_fit_pools_violators_by_weight():
    assert monotone_fit([1.0, 2.0, 2.0, 5.0], [1, 1, 1, 1]) == [1.0, 2.0, 2.0, 5.0]  # already monotone
    assert monotone_fit([1.0, 3.0, 2.0], [1, 1, 1]) == pytest.approx([1.0, 2.5, 2.5])
    assert monotone_fit([1.0, 3.0, 2.0], [1, 1, 3]) == pytest.approx([1.0, 2.25, 2.25])
    assert monotone_fit([4.0, 3.0, 2.0, 1.0], [1, 1, 1, 1]) == pytest.approx([2.5] * 4)
    rng = np.random.default_rng(0)
    for _ in range(50):  # always non-decreasing, and the weighted mean is kept
        v, w = rng.normal(size=12), rng.uniform(0.5, 3, size=12)
        fit = np.array(monotone_fit(v.tolist(), w.tolist()))
        assert (np.diff(fit) >= -1e-12).all()
        assert float((fit * w).sum()) == pytest.approx(float((v * w).sum()))


def test_cost_table_dip_does_not_make_tokens_free():
    """A noisy cheap reading at a larger size must not make that size cheaper than a smaller one."""
    t = CostTable(alpha=0.2)
    for _ in range(5):
        t.observe(64, 0.30)
    t.observe(100, 0.25)  # one lucky step
    assert t(100) >= t(64) and t(80) >= t(64)
    assert t(64) < 0.30  # the single reading pulls the pooled estimate, weighted 5 : 1
    assert t(64) == pytest.approx((5 * 0.30 + 0.25) / 6)


def test_verify_costs_are_kept_per_number_of_sequences():
    """Eight sequences with 13 drafts (21 tokens) cost less than sixteen sequences with 5: the
    policy at sixteen must price drafts from sixteen-sequence steps, not from the mixture."""
    p = SpecPolicy(max_depth=5)
    for _ in range(3):
        p.observe_verify(16, 0.137, num_seqs=16)
        p.observe_verify(21, 0.180, num_seqs=16)
        p.observe_verify(8, 0.070, num_seqs=8)
        p.observe_verify(21, 0.090, num_seqs=8)
    assert p.verify_model(16)(21) == pytest.approx(0.180)
    assert p.verify_model(8)(21) == pytest.approx(0.090)
    assert p.verify_model(3) is p.verify_cost and p.verify_model(None) is p.verify_cost
    assert p.verify_cost(21) < 0.180  # the mixture would have made drafts at sixteen look cheaper
    p.observe_verify(40, 0.2, num_seqs=40)  # one size only: not enough to interpolate
    assert p.verify_model(40) is p.verify_cost


def _drive(policy: SpecPolicy, verify, draft, accept_rate: float, batch: int, steps: int, rng) -> list[list[int]]:
    """Run the policy against a simulated engine; returns the depths chosen at each step."""
    chosen = []
    for step in range(steps):
        policy.begin_step()
        slots = [DecodeSlot(seq_id=s, max_depth=5 if policy.reserve(s) else 0) for s in range(batch)]
        depths = policy.choose(slots, base_tokens=batch, base_yield=batch)
        for s, d in enumerate(depths):
            n = 0
            while n < d and rng.random() < accept_rate:
                n += 1
            policy.record(s, d, n)
        policy.observe_verify(batch + sum(depths), verify(batch + sum(depths)))
        if any(depths):
            policy.observe_draft(sum(1 for d in depths if d), max(depths), max(depths) * draft(batch))
        chosen.append(depths)
    return chosen


def test_policy_turns_speculation_off_under_compute_bound_load():
    """Batch 32, time proportional to tokens: after the first (unmeasured) step only the round-robin
    explorer drafts, one sequence every 32 steps, each time a different one: one position past the
    depth chosen (0), and its full depth on every fourth exploration."""
    policy = SpecPolicy(max_depth=5, explore_every=32, full_explore_every=4)
    steps = _drive(policy, lambda n: 0.001 * n, lambda b: 0.0005 * b, 0.5, 32, 400, random.Random(1))
    assert steps[0] == [5] * 32
    explorers = []
    for i, depths in enumerate(steps[1:], start=2):
        drafting = [s for s, d in enumerate(depths) if d]
        assert len(drafting) == (1 if i % 32 == 0 else 0), (i, depths)
        if i % 32 == 0:
            assert depths[drafting[0]] == (5 if (i // 32) % 4 == 0 else 1), (i, depths)
            explorers.append(drafting[0])
    assert len(explorers) == 12 and len(set(explorers)) == len(explorers)


def test_policy_speculates_fully_when_memory_bound_and_accepting():
    policy = SpecPolicy(max_depth=5)
    steps = _drive(policy, lambda n: 0.04 + 0.0001 * n, lambda b: 0.001, 0.9, 1, 200, random.Random(2))
    assert all(d == [5] for d in steps[40:])


def test_policy_recovers_when_load_drops():
    """Learned at batch 32 (compute-bound, speculation off), then batch 1 on a memory-bound cost:
    exploration measures the deeper forward and the policy turns speculation back on."""
    policy = SpecPolicy(max_depth=5, explore_every=16)
    rng = random.Random(3)
    cost = lambda n: 0.03 + 0.001 * max(0, n - 24)  # noqa: E731  flat up to 24 tokens, then linear
    _drive(policy, cost, lambda b: 0.0005, 0.8, 32, 100, rng)
    late = _drive(policy, cost, lambda b: 0.0005, 0.8, 1, 100, rng)
    assert all(d == [5] for d in late[40:])


def test_estimates_are_kept_per_draft_source():
    """One sequence whose drafts come from a good source (accepted 90%) on some steps and a poor
    one (2%) on others: the policy drafts fully from the first and not at all from the second;
    with one blended estimate it would do the same depth for both."""
    policy, rng = SpecPolicy(max_depth=5, explore_every=1000), random.Random(4)
    verify = lambda n: 0.03 + 0.006 * n  # noqa: E731  a draft token costs 17% of a plain step
    chosen = {"good": [], "poor": []}
    for step in range(400):
        source = "good" if step % 2 else "poor"
        policy.begin_step()
        assert policy.reserve(0, source) or chosen[source][-1:] == [0]
        depth = policy.choose([DecodeSlot(0, 5, source=source)], base_tokens=1)[0]
        rate = 0.9 if source == "good" else 0.02
        n = 0
        while n < depth and rng.random() < rate:
            n += 1
        if depth:
            policy.record(0, depth, n, source)
            policy.observe_draft(1, depth, 0.001 * depth)
        policy.observe_verify(1 + depth, verify(1 + depth))
        chosen[source].append(depth)
    assert chosen["good"][-50:] == [5] * 50
    assert chosen["poor"][-50:] == [0] * 50
    assert policy.estimator("good").rates(0)[0] > 0.8 > 0.2 > policy.estimator("poor").rates(0)[0]
    assert not policy.reserve(0, "poor") and policy.reserve(0, "good")


def test_draft_costs_are_kept_per_draft_source():
    """Lookup drafts for free, a head costs a third of a plain step per round; both are accepted at
    the same rate. With the costs apart the policy drafts deeper from lookup than from the head;
    the blended table (what a step drafting from both sees) sits between them."""
    policy = SpecPolicy(max_depth=5, explore_every=1000)
    for n in range(1, 7):
        policy.observe_verify(n, 0.03 + 0.002 * (n - 1))
    for depth in (1, 3, 5):
        for source in ("lookup", "head"):
            policy.record(0, depth, depth * 6 // 10, source)
    for _ in range(10):
        policy.observe_draft(1, 4, 4 * 0.00001, {"lookup"})
        policy.observe_draft(1, 4, 4 * 0.01, {"head"})
    policy.observe_draft(2, 4, 4 * 0.5, {"lookup", "head"})  # a mixed step teaches neither source's table
    assert policy.draft_model({"lookup"})(1) < 0.0001 and policy.draft_model({"head"})(1) == pytest.approx(0.01)
    assert policy.draft_model({"lookup"})(1) < policy.draft_model({"lookup", "head"})(1) < 0.01
    assert policy.draft_model({"never-measured"}) is policy.draft_cost
    policy.begin_step()  # step 1: not an exploration step
    deep = policy.choose([DecodeSlot(1, 5, source="lookup")], base_tokens=1)[0]
    shallow = policy.choose([DecodeSlot(1, 5, source="head")], base_tokens=1)[0]
    assert shallow < deep
    policy.draft_cost_by_source.clear()  # one blended table: the same depth from both
    assert (policy.choose([DecodeSlot(1, 5, source="lookup")], base_tokens=1)
            == policy.choose([DecodeSlot(1, 5, source="head")], base_tokens=1))


def test_a_new_source_is_measured_once_even_when_drafts_look_too_costly():
    policy = SpecPolicy(max_depth=5, explore_every=1000)
    for _ in range(3):  # compute-bound: every token costs as much as a sequence
        policy.observe_verify(1, 0.01)
        policy.observe_verify(6, 0.06)
    policy.begin_step()
    assert policy.choose([DecodeSlot(1, 5, source="new")], base_tokens=1) == [5]
    policy.record(1, 5, 0, "new")
    policy.begin_step()
    assert policy.choose([DecodeSlot(1, 5, source="new")], base_tokens=1) == [0]


def test_no_draft_source_means_no_draft_and_no_reservation():
    policy = SpecPolicy(max_depth=5)
    policy.observe_verify(1, 0.01)
    policy.observe_verify(6, 0.011)
    assert not policy.reserve(7, None)
    assert policy.choose([DecodeSlot(7, 5, source=None), DecodeSlot(8, 5)], base_tokens=2) == [0, 5]
    assert policy.reserve(7, "") and policy.reserve(7, "other"), "no draft now says nothing about later"


def test_fixed_and_disabled_slots_are_left_alone():
    policy = SpecPolicy(max_depth=5)
    for _ in range(3):
        policy.observe_verify(1, 0.01)
        policy.observe_verify(64, 0.64)
        policy.observe_draft(1, 1, 0.005)
    slots = [DecodeSlot(1, 3, fixed=True), DecodeSlot(2, 0), DecodeSlot(3, 5)]
    for _ in range(40):
        policy.begin_step()
        depths = policy.choose(slots, base_tokens=3)
        assert depths[0] == 3 and depths[1] == 0 and 0 <= depths[2] <= 5


# ---- wired into the engine -----------------------------------------------------------------------
def test_engine_with_adaptive_policy_is_lossless_and_respects_fixed_requests(tiny_target_dir, tiny_prompts,
                                                                           tiny_baseline):
    """Whatever depth the policy picks (0..K), greedy output equals plain decoding; a request that
    fixes spec_tokens drafts exactly that (the policy leaves it alone)."""
    from actors.sampling_params import SamplingParams
    from tests.tiny import TINY_MAX_TOKENS, tiny_engine

    eng = tiny_engine(tiny_target_dir, draft="ngram", k=4, adaptive=True)
    assert eng.spec_policy is not None
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    outs = eng.generate(tiny_prompts, params, concurrency=4)
    assert [o.token_ids for o in outs] == tiny_baseline
    assert eng.spec_policy.verify_cost.measured and eng.spec_policy.num_steps > 0
    assert all(not est.per_seq for est in eng.spec_policy.acceptance.values())  # released at finish
    fixed = eng.generate(tiny_prompts[:2], SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True, spec_tokens=0))
    assert [o.token_ids for o in fixed] == tiny_baseline[:2]
    assert all(o.num_drafts == 0 for o in fixed)


def test_verify_costs_come_from_decode_only_steps(tiny_target_dir, tiny_prompts):
    """A forward that is mostly a prefill chunk is cheaper per token than decoding the same number
    of tokens over many sequences: those steps must not teach the policy that drafts are free."""
    from actors.sampling_params import SamplingParams
    from tests.tiny import tiny_engine

    long_prompts = [p for p in tiny_prompts if len(p) > 16][:2]
    assert len(long_prompts) == 2
    eng = tiny_engine(tiny_target_dir, draft="ngram", k=4, adaptive=True)
    eng.generate(long_prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    sizes = [n for n, _ in eng.spec_policy.verify_cost.buckets.values()]
    assert sizes and max(sizes) <= 2 * 5  # two decoding sequences, a root and 4 drafts each


def test_prefill_comes_before_drafts(tiny_target_dir, tiny_prompts, tiny_baseline):
    """When the token budget cannot hold both the waiting prompts and full drafts, the policy's
    sequences draft nothing that step; once prompts are in, drafting resumes. Output unchanged."""
    from actors.sampling_params import SamplingParams
    from tests.tiny import TINY_MAX_TOKENS, tiny_engine

    eng = tiny_engine(tiny_target_dir, draft="ngram", k=4, adaptive=True, max_num_batched_tokens=16)
    assert eng.scheduler.prefill_backlog() == 0 and not eng.drafting.drafts_would_shrink_prefill()
    steps = []
    propose = eng.drafting.propose

    def spy(scheduled):
        trees, draft_s = propose(scheduled)
        steps.append((eng.drafting.hold, eng.scheduler.prefill_backlog(), len(trees)))
        return trees, draft_s

    eng.drafting.propose = spy
    outs = eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=4)
    assert [o.token_ids for o in outs] == tiny_baseline
    held = [s for s in steps if s[0]]
    assert held and all(n_trees == 0 for _, _, n_trees in held)
    assert any(n_trees > 0 for hold, _, n_trees in steps if not hold)
    assert not eng.drafting.drafts_would_shrink_prefill()  # nothing waits any more


def test_fixed_spec_config_has_no_policy(tiny_target_dir, tiny_draft_dir):
    from actors.sampling_params import SamplingParams
    from tests.tiny import tiny_engine

    assert tiny_engine(tiny_target_dir, draft="ngram", k=4, adaptive=False).spec_policy is None
    eng = tiny_engine(tiny_target_dir, draft="draft", draft_dir=tiny_draft_dir, k=3, adaptive=False)
    out = eng.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert eng.spec_policy is None and out.num_output_tokens == 12 and out.num_drafts > 0
    assert eng.drafting.sources == {}, "without a policy no draft sources are looked up (or kept)"
