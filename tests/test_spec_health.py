"""Speculation health on a tiny engine: the per-step counters agree with the requests' own
figures, the estimated speedup is exported, a tripped guard makes the engine decode without
drafts (greedy output unchanged) until its cool-down ends, a draft that costs more than it gains
trips the guard by itself, and engine_up follows the step loop."""
from __future__ import annotations

import time

import pytest

from actors.proposers.base import Proposer
from actors.sampling_params import SamplingParams
from actors.tree import TokenTree
from cluster.async_engine import AsyncLLMEngine
from cluster.metrics import EngineMetrics
from cluster.metrics_merge import merge_snapshots
from cluster.spec_guard import FallbackGuardConfig, SpecGuard
from tests.test_metrics import _v
from tests.tiny import TINY_MAX_TOKENS, tiny_engine

GREEDY = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _steps(snap, drafted: str) -> float:
    return _v(snap, "spec_decode_num_decode_steps_total", drafted=drafted)


def _tokens(snap, drafted: str) -> float:
    return _v(snap, "spec_decode_num_decode_tokens_total", drafted=drafted)


def test_step_counters_agree_with_the_requests(tiny_target_dir, tiny_draft_dir, tiny_prompts, tiny_baseline):
    eng = tiny_engine(tiny_target_dir, draft="draft", draft_dir=tiny_draft_dir, k=4)
    outs = eng.generate(tiny_prompts, GREEDY, concurrency=3)
    assert [o.token_ids for o in outs] == tiny_baseline
    snap = eng.metrics.snapshot()
    assert _steps(snap, "true") == sum(o.num_drafts for o in outs) > 0  # vLLM's drafts, counted per step
    assert _tokens(snap, "true") - _steps(snap, "true") == sum(o.num_accepted_tokens for o in outs)
    assert _tokens(snap, "false") == _steps(snap, "false")  # plain steps: one token each
    # every output token after the first (which prefill samples) came from a decode step
    assert _tokens(snap, "true") + _tokens(snap, "false") == sum(len(o.token_ids) - 1 for o in outs)
    measured, plain = _v(snap, "spec_decode_measured_seconds_total"), _v(snap, "spec_decode_plain_equivalent_seconds_total")
    assert (measured > 0) == (plain > 0)


def test_no_speculation_counts_plain_steps_only(tiny_target_dir, tiny_prompts):
    eng = tiny_engine(tiny_target_dir)
    outs = eng.generate(tiny_prompts[:2], GREEDY)
    snap = eng.metrics.snapshot()
    assert _steps(snap, "true") == 0 and _steps(snap, "false") == sum(len(o.token_ids) - 1 for o in outs)
    assert _v(snap, "spec_decode_guard_tripped") == 0 and _v(snap, "spec_decode_guard_trips_total") == 0
    assert eng.drafting.guard is None


def test_a_tripped_guard_decodes_without_drafts_until_its_cooldown_ends(tiny_target_dir, tiny_prompts, tiny_baseline):
    eng = tiny_engine(tiny_target_dir, draft="ngram", k=4)
    guard, clock = eng.drafting.guard, Clock()
    guard.clock = clock
    guard.trip()
    outs = eng.generate(tiny_prompts, GREEDY, concurrency=4)
    assert [o.token_ids for o in outs] == tiny_baseline
    assert sum(o.num_draft_tokens for o in outs) == 0
    snap = eng.metrics.snapshot()
    assert _v(snap, "spec_decode_guard_tripped") == 1 and _v(snap, "spec_decode_guard_trips_total") == 1
    assert _steps(snap, "true") == 0
    clock.t += guard.config.cooldown_s  # cool-down over: speculation is probed again
    outs = eng.generate(tiny_prompts, GREEDY, concurrency=4)
    assert [o.token_ids for o in outs] == tiny_baseline
    assert sum(o.num_draft_tokens for o in outs) > 0
    assert guard.state in ("probing", "on")
    assert _v(eng.metrics.snapshot(), "spec_decode_guard_tripped") == 0


class SlowWrongDraft(Proposer):
    """A chain of token 0 after a long think: costs far more than the tiny target's forward and is
    (nearly) never accepted."""

    name = "slow-wrong"

    def propose(self, reqs):
        time.sleep(0.1)
        return [TokenTree.chain(r.token_ids[-1], [0] * len(r.expansion)) for r in reqs]

    def release(self, seq_id):
        pass


def test_a_draft_that_does_not_pay_trips_the_guard(tiny_target_dir, tiny_prompts, tiny_baseline, caplog):
    eng = tiny_engine(tiny_target_dir, draft="ngram", k=3)
    eng.drafting.proposer = SlowWrongDraft()
    guard = eng.drafting.guard
    guard.config = FallbackGuardConfig(window_steps=3, windows=2, cooldown_s=3600)
    outs = eng.generate(tiny_prompts, GREEDY, concurrency=8)
    assert [o.token_ids for o in outs] == tiny_baseline
    assert guard.num_trips == 1 and guard.tripped
    assert guard.last_speedup is not None and guard.last_speedup < 1.0
    assert "speculation guard tripped" in caplog.text
    snap = eng.metrics.snapshot()
    assert _v(snap, "spec_decode_estimated_speedup") == pytest.approx(guard.last_speedup)
    measured, plain = _v(snap, "spec_decode_measured_seconds_total"), _v(snap, "spec_decode_plain_equivalent_seconds_total")
    assert 0 < plain < measured  # the counters tell the same story: speedup = plain / measured < 1
    drafted_after_trip = eng.generate(tiny_prompts, GREEDY, concurrency=8)
    assert sum(o.num_draft_tokens for o in drafted_after_trip) == 0


def test_guard_gauges_merge_across_replicas():
    snaps = []
    for tripped, speedup in ((True, 0.8), (False, 1.6), (False, None)):
        m, g = EngineMetrics(), SpecGuard()
        if tripped:
            g.trip()
        g.last_speedup = speedup
        m.watch(None, None, 0, g)
        snaps.append(m.snapshot())
    merged = merge_snapshots(snaps)
    assert _v(merged, "spec_decode_guard_tripped") == 1  # replicas tripped
    assert _v(merged, "spec_decode_guard_trips_total") == 1
    assert _v(merged, "spec_decode_estimated_speedup") == pytest.approx(1.2)  # mean of those that report one
    assert _v(merged, "engine_up") == 3


def test_engine_up_follows_the_step_loop(tiny_target_dir):
    eng = tiny_engine(tiny_target_dir)
    assert _v(eng.metrics.snapshot(), "engine_up") == 1  # an engine without a loop
    aeng = AsyncLLMEngine(eng)
    assert _v(eng.metrics.snapshot(), "engine_up") == 1
    aeng.shutdown()
    assert _v(eng.metrics.snapshot(), "engine_up") == 0
