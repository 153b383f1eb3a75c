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


@pytest.mark.parametrize("scaling", [None, {"rope_type": "dynamic", "factor": 2.0}])
def test_halves_tables_are_rotary_halves_tables_of_cos_sin(scaling):
    from actors.model.layers import RotaryEmbedding, rotary_halves_tables

    rope = RotaryEmbedding(16, 64, 10000.0, scaling)
    for positions in ([0, 5, 63, 2], [3, 64, 100], [200]):  # inside the table, then beyond it (grows / dynamic NTK)
        pos = torch.tensor(positions)
        want = rotary_halves_tables(*RotaryEmbedding(16, 64, 10000.0, scaling).cos_sin(pos))
        got = rope.halves_tables(pos)
        assert all(g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want))
    assert rope.halves_tables(torch.tensor([1]))[1].stride(0) == rope.halves_tables(torch.tensor([1]))[0].stride(0)


def test_to_device_takes_integers_without_ops_and_anything_else_as_torch_tensor_does():
    from actors.model.batch import to_device

    t = to_device([3, -1, 2 ** 40], "cpu")
    assert t.dtype == torch.int64 and t.tolist() == [3, -1, 2 ** 40]
    assert to_device([], "cpu").shape == (0,)
    assert to_device([torch.tensor(7), 8], "cpu").tolist() == [7, 8]  # 0-dim integer tensors are integers
    assert torch.equal(to_device([1.0, 2.0], "cpu"), torch.tensor([1.0, 2.0], dtype=torch.int64))


def _with_host(batch):
    from actors.model.batch import HostMeta

    batch.host = HostMeta(batch.query_start_loc.tolist(), batch.kv_lens.tolist(), batch.block_tables.numpy().copy())
    return batch


@pytest.mark.parametrize("groups", [None, [[1, 3], [0], [2]]])
def test_attention_from_host_metadata_equals_attention_from_the_tensors(groups, monkeypatch):
    """The metadata built from the batch's HostMeta and read back from its tensors: same indices, same
    mask, same attention bits, also for groups out of order and a lone token's doubled batch."""
    from actors.model import attention
    from tests.model.test_attention import BS, D, H, KVH, _mixed_chunks

    if groups:
        monkeypatch.setattr(attention, "group_sequences", lambda q, kv: groups)
    chunks = _mixed_chunks()
    k_cache, v_cache = attention.allocate_kv_cache(1, 24, BS, KVH, D)[0]
    k_cache.normal_(), v_cache.normal_()
    q = torch.randn(sum(len(c.tokens) for c in chunks), H, D)
    plain, host = make_batch(chunks, BS), _with_host(make_batch(chunks, BS))
    a = attention.paged_attention(q, k_cache, v_cache, plain, D ** -0.5)
    b = attention.paged_attention(q, k_cache, v_cache, host, D ** -0.5)
    assert torch.equal(a, b)
    for (rows_a, ma), (rows_b, mb) in zip(plain.cache["paged_attention"], host.cache["paged_attention"]):
        assert (rows_a is None and rows_b is None) or torch.equal(rows_a, rows_b)
        assert torch.equal(ma.kv_index, mb.kv_index) and (ma.mask is None) == (mb.mask is None)
        if ma.mask is not None:
            assert torch.equal(ma.mask, mb.mask) and mb.host_mask is not None
            for dtype in (torch.float32, torch.bfloat16):
                assert torch.equal(attention._folded_mask(ma, 2, dtype), attention._folded_mask(mb, 2, dtype))
    monkeypatch.undo()
    lone = [Chunk([0], 9, chunks[1].table)]
    doubled, doubled_host = make_batch(lone, BS).doubled(), _with_host(make_batch(lone, BS)).doubled()
    assert doubled_host.host.query_start_loc == [0, 1, 2] and doubled_host.host.block_tables.shape[0] == 2
    q2 = torch.randn(1, H, D).expand(2, -1, -1)
    assert torch.equal(attention.paged_attention(q2, k_cache, v_cache, doubled, D ** -0.5),
                       attention.paged_attention(q2, k_cache, v_cache, doubled_host, D ** -0.5))


def test_verifier_batches_carry_their_host_metadata():
    from actors.verifier import SeqChunk, build_forward_batch

    chunks = [SeqChunk([5, 6], [3, 4], [19, 20], 5, [4, 2]), SeqChunk([7], [8], [33], 9, [1, 8, 3])]
    batch = build_forward_batch(chunks, 8, torch.device("cpu"))
    assert batch.host.query_start_loc == batch.query_start_loc.tolist() == [0, 2, 3]
    assert batch.host.kv_lens == batch.kv_lens.tolist() == [5, 9]
    assert batch.block_tables.tolist() == batch.host.block_tables.tolist() == [[4, 2, 0], [1, 8, 3]]


def test_small_and_large_gathers_give_the_same_attention(monkeypatch):
    """torch.gather (up to GATHER_ROWS keys) and index_select (above) copy the same rows."""
    from actors.model import attention
    from tests.model.test_attention import BS, D, H, KVH, _mixed_chunks

    chunks = _mixed_chunks()
    k_cache, v_cache = attention.allocate_kv_cache(1, 24, BS, KVH, D)[0]
    k_cache.normal_(), v_cache.normal_()
    q = torch.randn(sum(len(c.tokens) for c in chunks), H, D)
    outs = []
    for limit in (10 ** 6, 0):
        monkeypatch.setattr(attention, "GATHER_ROWS", limit)
        batch = make_batch(chunks, BS)
        outs.append(attention.paged_attention(q, k_cache, v_cache, batch, D ** -0.5))
        slots = batch.cache["paged_attention"][0][1].gathered[(KVH, D, torch.float32, k_cache.device)][-1]
        assert slots.dim() == (3 if limit else 1)
    assert torch.equal(*outs)
