"""The benchmark's arithmetic (percentiles, TPOT, decode rate, speedups, acceptance), the
stratified sample of the prompt set and `specray tune`'s recommendation: pure functions, no model."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from benchmarks.metrics_math import (decode_tokens_per_s, mean_accepted_length, per_position_acceptance, percentile,
                                     speedup, tpot_s)
from benchmarks.prompt_set import BenchPrompt, allocate, stratified_sample
from benchmarks.results import RequestRecord, Run, Variant, add_speedups, run_row
from benchmarks.tune import recommend

BENCH500_MIX = {"short_qa": 150, "summarization": 100, "code_generation": 80, "creative_writing": 50,
                "translation": 70, "structured_output": 50}


def _mix(counts: dict[str, int]) -> list[BenchPrompt]:
    return [BenchPrompt(f"{c}-{i}", c, "x") for c, n in counts.items() for i in range(n)]


# ---- the arithmetic -------------------------------------------------------------------------

def test_percentile_matches_numpy_linear():
    rng = random.Random(1)
    for n in (1, 2, 5, 20, 101):
        xs = [rng.uniform(0, 10) for _ in range(n)]
        for q in (0, 50, 95, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="q=101"):
        percentile([1.0], 101)


def test_tpot_speedup_and_acceptance_definitions():
    assert tpot_s(e2e_s=1.0, ttft_s=0.2, output_tokens=5) == pytest.approx(0.2)
    assert tpot_s(1.0, 0.2, 1) is None  # one token: no time *per output token after the first*
    assert speedup(30.0, 15.0) == 2.0
    assert speedup(30.0, None) is None and speedup(30.0, 0.0) is None
    assert mean_accepted_length(accepted=6, drafts=4) == 2.5 and mean_accepted_length(0, 0) is None
    assert per_position_acceptance([4, 2], drafts=4) == [1.0, 0.5]


def test_budget_caps_the_prompts_own_max_tokens():
    assert BenchPrompt("a", "c", "x", max_tokens=300).budget(None) == 300
    assert BenchPrompt("a", "c", "x", max_tokens=300).budget(64) == 64
    assert BenchPrompt("a", "c", "x", max_tokens=20).budget(64) == 20
    assert BenchPrompt("a", "c", "x").budget(64) == 64


def test_stratified_sample_keeps_proportions_and_is_deterministic():
    items = _mix(BENCH500_MIX)
    random.Random(0).shuffle(items)
    sample = stratified_sample(items, 50, seed=7)
    counts = {c: sum(p.category == c for p in sample) for c in BENCH500_MIX}
    assert counts == {c: n // 10 for c, n in BENCH500_MIX.items()}  # exactly 10% of each
    assert [p.id for p in stratified_sample(items, 50, seed=7)] == [p.id for p in sample]
    assert [p.id for p in stratified_sample(items, 50, seed=8)] != [p.id for p in sample]
    pos = {p.id: i for i, p in enumerate(items)}
    assert [pos[p.id] for p in sample] == sorted(pos[p.id] for p in sample)  # file order kept
    for n in (1, 7, 33, 499, 500):  # uneven shares: each category gets floor or ceil of its share
        got = allocate(BENCH500_MIX, n)
        assert sum(got.values()) == n
        assert all(math.floor(n * k / 500) <= got[c] <= math.ceil(n * k / 500) for c, k in BENCH500_MIX.items())
    with pytest.raises(ValueError, match="--sample 501"):
        stratified_sample(items, 501)


def _rec(cat, tokens, e2e, ttft=0.1, drafts=0, draft_tokens=0, accepted=0, per_pos=()):
    return RequestRecord(cat, tokens, e2e, ttft, drafts, draft_tokens, accepted, list(per_pos))


def test_summary_rows_and_speedups_per_category():
    base = Run("none", Variant(), 0.0, 1, 4.0, [_rec("a", 10, 1.0), _rec("b", 30, 3.0)])
    spec = Run("ngram", Variant(spec_tokens=2), 0.0, 1, 2.0,
               [_rec("a", 10, 0.5, drafts=4, draft_tokens=8, accepted=6, per_pos=[4, 2]),
                _rec("b", 30, 1.5, drafts=10, draft_tokens=20, accepted=5, per_pos=[5])])
    other_c = Run("ngram", Variant(spec_tokens=2), 0.0, 8, 1.0, [_rec("a", 10, 0.5)])
    rows = [run_row(r) for r in (base, spec, other_c)]
    add_speedups(rows)
    b, s, o = rows
    assert b["tokens_per_s"] == 10.0 and b["speedup"] == 1.0
    assert s["tokens_per_s"] == 20.0 and s["speedup"] == 2.0
    assert o["speedup"] is None  # no baseline at concurrency 8 in this run
    assert s["acceptance_rate"] == pytest.approx(11 / 28)
    assert s["mean_accepted_length"] == pytest.approx(1 + 11 / 14)
    assert s["per_position_acceptance"] == pytest.approx([9 / 14, 2 / 14])
    assert s["tpot_p50_s"] == pytest.approx(percentile([(0.5 - 0.1) / 9, (1.5 - 0.1) / 29], 50))
    assert s["categories"]["a"]["speedup"] == pytest.approx(2.0)
    assert s["categories"]["b"]["acceptance_rate"] == pytest.approx(0.25)
    # decode phase: tokens after the first over time after the first (TTFT 0.1 s each)
    assert b["decode_tokens_per_s"] == pytest.approx(38 / (0.9 + 2.9))
    assert s["decode_tokens_per_s"] == pytest.approx(38 / (0.4 + 1.4))
    assert s["decode_speedup"] == pytest.approx(3.8 / 1.8) and b["decode_speedup"] == 1.0


def test_decode_rate_leaves_prefill_out():
    # same decode, prefill 10x longer: the E2E rate falls, the decode rate does not
    short, long_ = [(1.1, 0.1, 11)], [(2.0, 1.0, 11)]
    assert decode_tokens_per_s(short) == decode_tokens_per_s(long_) == pytest.approx(10.0)
    assert decode_tokens_per_s([(0.5, 0.5, 1)]) is None  # one token: nothing decoded after the first
    assert decode_tokens_per_s([]) is None


def _tune_row(c, k, tps, speedup_):
    return {"method": "none" if k == 0 else "ngram", "spec": f"K={k}", "spec_tokens": k or None, "tree": None,
            "concurrency": c, "tokens_per_s": tps, "speedup": speedup_}


def test_recommend_prefers_smaller_k_on_ties_and_off_when_speculation_loses():
    rows = [_tune_row(1, 0, 10.0, 1.0), _tune_row(1, 3, 15.0, 1.5), _tune_row(1, 5, 15.2, 1.52),
            _tune_row(8, 0, 40.0, 1.0), _tune_row(8, 3, 30.0, 0.75), _tune_row(8, 5, 28.0, 0.7)]
    rec = recommend(rows, tolerance=0.02)
    assert rec["per_concurrency"][1]["spec_tokens"] == 3  # 15.0 is within 2% of 15.2
    assert recommend(rows, tolerance=0.0)["per_concurrency"][1]["spec_tokens"] == 5
    assert rec["per_concurrency"][8]["method"] == "none"
    label, score = rec["overall"]
    assert label == "K=3" and score == pytest.approx(math.sqrt(1.5 * 0.75))
