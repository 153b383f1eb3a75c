"""Our forward against transformers on tiny random models: prefill, chunked prefill + decode mixed in
one batch over non-contiguous block tables, and the layer-skip (num_layers) forward."""
from __future__ import annotations

import pytest
import torch

from actors.model.loader import load_model
from tests.model import Chunk, hf_logits, hf_model, make_batch, random_ids, random_tables

ATOL = 1e-4
VARIANTS = {
    "llama-tied": ("llama", {}),
    "llama-untied": ("llama", {"tie_word_embeddings": False}),
    "llama-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen2-qkv-bias": ("qwen2", {}),
    "mistral": ("mistral", {"sliding_window": None}),
    "rope-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    "rope-llama3": ("llama", {"rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": 500000.0}}),
    "rope-yarn": ("llama", {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0}}),
    "rope-dynamic": ("llama", {"max_position_embeddings": 16, "rope_parameters": {
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
}


def _prefill_logits(model, ids: list[int], block_size: int = 4, seed: int = 0) -> torch.Tensor:
    table = random_tables(1, -(-len(ids) // block_size), 32, seed)[0]
    kv = model.allocate_kv_cache(32, block_size)
    with torch.inference_mode():
        return model.compute_logits(model(make_batch([Chunk(ids, 0, table)], block_size), kv))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_matches_hf(tiny_model_dir, variant):
    kind, overrides = VARIANTS[variant]
    model_dir = tiny_model_dir(kind, **overrides)
    loaded = load_model(model_dir)
    assert loaded.tokenizer is None and loaded.model_dir == model_dir
    ids = random_ids(23, 256, seed=1)
    ours = _prefill_logits(loaded.model, ids)
    ref = hf_logits(model_dir, ids)
    assert ref.std() > 0.5  # weights large enough for the comparison to mean something
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


def test_chunked_prefill_and_decode_mixed(tiny_model_dir):
    """Seq A prefills in two chunks; the second chunk shares a forward with seq B's prefill and seq C's
    prefill; then A, B, C decode together. Every row equals HF's full-sequence logits."""
    model_dir = tiny_model_dir("llama", tie_word_embeddings=False)
    model = load_model(model_dir).model
    bs = 4
    a, b, c = random_ids(30, 256, 2), random_ids(13, 256, 3), random_ids(5, 256, 4)
    ta, tb, tc = random_tables(3, 9, 40, seed=5)
    kv = model.allocate_kv_cache(40, bs)
    steps = [
        [Chunk(a[:17], 0, ta)],
        [Chunk(b[:12], 0, tb), Chunk(a[17:29], 17, ta), Chunk(c[:4], 0, tc)],
        [Chunk(a[29:30], 29, ta), Chunk(c[4:5], 4, tc), Chunk(b[12:13], 12, tb)],
    ]
    refs = {id(a): hf_logits(model_dir, a), id(b): hf_logits(model_dir, b), id(c): hf_logits(model_dir, c)}
    owner = {id(ta): a, id(tb): b, id(tc): c}
    with torch.inference_mode():
        for chunks in steps:
            logits = model.compute_logits(model(make_batch(chunks, bs), kv))
            row = 0
            for ch in chunks:
                seq = owner[id(ch.table)]
                want = refs[id(seq)][ch.start: ch.start + len(ch.tokens)]
                torch.testing.assert_close(logits[row: row + len(ch.tokens)], want, atol=ATOL, rtol=0)
                row += len(ch.tokens)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_layer_skip_matches_hf_hidden_states(tiny_model_dir, n):
    model_dir = tiny_model_dir("llama")
    model = load_model(model_dir).model
    ids = random_ids(11, 256, 6)
    bs = 4
    kv = model.allocate_kv_cache(8, bs)
    with torch.inference_mode():
        hidden = model(make_batch([Chunk(ids, 0, [3, 1, 5])], bs), kv, num_layers=n)
        ours = model.compute_logits(hidden)
    hf = hf_model(model_dir)
    with torch.no_grad():
        hs = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[n]  # before the final norm
        ref = hf.lm_head(hf.model.norm(hs))[0]
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    for layer, (k, v) in enumerate(kv):  # only the layers run wrote K/V
        assert bool(k.any()) == (layer < n) and bool(v.any()) == (layer < n)


def test_num_layers_out_of_range(tiny_model_dir):
    model = load_model(tiny_model_dir("llama")).model
    with pytest.raises(ValueError, match="num_layers"):
        model(make_batch([Chunk([1, 2], 0, [0])], 4), model.allocate_kv_cache(2, 4), num_layers=4)
