"""Session-wide fixtures: the default model (converted and loaded once) and tiny random HF models."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import pytest

import kernels.cpu_linear  # noqa: F401  first: it caps oneDNN's ISA before any product runs (AMX CPUs)
import torch
from hypothesis import settings

from kernels import cpu_native

# Built (or found built) before any test starts a Ray worker or a subprocess that would otherwise
# build them itself, against that test's deadline.
cpu_native.load()

# CI runs the same examples every time (a red build is reproducible); local runs keep exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """HF directory of the default target (the GGUF is converted on first use, then cached)."""
    from actors.model.loader import resolve_model_dir
    from actors.model.registry import DEFAULT_MODEL

    return resolve_model_dir(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def default_model(default_model_dir):
    """The default target loaded once per session (LoadedModel: model, tokenizer, config, model_dir)."""
    from actors.model.loader import load_model

    return load_model(default_model_dir)


_TINY_BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that attention patterns matter (HF's 0.02-std init gives near-uniform logits)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.1))
            if name == "model.embed_tokens.weight":
                p.mul_(p.shape[-1] ** 0.5)


def build_tiny_model(out_dir: Path, kind: str = "llama", seed: int = 0, **overrides) -> Path:
    """Save a tiny random Llama/Qwen2/Mistral model (safetensors, no tokenizer) to out_dir."""
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "mistral": (MistralConfig, MistralForCausalLM)}
    config_cls, model_cls = classes[kind]
    config = config_cls(**{**_TINY_BASE, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    _randomize(model, seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Callable[..., Path]:
    """Factory ``make(kind="llama", seed=0, **hf_config_overrides) -> Path``, cached per argument set.
    Defaults: hidden 64, 3 layers, 4 heads, 2 KV heads, vocab 256, tied embeddings."""
    made: dict[str, Path] = {}

    def make(kind: str = "llama", seed: int = 0, **overrides) -> Path:
        key = json.dumps([kind, seed, overrides], sort_keys=True)
        if key not in made:
            made[key] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{kind}"), kind, seed, **overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance for this test session (logical CPUs above the 2 real cores so that
    fractional-CPU actors schedule), stopped at the end. Only what this fixture started is stopped."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, object_store_memory=512 * 2**20,
             namespace="specray-tests", runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        yield ray
    finally:
        ray.shutdown()


# ---- the tiny-model set shared by the engine, drafter-worker and TP tests ----------------------

@pytest.fixture(scope="session")
def tiny_target_dir(tiny_model_dir) -> Path:
    """Untied tiny Llama (4 heads, 2 KV heads): varied greedy output, some n-gram repeats."""
    return tiny_model_dir("llama", seed=0, tie_word_embeddings=False)


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_model_dir) -> Path:
    """A different, one-layer model with the same vocabulary, used as a draft."""
    return tiny_model_dir("llama", seed=1, num_hidden_layers=1, tie_word_embeddings=False)


@pytest.fixture(scope="session")
def tiny_prompts() -> list[list[int]]:
    from tests.tiny import random_prompts

    return random_prompts(8, seed=3)


@pytest.fixture(scope="session")
def tiny_baseline(tiny_target_dir, tiny_prompts) -> list[list[int]]:
    """Non-speculative greedy output of the tiny target, TINY_MAX_TOKENS tokens per prompt."""
    from actors.sampling_params import SamplingParams
    from tests.tiny import TINY_MAX_TOKENS, tiny_engine

    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    return [o.token_ids for o in tiny_engine(tiny_target_dir).generate(tiny_prompts, params, concurrency=1)]


@pytest.fixture
def fp32_activations():
    """Products over GGUF blocks multiply fp32 activations (the fp32 model's bits) during the test."""
    with cpu_native.activations("float32"):
        yield


@pytest.fixture
def int16_activations():
    """Products over GGUF blocks multiply 16-bit fixed-point activations (the default) during the test."""
    with cpu_native.activations("int16"):
        yield
