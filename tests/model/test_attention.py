"""Paged attention reference against a naive per-sequence implementation; KV cache ops."""
from __future__ import annotations

import pytest
import torch

from actors.model import attention
from actors.model.attention import allocate_kv_cache, copy_kv_slots, group_sequences, paged_attention, write_kv
from tests.model import Chunk, make_batch, random_tables, slot_of

H, KVH, D, BS = 4, 2, 8, 4


def naive_attention(q, k_cache, v_cache, chunks, scale):
    """Loop over sequences and queries: q [N, H, D] -> [N, H, D] (the spec in batch.py, spelled out)."""
    out, row = torch.empty_like(q), 0
    for c in chunks:
        qn, kv_len = len(c.tokens), c.start + len(c.tokens)
        slots = [slot_of(c.table, p, BS) for p in range(kv_len)]
        keys = k_cache.view(-1, KVH, D)[slots].repeat_interleave(H // KVH, dim=1)  # [kv, H, D]
        vals = v_cache.view(-1, KVH, D)[slots].repeat_interleave(H // KVH, dim=1)
        window = c.window if c.window is not None else torch.ones(qn, qn, dtype=torch.bool).tril()
        w = window.shape[1]
        for i in range(qn):
            visible = torch.cat([torch.ones(kv_len - w, dtype=torch.bool), window[i]])
            s = torch.einsum("hd,khd->hk", q[row + i], keys[visible]) * scale
            out[row + i] = torch.einsum("hk,khd->hd", s.softmax(-1), vals[visible])
        row += qn
    return out


def _mixed_chunks():
    t = random_tables(4, 5, 24, seed=1)
    tree_window = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    return [
        Chunk([0] * 6, 3, t[0]),  # prefill chunk after 3 cached tokens
        Chunk([0], 9, t[1]),  # decode token
        Chunk([0] * 3, 7, t[2], window=tree_window),  # token tree
        Chunk([0] * 2, 0, t[3]),  # fresh prefill
    ]


@pytest.mark.parametrize("groups", [None, [[1, 3], [0], [2]]])
def test_paged_attention_matches_naive(groups, monkeypatch):
    """One padded call for the batch, and one call per group of sequences (out of order): both
    equal attention spelled out per sequence."""
    if groups:
        monkeypatch.setattr(attention, "group_sequences", lambda q, kv: groups)
    torch.manual_seed(0)
    chunks = _mixed_chunks()
    batch = make_batch(chunks, BS)
    k_cache, v_cache = allocate_kv_cache(1, 24, BS, KVH, D)[0]
    for c in chunks:  # fill the whole context of every sequence
        n = c.start + len(c.tokens)
        slots = torch.tensor([slot_of(c.table, p, BS) for p in range(n)])
        write_kv(k_cache, v_cache, torch.randn(n, KVH, D), torch.randn(n, KVH, D), slots)
    q = torch.randn(batch.num_tokens, H, D)
    out = paged_attention(q, k_cache, v_cache, batch, D ** -0.5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, naive_attention(q, k_cache, v_cache, chunks, D ** -0.5), atol=1e-5, rtol=1e-5)
    parts = batch.cache["paged_attention"]  # built once, reused by the next layer
    paged_attention(q, k_cache, v_cache, batch, D ** -0.5)
    assert batch.cache["paged_attention"] is parts and len(parts) == len(groups or [0])
    if groups is None:
        assert parts[0][0] is None and parts[0][1].mask.shape == (4, 6, 10)


@pytest.mark.parametrize("stale", [0.0, float("nan")])
def test_fresh_prompts_take_the_causal_path(stale, monkeypatch):
    """Prompts from position 0 (q_len == kv_len) run SDPA's causal kernel without a mask, padded to
    the longest among them; a group of them split off a mixed batch does too. Stale NaN in unused
    slots must not reach real rows."""
    t = random_tables(4, 5, 24, seed=2)
    for chunks, groups in (([Chunk([0] * 5, 0, t[0]), Chunk([0] * 2, 0, t[1]), Chunk([0] * 7, 0, t[2])], None),
                           (_mixed_chunks(), [[3], [0, 1, 2]])):
        if groups:
            monkeypatch.setattr(attention, "group_sequences", lambda q, kv: groups)
        torch.manual_seed(0)
        batch = make_batch(chunks, BS)
        k_cache, v_cache = allocate_kv_cache(1, 24, BS, KVH, D)[0]
        k_cache.fill_(stale)
        v_cache.fill_(stale)
        for c in chunks:
            n = c.start + len(c.tokens)
            slots = torch.tensor([slot_of(c.table, p, BS) for p in range(n)])
            write_kv(k_cache, v_cache, torch.randn(n, KVH, D), torch.randn(n, KVH, D), slots)
        q = torch.randn(batch.num_tokens, H, D)
        out = paged_attention(q, k_cache, v_cache, batch, D ** -0.5)
        torch.testing.assert_close(out, naive_attention(q, k_cache, v_cache, chunks, D ** -0.5), atol=1e-5, rtol=1e-5)
        metas = [m for _, m in batch.cache["paged_attention"]]
        assert [m.causal for m in metas] == ([True] if groups is None else [True, False])
        assert metas[0].mask is None


def test_sequences_of_different_shapes_are_grouped():
    assert group_sequences([1] * 8, [300 + i for i in range(8)]) == [list(range(8))]
    # a 1,000-token prefill chunk among 63 decoding sequences runs alone, not padding them all
    q, kv = [1] * 64, [200] * 64
    q[5], kv[5] = 1000, 1000
    groups = group_sequences(q, kv)
    assert [5] in groups and sorted(i for g in groups for i in g) == list(range(64))
    # verification rows (K+1 = 6) and plain decoding rows of similar context share one call
    assert len(group_sequences([6, 1, 6, 1, 1], [400, 410, 390, 420, 405])) == 1
    # decoding contexts from 64 to 2,048 tokens: a few calls, each within 2x of its real work
    kvs = [64 * 2 ** (i % 6) for i in range(24)]
    groups = group_sequences([1] * 24, kvs)
    assert 1 < len(groups) <= 6
    for g in groups:
        assert g == sorted(g)
        assert len(g) * 4 * max(kvs[i] for i in g) <= 1.5 * sum(4 * kvs[i] for i in g) + attention.GROUP_SLACK


def test_padding_never_leaks_nan():
    """Stale NaN in unused slots must not reach real rows (padding keys repeat a real key)."""
    chunks = _mixed_chunks()
    batch = make_batch(chunks, BS)
    k_cache, v_cache = allocate_kv_cache(1, 24, BS, KVH, D)[0]
    k_cache.fill_(float("nan"))
    v_cache.fill_(float("nan"))
    for c in chunks:
        n = c.start + len(c.tokens)
        slots = torch.tensor([slot_of(c.table, p, BS) for p in range(n)])
        write_kv(k_cache, v_cache, torch.randn(n, KVH, D), torch.randn(n, KVH, D), slots)
    out = paged_attention(torch.randn(batch.num_tokens, H, D), k_cache, v_cache, batch, 0.3)
    assert torch.isfinite(out).all()


def test_bad_window_shape_is_rejected():
    t = random_tables(1, 2, 4)[0]
    batch = make_batch([Chunk([0, 0], 2, t, window=torch.ones(3, 3, dtype=torch.bool))], BS)
    k, v = allocate_kv_cache(1, 4, BS, KVH, D)[0]
    with pytest.raises(ValueError, match="window_masks"):
        paged_attention(torch.randn(2, H, D), k, v, batch, 1.0)


def test_write_and_copy_kv_slots():
    caches = allocate_kv_cache(2, 3, BS, KVH, D)
    assert len(caches) == 2 and caches[0][0].shape == (3, BS, KVH, D) and not caches[0][0].any()
    vals = torch.arange(4 * KVH * D, dtype=torch.float32).view(4, KVH, D)
    for k, v in caches:
        write_kv(k, v, vals, -vals, torch.tensor([5, 6, 7, 8]))
    copy_kv_slots(caches, torch.tensor([5, 6, 7]), torch.tensor([6, 7, 8]))  # overlapping: reads first
    for k, v in caches:
        flat_k, flat_v = k.view(-1, KVH, D), v.view(-1, KVH, D)
        torch.testing.assert_close(flat_k[6:9], vals[0:3])
        torch.testing.assert_close(flat_v[6:9], -vals[0:3])
        torch.testing.assert_close(flat_k[5], vals[0])
    copy_kv_slots(caches, torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64))


def test_benchmark_command_prints_every_case(capsys):
    from benchmarks.attention_groups import cases, main, prompt_cases

    main(["--scale", "50", "--reps", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert all(f"| {name} |" in out for name in [*cases(), *prompt_cases()])


def test_benchmark_baseline_is_the_same_attention_with_a_mask(monkeypatch):
    """The benchmark's 'dense causal mask' column computes what the causal kernel does."""
    from benchmarks import attention_groups as ag

    lens = [40, 26, 15, 7]
    batch, blocks = ag.make_batch(lens, lens)
    k, v = allocate_kv_cache(1, blocks, ag.BLOCK, KVH, D)[0]
    k.normal_(), v.normal_()
    q = torch.randn(sum(lens), H, D)
    causal = paged_attention(q, k, v, batch, 0.3)
    assert all(m.causal for _, m in batch.cache["paged_attention"])
    batch.cache.clear()
    monkeypatch.setattr(attention, "_group_meta", ag._masked(attention._group_meta))
    masked = paged_attention(q, k, v, batch, 0.3)
    assert all(not m.causal and m.mask is not None for _, m in batch.cache["paged_attention"])
    torch.testing.assert_close(masked, causal, atol=1e-5, rtol=1e-5)
