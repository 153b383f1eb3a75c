"""``cpu_activations`` (EngineConfig, ``--cpu-activations``): the engine, or each tensor-parallel shard
in its own process, sets what the CPU products over GGUF blocks multiply; ``auto`` keeps the
process's SPECRAY_CPU_ACTIVATIONS; bad values and devices are refused naming the value."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernels import cpu_native as cn
from tests.tiny import tiny_engine

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")


@pytest.fixture
def restored():
    """The process's mode as the test found it, afterwards (an engine's option outlives the engine)."""
    with cn.activations(cn.activations_in_effect()):
        yield


def test_auto_keeps_the_mode_and_a_mode_sets_it(restored):
    cn.set_activations("float32")
    cn.use_activations("auto", "cpu")
    assert cn.activations_in_effect() == "float32"
    cn.use_activations("int8", "cpu")
    assert cn.activations_in_effect() == "int8"


def test_bad_values_and_devices_are_named(restored):
    with pytest.raises(ValueError, match="cpu_activations='int4' is not one of int16, int8, float32"):
        cn.use_activations("int4", "cpu")
    with pytest.raises(ValueError, match="cpu_activations='int8' .* runs on cuda: leave it 'auto'"):
        cn.use_activations("int8", "cuda")
    cn.use_activations("auto", "cuda")  # nothing to set: fine anywhere
    from cluster.config import EngineConfig

    with pytest.raises(ValidationError, match="int4"):
        EngineConfig(cpu_activations="int4")


def test_an_engine_sets_its_mode(tiny_target_dir, restored):
    cn.set_activations("int16")
    tiny_engine(tiny_target_dir, cpu_activations="int8")
    assert cn.activations_in_effect() == "int8"
    tiny_engine(tiny_target_dir)  # auto: what the process has
    assert cn.activations_in_effect() == "int8"


def test_a_shard_sets_its_mode_in_its_process(tiny_target_dir, restored):
    """VerifierShard.setup (here in this process, tp=1) applies the spec's mode before loading."""
    from actors.verifier_shard import ShardSpec, VerifierShard

    cn.set_activations("int16")
    shard = VerifierShard(ShardSpec(str(tiny_target_dir), 1, 16, 16, cpu_activations="float32"), 0)
    shard.setup()
    assert cn.activations_in_effect() == "float32"


def test_the_cli_passes_the_option():
    from cluster.cli import build_parser, engine_config_from_args

    args = build_parser().parse_args(["generate", "--cpu-activations", "int8", "hi"])
    assert engine_config_from_args(args).cpu_activations == "int8"
    assert engine_config_from_args(build_parser().parse_args(["generate", "hi"])).cpu_activations == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--cpu-activations", "int4", "hi"])
