"""Load a Llama-family model from an alias, a local HF directory or a local GGUF file.

A GGUF file is converted ONCE (transformers dequantizes it) into a cache directory
``$SPECRAY_CACHE_DIR`` (default ``~/.cache/specray/models``) / ``<stem>-<size>-<content hash>``,
written to a temporary directory and renamed into place, so concurrent writers are harmless and
every later load (other processes, Ray actors) just reads safetensors. The key is the file's
content, not its path or mtime: a reinstall of the same model package (a fresh virtual
environment) finds the earlier conversion instead of writing another 0.5 GB copy, and a new
conversion removes older ones of a file with the same name and size. The cached directory is a
plain HF model dir.
Weights are read through ``safe_open(...).get_slice``: each rank reads only its shards.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from actors.model import gguf_weights, registry
from actors.model.config import ModelConfig
from actors.model.layers import TPContext
from actors.model.llama import LlamaForCausalLM

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


_LAZY = object()


class LoadedModel:
    """model, tokenizer, config, model_dir. Built by load_model with a lazy tokenizer: transformers is
    imported only when ``.tokenizer`` is first read (TP shards and drafters never pay for it)."""

    __slots__ = ("model", "_tokenizer", "config", "model_dir")

    def __init__(self, model: LlamaForCausalLM, tokenizer: Any, config: ModelConfig, model_dir: Path):
        self.model, self._tokenizer, self.config, self.model_dir = model, tokenizer, config, Path(model_dir)

    @property
    def tokenizer(self) -> Any:
        """transformers tokenizer, or None when the directory has no tokenizer files."""
        if self._tokenizer is _LAZY:
            self._tokenizer = load_tokenizer(self.model_dir)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    def __repr__(self) -> str:
        return f"LoadedModel(model_dir={str(self.model_dir)!r}, config={self.config!r})"


def cache_root() -> Path:
    return Path(os.environ.get("SPECRAY_CACHE_DIR") or "~/.cache/specray/models").expanduser()


def resolve_model_dir(spec: str | os.PathLike) -> Path:
    """HF model directory for an alias, an HF directory or a .gguf file (converted once, then cached)."""
    text = str(spec)
    if registry.is_random(text):
        raise ValueError(f"model {text!r} has random weights and no files (no config.json, weights or tokenizer): "
                         "it is built in process by load_model only, e.g. by benchmarks/gpu_bench.py; pass an "
                         "alias, a local HF model directory or a .gguf file for anything that reads files")
    if registry.is_alias(text):
        path = registry.resolve_alias(text)
    else:
        path = Path(text).expanduser()
        if not path.exists():
            raise ValueError(f"model {text!r} is neither a known alias {registry.list_aliases()} nor an existing "
                             "path; pass an alias, a local HF model directory or a local .gguf file")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"model file {str(path)!r} is not a .gguf file; pass a .gguf file or an HF model directory")
        return convert_gguf(path)
    check_hf_dir(path)
    return path


def check_hf_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise ValueError(f"model directory {str(path)!r} has no config.json; pass an HF model directory "
                         "(config.json + *.safetensors) or a .gguf file")
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"model directory {str(path)!r} has no *.safetensors weights; save the model with "
                         "safe_serialization=True or pass a .gguf file")


def content_key(path: Path, chunk: int = 1 << 20) -> str:
    """First 16 hex digits of the file's SHA-256 (~0.1 s for the default model's 98 MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:16]


def convert_gguf(gguf: Path) -> Path:
    """Cached HF directory of a GGUF file; converts it on first use (atomic rename, concurrent-safe)."""
    size = gguf.stat().st_size
    target = cache_root() / f"{gguf.stem}-{size}-{content_key(gguf)}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        export_gguf(gguf, tmp)
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp creates 0700
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # lost the race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    prune_older_conversions(target, f"{gguf.stem}-{size}-")
    return target


def prune_older_conversions(keep: Path, prefix: str) -> None:
    """Remove other finished conversions named ``prefix*`` next to ``keep`` (earlier versions of a
    file with this name and size, or the mtime-keyed entries of earlier releases). A process still
    reading one keeps its open files; temporary directories of writers (``.``-names) are left alone."""
    for old in keep.parent.glob(prefix + "*"):
        if old != keep and old.is_dir() and (old / "config.json").is_file():
            shutil.rmtree(old, ignore_errors=True)


def export_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF with transformers and write config, fp32 safetensors and tokenizer to out_dir."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if "quantization_config" in config.__dict__:
        del config.quantization_config  # weights are plain fp32 now
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)


def load_safetensors(model: LlamaForCausalLM, model_dir: Path) -> None:
    """Feed every tensor of model_dir/*.safetensors to model.load_weights as a lazy slice."""
    files = sorted(model_dir.glob("*.safetensors"))
    from safetensors import safe_open

    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt", device="cpu")) for f in files]
        model.load_weights((name, h.get_slice(name)) for h in handles for name in h.keys())


def load_tokenizer(model_dir: Path) -> Any:
    if not any((model_dir / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def load_model(spec: str | os.PathLike, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
               tp: TPContext = TPContext.single(), gguf: str | os.PathLike | None = None) -> LoadedModel:
    """Build and load the model (fp32 on CPU, bf16 elsewhere by default) with its tokenizer;
    ``random:<shape>`` builds that shape with random weights on ``device`` (no files, no tokenizer).
    gguf: the GGUF file ``spec`` (an HF directory) was converted from, whose blocks the CPU products
    then read as they do when ``spec`` is the file itself (tensor-parallel shards get the directory)."""
    device = torch.device(device)
    dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    if registry.is_random(spec):
        return load_random_model(str(spec), dtype, device, tp)
    model_dir = resolve_model_dir(spec)
    config = ModelConfig.from_dir(model_dir)
    with torch.device(device):
        model = LlamaForCausalLM(config, tp, dtype)
    load_safetensors(model, model_dir)
    model.eval()
    source = Path(gguf) if gguf is not None else gguf_file(spec)
    if source is not None and device.type == "cpu" and dtype is torch.float32:
        gguf_weights.bind(model, source, model_dir)  # products stream the file's own blocks
    return LoadedModel(model, _LAZY, config, model_dir)


def gguf_file(spec: str | os.PathLike) -> Path | None:
    """The GGUF file an alias or path names, else None (an HF directory)."""
    text = str(spec)
    path = registry.resolve_alias(text) if registry.is_alias(text) else Path(text).expanduser()
    return path if path.is_file() and path.suffix.lower() == ".gguf" else None


RANDOM_INIT_STD = 0.02  # the usual initializer_range of Llama configs
RANDOM_SEED = 0


def load_random_model(spec: str, dtype: torch.dtype, device: torch.device, tp: TPContext = TPContext.single(),
                      seed: int = RANDOM_SEED) -> LoadedModel:
    """``random:<shape>`` built directly on ``device`` (never staged on the host: 8B bf16 parameters
    fill in well under a second on a GPU), tokenizer None, model_dir the spec itself (no such path)."""
    config = registry.random_config(spec)
    with torch.device(device):
        model = LlamaForCausalLM(config, tp, dtype)
    init_random_weights(model, seed)
    model.eval()
    return LoadedModel(model, None, config, Path(spec))


@torch.no_grad()
def init_random_weights(model: torch.nn.Module, seed: int = RANDOM_SEED, std: float = RANDOM_INIT_STD) -> None:
    """Deterministic per device: matrices ~ N(0, std) from a generator on the parameters' device,
    norm weights 1, biases 0 (a norm of random weights would shrink every activation)."""
    gen = None
    for name, p in model.named_parameters():
        if gen is None:
            gen = torch.Generator(device=p.device).manual_seed(seed)
        if p.dim() == 1:
            p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        else:
            p.normal_(0.0, std, generator=gen)
