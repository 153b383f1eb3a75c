"""The lean eager forward (issue 25): the shortcuts that remove ops per layer compute the same bits
as what they replace."""
from __future__ import annotations

import pytest
import torch

from actors.model.loader import load_model
from tests.model import Chunk, make_batch, random_ids, random_tables


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir("llama", tie_word_embeddings=False)).model


def test_a_lone_token_runs_as_two_identical_rows(tiny):
    bs, ctx = 4, 7
    (table,) = random_tables(1, 3, 8, seed=3)
    kv = tiny.allocate_kv_cache(8, bs)
    batch = make_batch([Chunk(random_ids(1, 256, 5), ctx, table)], bs)
    with torch.inference_mode():
        tiny(make_batch([Chunk(random_ids(ctx, 256, 4), 0, table)], bs), kv)
        lone = tiny(batch, kv)  # [1, H]
        k_written = kv[0][0].clone()
        doubled = tiny(batch.doubled(), kv)  # two tokens: run as they are
    assert lone.shape == (1, doubled.shape[1])
    assert torch.equal(doubled[0], doubled[1]) and torch.equal(lone[0], doubled[0])
    assert torch.equal(kv[0][0], k_written)  # the slot written twice holds the same K


def test_doubled_needs_one_token():
    with pytest.raises(ValueError, match="one-token batch; this one has 4"):
        make_batch([Chunk([1, 2, 3, 4], 0, [0, 1])], 4).doubled()


@pytest.mark.parametrize("hidden", [64, 576])
def test_rms_norm_cpu_fp32_path_gives_f_rms_norm_bits(hidden):
    from actors.model.layers import RMSNorm

    g = torch.Generator().manual_seed(hidden)
    norm = RMSNorm(hidden, 1e-5, torch.float32)
    norm.weight.data.copy_(torch.randn(hidden, generator=g))
    for rows in (1, 2, 7, 64):
        for scale in (1e-3, 1.0, 40.0):
            x = torch.randn(rows, hidden, generator=g) * scale
            res = torch.randn(rows, hidden, generator=g)
            ref = torch.nn.functional.rms_norm(x, (hidden,), norm.weight, 1e-5)
            assert torch.equal(norm(x), ref)
            out, summed = norm(x.clone(), res)
            assert torch.equal(summed, x + res)
            assert torch.equal(out, torch.nn.functional.rms_norm(x + res, (hidden,), norm.weight, 1e-5))
    assert not any(name.startswith("_") for name in norm.state_dict())  # the scalars are not weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_halves_give_apply_rotary_bits(dtype):
    from actors.model.layers import RotaryEmbedding, apply_rotary, apply_rotary_halves, rotary_halves_tables

    n, heads, d = 7, 5, 64
    rope = RotaryEmbedding(d, 256, 10000.0, dtype=dtype)
    positions = torch.tensor([0, 1, 5, 17, 100, 255, 3])
    cos, sin = rope.cos_sin(positions)
    g = torch.Generator().manual_seed(1)
    qkv = (torch.randn(n, heads + 2, d, generator=g) * 3).to(dtype)  # rotate the first `heads` only
    ref = apply_rotary(qkv[:, :heads], cos, sin)
    halves = qkv.view(n, heads + 2, 2, d // 2)[:, :heads]
    out = apply_rotary_halves(halves, *rotary_halves_tables(cos, sin))
    assert out.is_contiguous() and torch.equal(out.view(n, heads, d), ref)


def test_the_additive_folded_mask_gives_sdpa_the_bool_mask_bits():
    from actors.model.attention import AttnMeta, _folded_mask

    g = torch.Generator().manual_seed(2)
    b, q, kv, kvh, group, d = 2, 5, 37, 2, 3, 16
    mask = torch.rand(b, q, kv, generator=g) > 0.4
    mask[..., 0] = True
    meta = AttnMeta(b, q, None, torch.zeros(b * kv, dtype=torch.int64), mask, {})
    folded_bool = mask.unsqueeze(1).expand(b, group, q, kv).reshape(b, 1, group * q, kv)
    qs, k, v = (torch.randn(b, kvh, n, d, generator=g) for n in (group * q, kv, kv))
    additive = _folded_mask(meta, group, torch.float32)
    assert additive is _folded_mask(meta, group, torch.float32)  # made once per forward
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(qs, k, v, attn_mask=additive), sdpa(qs, k, v, attn_mask=folded_bool))


def test_flat_cache_is_the_allocated_tensor_without_a_view_op():
    from actors.model.attention import _flat, allocate_kv_cache

    (k, v), = allocate_kv_cache(1, 5, 4, 2, 8)
    assert k.shape == v.shape == (5, 4, 2, 8) and k.is_contiguous() and k.data_ptr() != v.data_ptr()
    assert _flat(k) is k._base and _flat(k).shape == (20, 2, 8)
    _flat(k)[7] = 1.0
    assert torch.equal(k[1, 3], torch.ones(2, 8)) and int(k.count_nonzero()) == 16
    other = torch.arange(5 * 4 * 2 * 8.0).view(5, 4, 2, 8)[1:]  # a view of something else: viewed anew
    assert _flat(other).shape == (16, 2, 8) and _flat(other).data_ptr() == other.data_ptr()
