"""ModelConfig parsing (v4 and v5 rope layouts) and the per-rank weight loaders (no processes needed:
loading shards only reads the rank, never calls a collective)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from actors.model.config import ModelConfig
from actors.model.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RotaryEmbedding,
    RowParallelLinear,
    TPContext,
    VocabParallelEmbedding,
)
from tests.model.test_llama_vs_hf import VARIANTS


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_raw_json_matches_autoconfig(tiny_model_dir, variant):
    from transformers import AutoConfig

    kind, overrides = VARIANTS[variant]
    model_dir = tiny_model_dir(kind, **overrides)
    assert ModelConfig.from_dir(model_dir) == ModelConfig.from_hf(AutoConfig.from_pretrained(model_dir))


def test_legacy_rope_fields_and_qwen2_bias(tmp_path):
    legacy = dict(model_type="llama", vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=2, rope_theta=5000.0, rope_scaling={"type": "linear", "factor": 4.0},
                  eos_token_id=[2, 3])
    cfg = ModelConfig.from_hf(SimpleNamespace(**legacy))
    assert cfg.rope_theta == 5000.0 and cfg.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert cfg.num_kv_heads == 2 and cfg.head_dim == 4 and cfg.eos_token_ids == (2, 3)
    (tmp_path / "config.json").write_text(json.dumps({**legacy, "model_type": "qwen2", "rope_scaling": None}))
    qwen = ModelConfig.from_dir(tmp_path)
    assert qwen.attention_bias and not qwen.o_proj_bias and qwen.rope_scaling is None
    with pytest.raises(ValueError, match="low_freq_factor"):
        ModelConfig.from_hf(SimpleNamespace(**{**legacy, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf(SimpleNamespace(**{**legacy, "model_type": "gpt2"}))


def _cfg(**kw):
    base = dict(vocab_size=10, hidden_size=8, intermediate_size=12, num_layers=1, num_heads=4, num_kv_heads=2,
                head_dim=2, attention_bias=True)
    return ModelConfig(**{**base, **kw})


def _slices(tensors: dict, path):
    save_file(tensors, str(path))
    return safe_open(str(path), framework="pt")


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_qkv_shards_concatenate_to_full(tmp_path, kv_heads):
    cfg = _cfg(num_kv_heads=kv_heads)
    q, k, v = torch.randn(8, 8), torch.randn(kv_heads * 2, 8), torch.randn(kv_heads * 2, 8)
    with _slices({"q": q, "k": k, "v": v, "qb": torch.randn(8)}, tmp_path / "w.safetensors") as f:
        shards = []
        for rank in range(2):
            layer = QKVParallelLinear(cfg, TPContext(rank, 2))
            for sid in "qkv":
                layer.weight.weight_loader(layer.weight, f.get_slice(sid), sid)
            shards.append(layer.weight.data.split([4, layer.kv_size, layer.kv_size]))
    torch.testing.assert_close(torch.cat([s[0] for s in shards]), q)
    if kv_heads == 2:
        torch.testing.assert_close(torch.cat([s[1] for s in shards]), k)
        torch.testing.assert_close(torch.cat([s[2] for s in shards]), v)
    else:  # one KV head, replicated on both ranks
        for s in shards:
            torch.testing.assert_close(s[1], k)
            torch.testing.assert_close(s[2], v)


def test_merged_row_and_vocab_shards(tmp_path):
    gate, up, down = torch.randn(12, 8), torch.randn(12, 8), torch.randn(8, 12)
    emb = torch.randn(9, 8)  # 9 rows over 2 ranks: 5 + 4 (+1 zero pad)
    with _slices({"g": gate, "u": up, "d": down, "e": emb}, tmp_path / "w.safetensors") as f:
        merged, rows, embs = [], [], []
        for rank in range(2):
            tp = TPContext(rank, 2)
            m = MergedColumnParallelLinear(8, [12, 12], tp=tp)
            m.weight.weight_loader(m.weight, f.get_slice("g"), 0)
            m.weight.weight_loader(m.weight, f.get_slice("u"), 1)
            merged.append(m.weight.data.chunk(2))
            r = RowParallelLinear(12, 8, tp=tp)
            r.weight.weight_loader(r.weight, f.get_slice("d"))
            rows.append(r.weight.data)
            e = VocabParallelEmbedding(9, 8, tp)
            e.weight.weight_loader(e.weight, f.get_slice("e"))
            embs.append(e.weight.data)
    torch.testing.assert_close(torch.cat([g for g, _ in merged]), gate)
    torch.testing.assert_close(torch.cat([u for _, u in merged]), up)
    torch.testing.assert_close(torch.cat(rows, dim=1), down)
    torch.testing.assert_close(torch.cat(embs)[:9], emb)
    assert not embs[1][4:].any()


def test_single_rank_layers_compute_plainly():
    head = ParallelLMHead(9, 8)
    head.weight.weight_loader(head.weight, torch.randn(9, 8))
    x = torch.randn(3, 8)
    out = head(x)
    assert out.dtype == torch.float32 and out.shape == (3, 9)
    torch.testing.assert_close(out, x @ head.weight.T)
    with pytest.raises(ValueError, match="shape"):
        head.weight.weight_loader(head.weight, torch.randn(7, 8))
    with pytest.raises(ValueError, match="divisible"):
        RowParallelLinear(9, 8, tp=TPContext(0, 2))


def test_rope_cache_grows_past_max_position():
    short, long = RotaryEmbedding(8, 16, 10000.0), RotaryEmbedding(8, 64, 10000.0)
    positions = torch.tensor([3, 40])
    for a, b in zip(short.cos_sin(positions), long.cos_sin(positions)):
        torch.testing.assert_close(a, b)
    assert short._cos.shape[0] == 64
