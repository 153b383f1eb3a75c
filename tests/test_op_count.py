"""benchmarks/op_count.py on the tiny random model: the counts add up, every layer but the first
(which builds the per-forward attention metadata) costs the same, verify steps are counted with
their tree mask, the layer scopes are removed afterwards, and bad flags name the value."""
from __future__ import annotations

import pytest
import torch

from benchmarks import op_count


@pytest.fixture(scope="module")
def runner(tiny_target_dir):
    from actors.model.loader import load_model

    model = load_model(tiny_target_dir, dtype=torch.float32).model
    return op_count.StepRunner(model, batch=2, context=9, device=torch.device("cpu"), block_size=4)


@pytest.mark.parametrize("kind", ["decode", "chain", "tree"])
def test_counts_add_up_and_layers_cost_the_same(runner, kind):
    model = runner.verifier.model
    run = runner.step(kind)
    run()
    c = op_count.count_ops(run, model)
    n = len(model.layers)
    assert len(c.layer_all) == len(c.layer_top) == n == 3
    assert c.all_ops == sum(c.layer_all) + c.outside_all == sum(c.by_name.values())
    assert 0 < c.top_ops <= c.all_ops
    assert all(0 < top <= every for top, every in zip(c.layer_top, c.layer_all))
    assert len(set(c.layer_all[1:])) == 1 and len(set(c.layer_top[1:])) == 1  # metadata: built once, in layer 0
    assert c.layer_all[0] >= c.layer_all[1] and c.layer_top[0] >= c.layer_top[1]
    assert c.launches is None and c.device_kernels is None
    assert op_count.count_ops(run, model).by_name == c.by_name  # deterministic
    assert "forward" not in vars(model.layers[0])  # the scopes are gone


def test_a_tree_step_runs_the_tree_with_its_mask(runner, monkeypatch):
    from actors import verifier

    seen = []
    real = verifier.build_forward_batch
    monkeypatch.setattr(verifier, "build_forward_batch", lambda *a: seen.append(real(*a)) or seen[-1])
    runner.step("tree")()
    batch = seen[-1]
    size = len(op_count.TREE_PARENTS)
    assert batch.num_tokens == 2 * size and batch.num_seqs == 2
    mask = batch.window_masks[0]
    assert mask.shape == (size, size) and int(mask.sum()) == 1 + 2 + 3 + 3 + 4 + 4 + 5 + 5 + 2 + 3
    assert batch.positions[:size].tolist() == [9, 10, 11, 11, 12, 12, 13, 13, 10, 11]


@pytest.mark.parametrize("flags, per_layer", [(["--attention-backend", "torch"], "per layer: layer 0"),
                                              (["--layer-by-layer"], "per layer: layer 0"),
                                              ([], "every layer in one decoder_layers op")])
def test_main_prints_each_step(tiny_target_dir, capsys, flags, per_layer):
    from kernels import cpu_native

    if "layer 0" not in per_layer or "--layer-by-layer" in flags:
        if not cpu_native.load():
            pytest.skip(f"native CPU kernels not built: {cpu_native.unavailable_reason()}")
    assert op_count.main(["--model", str(tiny_target_dir), "--batch", "1", "--context", "5", *flags]) == 0
    out = capsys.readouterr().out
    for label in ("B=1 decode:", "B=1 chain K=5:", "B=1 tree 10:"):
        assert label in out
    assert per_layer in out and "top ops:" in out


@pytest.mark.parametrize("argv, needle", [(["--batch", "1,x"], "--batch '1,x'"), (["--context", "0"], "at least 1")])
def test_bad_flags_name_the_value(argv, needle, capsys):
    with pytest.raises(SystemExit):
        op_count.main(argv)
    assert needle in capsys.readouterr().err


def test_the_lean_forward_stays_lean(runner):
    """Issue 25's per-layer budget on CPU, as reached (B=2 sequences, tiny model): a decoder layer of a
    decode step costs at most 70 dispatcher ops, of a 10-node tree step at most 75 (within 10% of decode).
    A change that adds ops per layer shows here first."""
    model = runner.verifier.model
    counts = {}
    for kind in ("decode", "tree"):
        run = runner.step(kind)
        run()
        counts[kind] = op_count.count_ops(run, model)
    assert max(counts["decode"].layer_all[1:]) <= 70
    assert max(counts["tree"].layer_all[1:]) <= 75
    assert max(counts["tree"].layer_all[1:]) <= 1.1 * max(counts["decode"].layer_all[1:])
