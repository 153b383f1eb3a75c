"""benchmarks/roofline.py: bandwidth figures are positive, weight bytes count tied weights once,
and bad flags name the value."""
from __future__ import annotations

import pytest
import torch

from benchmarks import roofline


def test_bandwidth_figures_are_positive():
    bw = roofline.measure_bandwidth(mbytes=8, reps=1)
    assert set(bw) == {"copy", "sum", "matvec", "engine_matvec"} and all(v > 0 for v in bw.values())


def test_weight_bytes_follow_the_dtype(tiny_target_dir):
    from actors.model.loader import load_model

    n = sum(p.numel() for p in load_model(tiny_target_dir).model.parameters())
    assert roofline.weight_bytes(str(tiny_target_dir), torch.float32) == 4 * n
    assert roofline.weight_bytes(str(tiny_target_dir), torch.bfloat16) == 2 * n


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
