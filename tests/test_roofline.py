"""benchmarks/roofline.py: the bound's arithmetic against hand-computed cases, bandwidth figures are
positive, weight bytes count tied weights once, and bad flags name the value."""
from __future__ import annotations

import pytest
import torch

from benchmarks import roofline


def test_the_bound_by_hand():
    # 500 MB of weights read at 40 GB/s: 80 passes a second, 12.5 ms each; 2.5 tokens per verified
    # step -> 200 tokens/s; a measured TPOT of 25 ms is twice the 12.5 ms bound: 50% of it.
    bound = roofline.Roofline(bandwidth_gbs=40.0, weight_bytes=500_000_000)
    assert bound.steps_per_s == pytest.approx(80.0)
    assert bound.ms_per_step == pytest.approx(12.5)
    assert bound.tokens_per_s(1) == pytest.approx(80.0) and bound.tokens_per_s(2.5) == pytest.approx(200.0)
    assert bound.percent_of_bound(25.0) == pytest.approx(50.0)
    assert bound.percent_of_bound(12.5) == pytest.approx(100.0)


@pytest.mark.parametrize("matvec, engine, used", [(30.0, 40.0, 40.0), (45.0, 20.0, 45.0)])
def test_the_bound_uses_the_faster_matvec(matvec, engine, used):
    bw = {"copy": 90.0, "sum": 80.0, "matvec": matvec, "engine_matvec": engine}  # copy and sum never count
    assert roofline.roofline(bw, 250_000_000) == roofline.Roofline(used, 250_000_000)


def test_main_prints_the_hand_computed_figures(monkeypatch, capsys):
    monkeypatch.setattr(roofline, "measure_bandwidth",
                        lambda mbytes, reps: {"copy": 60.0, "sum": 50.0, "matvec": 30.0, "engine_matvec": 40.0})
    monkeypatch.setattr(roofline, "weight_bytes", lambda model, dtype: 500_000_000)
    assert roofline.main(["--model", "m", "--dtype", "float32", "--tpot-ms", "25", "--tokens-per-step", "1,2.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "copy 60.0 GB/s, sum 50.0 GB/s, mat-vec 30.0 GB/s (torch.mv), 40.0 GB/s (kernels.cpu_linear)" in lines[0]
    assert lines[1:] == ["m weights in float32: 500 MB -> roofline 80.0 steps/s (12.5 ms per step)",
                         "  1 tokens per step: 80.0 tokens/s",
                         "  2.5 tokens per step: 200.0 tokens/s",
                         "measured TPOT 25.0 ms = 50% of the bandwidth bound"]


def test_bandwidth_figures_are_positive():
    bw = roofline.measure_bandwidth(mbytes=8, reps=1)
    assert set(bw) == {"copy", "sum", "matvec", "engine_matvec"} and all(v > 0 for v in bw.values())


def test_weight_bytes_follow_the_dtype(tiny_target_dir):
    from actors.model.loader import load_model

    n = sum(p.numel() for p in load_model(tiny_target_dir).model.parameters())
    assert roofline.weight_bytes(str(tiny_target_dir), torch.float32) == 4 * n
    assert roofline.weight_bytes(str(tiny_target_dir), torch.bfloat16) == 2 * n
    from kernels import cpu_native
    if cpu_native.load():  # streamed: fp32 packs of a model with no GGUF blocks (its shapes need no padding)
        assert roofline.weight_bytes(str(tiny_target_dir), None) == 4 * n


def test_roofline_prints_the_bound(tiny_target_dir, capsys):
    assert roofline.main(["--model", str(tiny_target_dir), "--mbytes", "64", "--reps", "1",
                          "--tpot-ms", "10", "--tokens-per-step", "1,2.5"]) == 0
    out = capsys.readouterr().out
    assert "steps/s" in out and "2.5 tokens per step" in out and "of the bandwidth bound" in out


@pytest.mark.parametrize("argv, bad", [(["--tokens-per-step", "1,x"], "'1,x'"), (["--mbytes", "8"], "--mbytes 8")])
def test_bad_flags_name_the_value(argv, bad, capsys):
    with pytest.raises(SystemExit) as e:
        roofline.main(argv)
    assert e.value.code == 2 and bad in capsys.readouterr().err
