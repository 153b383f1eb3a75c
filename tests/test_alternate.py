"""benchmarks.alternate: the arms take turns (ABBA), every arm answers the same requests, and the
report's ratios and round counts come from the per-round figures."""
from __future__ import annotations

import pytest

from actors.sampling_params import SamplingParams
from benchmarks.alternate import ArmRun, alternate, report, same_outputs
from tests.tiny import tiny_engine


def test_arms_take_turns_on_the_same_requests(tiny_target_dir, tiny_prompts):
    arms = {"plain": tiny_engine(tiny_target_dir), "chain": tiny_engine(tiny_target_dir, draft="layerskip:1", k=3)}
    params = [SamplingParams(max_tokens=8, ignore_eos=True)] * 3
    seen = []
    runs = alternate(arms, tiny_prompts[:3], params, rounds=3, chat=False, warmup=1, on_run=seen.append)
    assert [(r.round, r.arm) for r in seen] == [(0, "plain"), (0, "chain"), (1, "chain"), (1, "plain"),
                                                 (2, "plain"), (2, "chain")]
    assert same_outputs(runs) and all(r.tokens == 24 and r.steps > 0 and r.seconds > 0 for r in runs)
    assert min(r.steps for r in runs if r.arm == "chain") < min(r.steps for r in runs if r.arm == "plain")
    with pytest.raises(ValueError, match="rounds=0"):
        alternate(arms, tiny_prompts[:1], params[:1], rounds=0, chat=False)


def test_report_compares_each_round_with_the_baseline():
    def run(r, arm, seconds):
        return ArmRun(r, arm, 100, 50, seconds, ((1, 2),))
    runs = [run(0, "a", 1.0), run(0, "b", 0.5), run(1, "b", 2.0), run(1, "a", 1.0)]
    table = report(runs, baseline="a")
    assert "| a | 100.0, 100.0 | 100.0 | 2.00 |  |" in table
    assert "| b | 200.0, 50.0 | 125.0 | 2.00 | 1.250x, faster in 1 of 2 |" in table
    assert not same_outputs(runs + [ArmRun(2, "a", 100, 50, 1.0, ((1, 3),))])
    with pytest.raises(ValueError, match="baseline 'c' is not an arm"):
        report(runs, baseline="c")


def test_phase_log_reports_each_pass_from_its_engines_clock():
    """Ms per step of each phase since the same clock's last pass: two arms sharing one engine see
    each other's passes as the clock's history, not their own."""
    from benchmarks.alternate import PhaseLog, ms_per_step

    class Clock:
        def __init__(self):
            self.snap = {"steps": 0, "schedule": 0.0, "forward": 0.0}

        def snapshot(self):
            return dict(self.snap)

    class Engine:
        clock = Clock()

    eng = Engine()
    log = PhaseLog(lambda arm: eng, phases=("forward",))
    eng.clock.snap = {"steps": 10, "schedule": 0.002, "forward": 0.08}
    assert log.line(ArmRun(0, "a", 20, 10, 0.1, ())) == (
        "round 0 a: 20 tokens, 200.0 tok/s, 2.00 tokens/step, step 8.20 ms (forward 8.000 ms)")
    eng.clock.snap = {"steps": 30, "schedule": 0.004, "forward": 0.18}
    assert log.line(ArmRun(0, "b", 20, 20, 0.1, ())).endswith("step 5.10 ms (forward 5.000 ms)")
    assert ms_per_step({"steps": 4, "x": 1.0}, {"steps": 4, "x": 1.0}) == {"x": 0.0}  # no step: no division
