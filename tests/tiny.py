"""Helpers for engine tests on tiny random models: a byte-level tokenizer and an engine factory."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

TINY_MAX_TOKENS = 24  # tokens per prompt of the shared tiny greedy baseline (tests/conftest.py)


class ByteTokenizer:
    """Vocabulary = 256 byte values (ids 0..255); id 2 doubles as EOS. Enough to exercise the
    engine's text paths (decode, stop strings) on random-weight models that have no tokenizer."""

    eos_token_id = 2
    bos_token_id = 1
    pad_token_id = None
    unk_token_id = None
    chat_template = None

    def __len__(self) -> int:
        return 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        keep = [i for i in ids if not (skip_special_tokens and i in (1, 2))]
        return bytes(keep).decode("utf-8", errors="replace")


@lru_cache(maxsize=None)
def _load(model_dir: str, device: str = "cpu"):
    from actors.model.loader import LoadedModel, load_model

    lm = load_model(model_dir, dtype=torch.float32, device=device)
    return LoadedModel(lm.model, ByteTokenizer(), lm.config, Path(model_dir))


def tiny_engine(model_dir: Path, draft: str = "none", draft_dir: Path | None = None, k: int = 4,
                tree=None, adaptive: bool = False, spec_policy=None, lookup_first: bool = False, tree_width: int = 1,
                tree_nodes: int | None = None, sampled_siblings: int | None = None, fresh_model: bool = False,
                **cfg):
    """An LLMEngine on a tiny model; ``draft='draft'`` uses ``draft_dir`` as the draft model.
    Speculation drafts the full K / tree every step unless ``adaptive`` (so tests exercise it).
    The target is loaded once per session and shared, unless ``fresh_model`` (an engine that
    changes its model, e.g. offloads its layers)."""
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine

    if draft == "draft":
        spec = SpeculativeConfig(method="draft", draft_model=str(draft_dir), num_spec_tokens=k, tree=tree,
                                 adaptive=adaptive)
    else:
        spec = SpeculativeConfig.from_draft_arg(draft, k, tree, adaptive=adaptive, tree_width=tree_width,
                                                tree_nodes=tree_nodes, sampled_siblings=sampled_siblings)
        spec = spec.model_copy(update={"lookup_first": lookup_first or spec.lookup_first})
    cfg.setdefault("block_size", 4)
    cfg.setdefault("num_kv_blocks", 256)
    cfg.setdefault("device", "cpu")  # the models are loaded there, in float32
    cfg.setdefault("dtype", "float32")
    config = EngineConfig(model=str(model_dir), speculative=spec, num_threads=2, **cfg)
    dev = cfg["device"]
    loaded = (_load.__wrapped__ if fresh_model else _load)(str(model_dir), dev)
    return LLMEngine(config, loaded=loaded,
                     draft_loaded=_load(str(draft_dir), dev) if draft == "draft" else None, spec_policy=spec_policy)


# what the attention-backend tests run each backend's engine through: plain decoding, a draft
# model's token tree (the target's own weights as the draft), a layer-skip chain
BACKEND_SPECS = {"plain": {}, "self-draft-tree": dict(draft="draft", self_draft=True, tree=[1, 2, 1]),
                 "layerskip-chain": dict(draft="layerskip:1", k=3)}


def generate_per_backend(model_dir: Path, spec: dict, backends: tuple[str, ...], prompts, params,
                         **cfg) -> dict:
    """backend -> (the attention its engine ran, outputs of ``generate(prompts, params)``) for one
    ``BACKEND_SPECS`` entry; the shared tiny target is left on the torch backend."""
    from actors.model.attention_backends import set_attention_backend

    spec = dict(spec)
    if spec.pop("self_draft", False):
        spec["draft_dir"] = model_dir
    out = {}
    for backend in backends:
        eng = tiny_engine(model_dir, attention_backend=backend, **spec, **cfg)
        out[backend] = (eng.verifier.model.layers[0].self_attn.attend, eng.generate(prompts, params, concurrency=2))
    set_attention_backend(eng.verifier.model, "torch")
    return out


def random_prompts(n: int, seed: int = 0, lo: int = 5, hi: int = 40, vocab: int = 256) -> list[list[int]]:
    """Token-id prompts with some repetition inside (so n-gram lookup has something to find)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi, (1,), generator=g))
        base = torch.randint(3, vocab, (max(2, length // 2),), generator=g).tolist()
        out.append((base * 3)[:length])
    return out


def random_eagle_head(model, vocab_size: int, path: Path, seed: int = 0) -> Path:
    """An untrained EAGLE head file for ``model`` (a random draft vocabulary of ``vocab_size``)."""
    from actors.eagle.head import EagleHead, HeadConfig

    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(model.config, vocab_size, "random"))
    head.draft_vocab.copy_(torch.randperm(model.config.vocab_size)[:vocab_size].sort().values)
    head.save(path)
    return path
