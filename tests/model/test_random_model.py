"""``random:<shape>`` models: known shapes, random weights built on the device, no files, no tokenizer,
and a clear one-line error wherever a random model cannot go (the engine, anything reading files)."""
from __future__ import annotations

import pytest
import torch

from actors.model import registry
from actors.model.loader import load_model, resolve_model_dir


def test_tiny_builds_with_its_shapes_and_no_tokenizer():
    loaded = load_model("random:tiny")
    c, m = loaded.config, loaded.model
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.intermediate_size, c.vocab_size) == \
        (64, 2, 4, 2, 128, 512)
    assert loaded.tokenizer is None and str(loaded.model_dir) == "random:tiny"
    params = dict(m.named_parameters())
    assert params["embed_tokens.weight"].shape == (512, 64)
    assert params["layers.0.self_attn.qkv_proj.weight"].shape == ((4 + 2 * 2) * 16, 64)
    assert params["layers.1.mlp.gate_up_proj.weight"].shape == (2 * 128, 64)
    assert params["lm_head.weight"].shape == (512, 64)  # untied
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in m.parameters())
    assert torch.equal(params["norm.weight"], torch.ones(64))
    w = params["layers.0.self_attn.o_proj.weight"]
    assert 0.01 < w.std().item() < 0.03 and abs(w.mean().item()) < 0.01


def test_weights_are_deterministic():
    a = load_model("random:tiny").model.state_dict()
    b = load_model("random:tiny", dtype=torch.float32).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.self_attn.o_proj.weight"], a["layers.1.self_attn.o_proj.weight"])


def test_tiny_runs_a_forward():
    from actors.model.batch import ForwardBatch

    m = load_model("random:tiny").model
    kv = m.allocate_kv_cache(4, 16)
    with torch.inference_mode():
        logits = m.compute_logits(m(ForwardBatch.make_dummy(5), kv)[-1:])
    assert logits.shape == (1, 512) and torch.isfinite(logits).all()


def test_llama_3_8b_shape():
    c = registry.random_config("random:llama-3-8b")
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (4096, 32, 32, 8, 128)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta, c.rms_norm_eps) == (14336, 128256, 500000.0, 1e-5)
    assert c.max_position_embeddings == 8192 and not c.tie_word_embeddings and c.rope_scaling is None
    assert "random:llama-3-8b" in registry.list_random() and "random:tiny" in registry.list_random()


def test_unknown_shape_lists_the_known_ones():
    with pytest.raises(ValueError) as exc:
        load_model("random:llama-9000")
    msg = str(exc.value)
    assert "\n" not in msg and "'random:llama-9000'" in msg
    assert "random:llama-3-8b" in msg and "random:tiny" in msg


def test_file_readers_refuse_random_models():
    with pytest.raises(ValueError, match="random weights and no files"):
        resolve_model_dir("random:tiny")


def test_engine_refuses_before_loading(monkeypatch):
    from actors.model import loader
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("loaded a random model"))
    with pytest.raises(ValueError, match="random weights and no tokenizer"):
        LLMEngine(EngineConfig(model="random:llama-3-8b"))


def test_generate_cli_gives_a_clear_error(capsys):
    from cluster.cli import EXIT_BAD_INPUT, main

    assert main(["generate", "--model", "random:tiny", "hello"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("specray: error: model 'random:tiny' has random weights and no tokenizer")
    assert "Traceback" not in err
