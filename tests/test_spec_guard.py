"""The fallback guard's state machine (cluster/spec_guard.py) on a fake clock: the plain-decoding
baseline and the estimated speedup, windows, trips after N failing windows, cool-down, probing,
recovery, baseline probes, and what it logs; its config's validation."""
from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from cluster.spec_guard import BASELINE_MAX_AGE_WINDOWS, FallbackGuardConfig, SpecGuard, StepYield

PLAIN_S = 0.020  # a plain decode step of 1..4 sequences on the fake machine


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def plain(b: int = 2, seconds: float = PLAIN_S) -> StepYield:
    return StepYield(plain_seqs=b, decode_only=True, seconds=seconds)


def spec(tokens_per_seq: float, b: int = 2, seconds: float = 0.030, chosen: bool = True) -> StepYield:
    """A speculative decode step: every one of ``b`` sequences drafted and produced ``tokens_per_seq``."""
    return StepYield(drafted_seqs=b, drafted_tokens=round(tokens_per_seq * b), chosen=chosen, decode_only=True,
                     seconds=seconds)


@pytest.fixture
def clock():
    return Clock()


def make(clock, **cfg) -> SpecGuard:
    g = SpecGuard(FallbackGuardConfig(**{"window_steps": 4, "windows": 3, "cooldown_s": 60.0, **cfg}), clock)
    g.observe(plain(1))
    g.observe(plain(4))
    return g


def window(g: SpecGuard, tokens_per_seq: float, n: int | None = None) -> None:
    for _ in range(n or g.config.window_steps):
        g.observe(spec(tokens_per_seq))


# ---- the estimate -------------------------------------------------------------------------------
def test_plain_equivalent_seconds_and_speedup(clock):
    g = make(clock)
    y = g.observe(spec(3.0, b=2, seconds=0.030))  # 6 tokens; plain: 2 tokens per 20 ms
    assert y.plain_equiv_s == pytest.approx(6 * PLAIN_S / 2)
    window(g, 3.0, 3)
    assert g.last_speedup == pytest.approx(0.060 / 0.030)


def test_no_estimate_outside_the_measured_sizes(clock):
    g = SpecGuard(FallbackGuardConfig(), clock)
    assert g.observe(spec(3.0)).plain_equiv_s is None  # nothing measured yet
    g.observe(plain(2, 0.020))
    g.observe(plain(8, 0.040))
    assert g.plain_seconds(4) == pytest.approx(0.020 + 0.020 * 2 / 6)  # interpolated
    assert g.plain_seconds(1) is None and g.plain_seconds(9) is None  # not scaled beyond what was measured
    assert g.observe(spec(2.0, b=1)).plain_equiv_s is None


def test_steps_that_are_not_decode_only_are_ignored(clock):
    g = make(clock)
    before = g.window.seq_steps
    mixed = StepYield(drafted_seqs=2, drafted_tokens=6, plain_seqs=1, chosen=True, decode_only=False, seconds=1.0)
    assert g.observe(mixed).plain_equiv_s is None
    assert g.window.steps == 0 and g.window.seq_steps == before
    g.observe(StepYield(plain_seqs=3, seconds=5.0))  # a prefill step: not a baseline
    assert g.plain_seconds(3) == pytest.approx(PLAIN_S)


# ---- windows and the state machine -------------------------------------------------------------
def test_trips_after_n_consecutive_failing_windows(clock, caplog):
    g = make(clock)
    caplog.set_level(logging.INFO, logger="specray.engine")
    window(g, 1.0)  # 2 tokens in 30 ms vs 2 in 20 ms: speedup 0.67
    window(g, 1.0)
    assert g.failed == 2 and g.allows_speculation() and not g.tripped
    window(g, 1.0)
    assert g.tripped and g.num_trips == 1 and not g.allows_speculation()
    assert g.last_speedup == pytest.approx(2 / 3)
    assert "speculation guard tripped (estimated speedup 0.67 < 1.00 in 3 consecutive windows" in caplog.text


def test_a_passing_window_resets_the_count(clock):
    g = make(clock)
    window(g, 1.0)
    window(g, 1.0)
    window(g, 3.0)  # speedup 2.0
    assert g.failed == 0
    window(g, 1.0)
    window(g, 1.0)
    assert not g.tripped


def test_cooldown_then_probe_then_recover(clock, caplog):
    g = make(clock)
    caplog.set_level(logging.INFO, logger="specray.engine")
    g.trip()
    clock.t += 59.9
    assert not g.allows_speculation()
    clock.t += 0.2
    assert g.allows_speculation() and g.state == "probing" and not g.tripped
    assert "probing speculation again" in caplog.text
    window(g, 3.0)
    assert g.state == "on" and g.num_trips == 1
    assert "speculation guard recovered: estimated speedup 2.00 >= 1.00" in caplog.text


def test_a_failing_probe_window_trips_again_at_once(clock):
    g = make(clock)
    g.trip()
    clock.t += 60
    assert g.allows_speculation()
    window(g, 1.0)
    assert g.tripped and g.num_trips == 2
    assert g.off_until == pytest.approx(clock.t + 60)


def test_the_probe_window_does_not_count_the_cooldown_plain_steps(clock):
    g = make(clock)
    g.trip()
    for _ in range(1000):  # the cool-down decodes plainly: nothing to dilute the probe window with
        g.observe(plain(2))
    clock.t += 60
    g.allows_speculation()
    window(g, 1.0)
    assert g.tripped and g.num_trips == 2


def test_fixed_k_requests_and_rare_drafts_are_not_judged(clock):
    g = make(clock)
    for _ in range(3 * 4):  # steps drafted only by requests that fixed their own K
        g.observe(spec(1.0, chosen=False))
    assert g.window.steps == 0 and g.last_speedup is None
    g = make(clock)
    for _ in range(3):  # the adaptive policy keeps speculation off but explores: 1 step in 32
        for _ in range(4):
            for _ in range(31):
                g.observe(plain(2))
            g.observe(spec(1.0))
    assert g.last_speedup is None and not g.tripped and g.failed == 0


def test_baseline_probes(clock):
    g = SpecGuard(FallbackGuardConfig(window_steps=4), clock)
    window(g, 2.0)  # no baseline yet: the window is not judged, a probe is asked for
    assert g.last_speedup is None
    assert g.take_probe() and not g.take_probe()  # once
    g.observe(plain(2))
    window(g, 2.0)
    assert g.last_speedup is not None and not g.take_probe()
    for _ in range(BASELINE_MAX_AGE_WINDOWS - 2):
        window(g, 2.0)
    assert not g.take_probe()
    window(g, 2.0)  # no plain step for BASELINE_MAX_AGE_WINDOWS windows: measure again
    assert g.take_probe()


def test_disabled_guard_estimates_but_never_trips(clock):
    g = make(clock, enabled=False)
    for _ in range(10):
        window(g, 1.0)
    assert not g.tripped and g.allows_speculation() and not g.take_probe()
    assert g.observe(spec(1.0)).plain_equiv_s == pytest.approx(PLAIN_S)


def test_windows_of_one_with_n_of_one(clock):
    g = make(clock, window_steps=1, windows=1, cooldown_s=0.0)
    g.observe(spec(1.0))
    assert g.tripped
    assert g.allows_speculation() and g.state == "probing"  # no cool-down
    g.observe(spec(3.0))
    assert g.state == "on"


# ---- config ------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("window_steps", 0), ("windows", 0), ("min_speedup", 0.0),
                                         ("cooldown_s", -1.0), ("windws", 3)])
def test_config_errors_name_the_bad_value(field, value):
    with pytest.raises(ValidationError) as e:
        FallbackGuardConfig(**{field: value})
    assert field in str(e.value) and str(value) in str(e.value)


def test_speculative_config_embeds_the_guard():
    from cluster.config import SpeculativeConfig

    spec = SpeculativeConfig(method="ngram", fallback_guard={"windows": 5, "cooldown_s": 30})
    assert spec.fallback_guard == FallbackGuardConfig(windows=5, cooldown_s=30.0)
    assert SpeculativeConfig().fallback_guard.enabled
