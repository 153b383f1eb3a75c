"""benchmarks.activation_quality: where two answers turn, and the table of the three product modes on
the default model (one prompt per set)."""
from __future__ import annotations

import json

import pytest

from benchmarks import activation_quality as aq


def test_first_difference_names_where_answers_turn():
    assert aq.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert aq.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert aq.first_difference([1, 2], [1, 2, 3]) == 2  # one answer stops early
    assert aq.first_difference([], [4]) == 0


@pytest.mark.model
def test_the_modes_on_the_default_model(default_model, tmp_path, capsys):
    from kernels import cpu_native

    if not cpu_native.load():
        pytest.skip(f"CPU kernels not built: {cpu_native.unavailable_reason()}")
    assert aq.main(["--sample", "1", "--out", str(tmp_path)]) == 0
    rows = {r["mode"]: r for r in json.loads((tmp_path / "activation_quality.json").read_text())}
    assert set(rows) == set(aq.MODES)
    ref = rows["float32"]
    assert ref["same_answers"] == ref["prompts"] == 2 and ref["top1_agreement"] == 1.0 and ref["turns"] == []
    for mode in ("int16", "int8"):  # close to the reference, and measured on the same tokens
        assert rows[mode]["ref_tokens"] == ref["ref_tokens"] > 0
        assert rows[mode]["top1_agreement"] > 0.9 and abs(rows[mode]["nll"] - ref["nll"]) < 0.1
    assert rows["int8"]["nll"] != ref["nll"]  # 8-bit activations do change the logits
    assert "| int8 |" in capsys.readouterr().out


def test_a_bad_sample_is_named(capsys):
    with pytest.raises(SystemExit):
        aq.main(["--sample", "0"])
    assert "--sample 0: must be at least 1" in capsys.readouterr().err
