"""Model configuration for the Llama family (Llama, Mistral, Qwen2, SmolLM2), validated once.

``ModelConfig.from_hf`` reads a transformers config object (v4 or v5 style): transformers 5 keeps
RoPE settings under ``rope_parameters`` (``rope_theta`` inside it), older configs use top-level
``rope_theta`` and ``rope_scaling``. ``rope_scaling`` here is None for plain RoPE, otherwise a dict
with ``rope_type`` in ``ROPE_TYPES`` and that type's parameters (never ``rope_theta``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
_ROPE_REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor",),
}


class ModelConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_type: str = "llama"
    vocab_size: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    rms_norm_eps: float = Field(1e-6, gt=0)
    rope_theta: float = Field(10000.0, gt=0)
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = Field(2048, gt=0)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    o_proj_bias: bool = False  # bias on o_proj (Llama with attention_bias only)
    mlp_bias: bool = False
    sliding_window: int | None = None  # Mistral v0.1: the engine's context stops at the window (cluster/runtime.py)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @field_validator("rope_scaling")
    @classmethod
    def _check_rope(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        v = dict(v)
        v.pop("rope_theta", None)
        rope_type = v.pop("type", None) or v.get("rope_type") or "default"
        v["rope_type"] = rope_type
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope type {rope_type!r} is not supported; use one of {ROPE_TYPES}")
        missing = [k for k in _ROPE_REQUIRED.get(rope_type, ()) if v.get(k) is None]
        if missing:
            raise ValueError(f"rope type {rope_type!r} needs {missing} in rope_scaling; add them to the config")
        return None if rope_type == "default" else v

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelConfig":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}; fix the config"
            )
        return self

    @property
    def rope_type(self) -> str:
        return "default" if self.rope_scaling is None else self.rope_scaling["rope_type"]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf_config: Any) -> "ModelConfig":
        """Build from a transformers ``PretrainedConfig`` (or any object with the same attributes)."""
        get = lambda name, default=None: getattr(hf_config, name, default)  # noqa: E731
        model_type = get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not supported; use one of {SUPPORTED_MODEL_TYPES}")
        num_heads = get("num_attention_heads")
        head_dim = get("head_dim") or get("hidden_size") // num_heads
        rope_theta, rope_scaling = _rope_from_hf(hf_config)
        attn_bias = bool(get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=get("vocab_size"),
            hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"),
            num_layers=get("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            attention_bias=attn_bias or model_type == "qwen2",
            o_proj_bias=attn_bias and model_type != "qwen2",
            mlp_bias=bool(get("mlp_bias", False)),
            sliding_window=_sliding_window(hf_config),
            bos_token_id=get("bos_token_id"),
            eos_token_ids=_as_tuple(get("eos_token_id")),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        """Read ``config.json`` of an HF model directory (raw JSON: no transformers import, which is slow)."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"{str(model_dir)!r} has no config.json; pass an HF model directory")
        return cls.from_json(path)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        """Parse a raw ``config.json`` (HF attribute names; HF's Llama-family defaults for missing keys)."""
        data = json.loads(Path(path).read_text())
        return cls.from_hf(_Attrs(data))


class _Attrs:
    def __init__(self, data: dict[str, Any]):
        self.__dict__.update(data)


def _as_tuple(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, int):
        return (v,)
    return tuple(int(x) for x in v)


def _sliding_window(hf_config: Any) -> int | None:
    if getattr(hf_config, "use_sliding_window", True) is False:  # Qwen2 records a window it does not use
        return None
    return getattr(hf_config, "sliding_window", None)


def _rope_from_hf(hf_config: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from v5 ``rope_parameters`` or v4 ``rope_theta``/``rope_scaling``."""
    params = getattr(hf_config, "rope_parameters", None)
    legacy = getattr(hf_config, "rope_scaling", None)
    theta = getattr(hf_config, "rope_theta", None)
    scaling: dict[str, Any] = {}
    for src in (legacy, params):
        if isinstance(src, dict) and "full_attention" in src:
            src = src["full_attention"]  # per-layer-type layout
        if isinstance(src, dict):
            scaling.update(src)
    theta = scaling.pop("rope_theta", None) or theta or 10000.0
    if not scaling:
        return float(theta), None
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type == "default":
        return float(theta), None
    if rope_type in ("llama3", "yarn") and scaling.get("original_max_position_embeddings") is None:
        orig = getattr(hf_config, "original_max_position_embeddings", None)
        scaling["original_max_position_embeddings"] = orig or getattr(hf_config, "max_position_embeddings", 2048)
    return float(theta), scaling
