"""Phase timing of the one-op forward (kernels/cpu_native.py phase_timing, csrc/layers.cpp) and the
benchmark that reports it (benchmarks/step_phases.py): timing changes no bit, its phases add up to no
more than the op's wall time, a read starts the count again, and the benchmark's byte counts are the
packed matrices of the products it names."""
from __future__ import annotations

import time

import pytest
import torch

from kernels import cpu_native as cn

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")


@pytest.fixture(scope="module")
def runner(tiny_target_dir):
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model
    from benchmarks.op_count import StepRunner

    model = load_model(tiny_target_dir, dtype=torch.float32).model
    assert set_attention_backend(model, "native") == "native"
    return StepRunner(model, 2, 40, torch.device("cpu"))


def test_timed_phases_change_no_bit_and_fit_in_the_op(runner):
    tree = runner.step("tree")
    untimed = tree()
    assert not any(torch.ops.specray_cpu.phase_times().tolist())  # timing is off by default: nothing was summed
    with cn.phase_timing() as read:
        t0 = time.perf_counter()
        timed = tree()
        wall = time.perf_counter() - t0
        phases = read()
        assert not any(read().values())  # a read starts the count from zero
    assert torch.equal(timed, untimed)
    assert list(phases) == list(cn.PHASES)
    assert all(phases[p] > 0 for p in ("qkv", "attention", "o", "gate_up", "down", "norms"))
    assert 0 < sum(phases.values()) <= wall
    tree()
    assert not any(torch.ops.specray_cpu.phase_times().tolist())  # off again after the block


def test_the_benchmark_splits_a_step_and_counts_the_products_bytes(runner):
    from benchmarks.step_phases import PRODUCTS, product_bytes, step_phases
    from kernels.cpu_linear import reordered

    real = cn.decoder_layers
    ms = step_phases(runner.step("decode"), reps=3)
    assert cn.decoder_layers is real  # the op clock put the op back
    assert ms["rest"] == pytest.approx(ms["wall"] - ms["layers"] - ms["lm_head"])
    assert 0 < sum(ms[p] for p in cn.PHASES) <= ms["layers"] < ms["wall"] and ms["lm_head"] > 0
    model = runner.verifier.model
    nbytes = product_bytes(model)
    matrices = {"qkv": lambda layer: layer.self_attn.qkv_proj, "o": lambda layer: layer.self_attn.o_proj,
                "gate_up": lambda layer: layer.mlp.gate_up_proj, "down": lambda layer: layer.mlp.down_proj}
    assert set(nbytes) == {*PRODUCTS, "lm_head"}
    for name, module in matrices.items():
        assert nbytes[name] == sum(reordered(module(layer).weight).nbytes for layer in model.layers), name
    assert nbytes["lm_head"] == reordered(model.lm_head.weight).nbytes


def test_the_benchmark_names_bad_flags(capsys):
    from benchmarks import step_phases

    for flags, named in ((["--steps", "decode,verify"], "--steps verify"), (["--batch", "1,x"], "'1,x'"),
                         (["--reps", "0"], "at least 1"), (["--kv-cache-dtype", "float16"], "'float16'")):
        with pytest.raises(SystemExit):
            step_phases.main(flags)
        assert named in capsys.readouterr().err
