"""kernels/cpu_native.py: each C++ CPU kernel against its torch reference (tiny shapes), the property
greedy verification stands on (a row's bits never depend on what shares the call: a tree node gets
exactly its plain-decode bits), clear errors that name the bad value, and the model and engine on
the native backend. Other builds of the same sources: tests/test_cpu_build.py."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # the references live beside the Triton kernels: import them interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import cpu_native as cn  # noqa: E402
from kernels.triton_attention import paged_attention_ref  # noqa: E402
from kernels.triton_fused import rmsnorm_residual_ref, rope_write_kv_ref, silu_and_mul_ref  # noqa: E402
from tests.model.test_tree_attention import ancestor_mask  # noqa: E402

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- products

@pytest.mark.parametrize("m, k, n", [(1, 64, 16), (3, 96, 130), (12, 40, 33), (13, 576, 64), (29, 17, 5)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_equals_f_linear(m, k, n, bias):
    g = _gen(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    packed = cn.pack_linear(w)
    assert packed.shape == (-(-n // 16), k, 16)
    y = cn.linear(x, packed, n, b)
    assert y.shape == (m, n) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_a_linear_row_gets_the_same_bits_whatever_shares_the_call():
    g = _gen(1)
    w, x = torch.randn(70, 48, generator=g), torch.randn(40, 48, generator=g)
    packed = cn.pack_linear(w)
    every = cn.linear(x, packed, 70)
    for rows in (1, 2, 7, 11, 12, 13, 25, 40):
        part = cn.linear(x[:rows], packed, 70)
        assert all(torch.equal(part[j], every[j]) for j in range(rows)), rows
    strided = torch.randn(40, 96, generator=g)[:, :48]  # rows 96 apart: read in place
    strided.copy_(x)
    assert torch.equal(cn.linear(strided, packed, 70), every)


def test_linear_threads_do_not_change_bits():
    g = _gen(2)
    w, x = torch.randn(300, 64, generator=g), torch.randn(9, 64, generator=g)
    packed = cn.pack_linear(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cn.linear(x, packed, 300)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(cn.linear(x, packed, 300), one)
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- small fused ops

def test_rmsnorm_and_residual_match_the_reference():
    g = _gen(3)
    x, r, w = torch.randn(5, 72, generator=g), torch.randn(5, 72, generator=g), torch.randn(72, generator=g)
    want_norm, want_sum = rmsnorm_residual_ref(x.clone(), r.clone(), w, 1e-5)
    got_x = x.clone()
    normed, summed = cn.rmsnorm_residual(got_x, r, w, 1e-5)
    assert summed is got_x and torch.equal(summed, want_sum)  # the sum is written into x, as the hook promises
    torch.testing.assert_close(normed, want_norm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cn.rmsnorm(x, w, 1e-6), F.rms_norm(x, (72,), w, 1e-6), rtol=1e-5, atol=1e-5)
    # a row alone gets the bits it gets among others
    assert torch.equal(cn.rmsnorm(x[2:3], w, 1e-6)[0], cn.rmsnorm(x, w, 1e-6)[2])


def test_silu_and_mul_matches_the_reference_over_a_wide_range():
    g = _gen(4)
    x = torch.cat([torch.randn(3, 2 * 40, generator=g) * 30, torch.linspace(-120, 120, 160).view(2, 80)])
    want = silu_and_mul_ref(x)
    torch.testing.assert_close(cn.silu_and_mul(x), want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("h, kvh", [(4, 4), (6, 2), (8, 2)])
def test_rope_write_kv_gives_the_reference_bits_and_skips_padded_rows(h, kvh):
    g = _gen(h * 10 + kvh)
    n, d = 5, 16
    qkv = torch.randn(n, (h + 2 * kvh) * d, generator=g)
    angles = torch.rand(n, d // 2, generator=g) * 6
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # [N, 1, d/2], as the model passes them
    slots = torch.tensor([3, 17, -1, 40, 0])
    caches = [torch.zeros(3, 16, kvh, d) for _ in range(4)]
    want = rope_write_kv_ref(qkv[[0, 1, 3, 4]], cos[[0, 1, 3, 4]], sin[[0, 1, 3, 4]], slots[[0, 1, 3, 4]],
                             caches[0], caches[1], h, kvh)
    got = cn.rope_write_kv(qkv, cos, sin, slots, caches[2], caches[3], h, kvh)
    assert torch.equal(got[[0, 1, 3, 4]], want)  # no fma: the same two roundings as the torch ops
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])  # slot -1 wrote nothing


# ---------------------------------------------------------------- attention

def _caches(num_blocks: int, bs: int, kvh: int, d: int, seed: int):
    g = _gen(seed)
    return torch.randn(num_blocks, bs, kvh, d, generator=g), torch.randn(num_blocks, bs, kvh, d, generator=g)


def _batch(q_lens: list[int], kv_lens: list[int], bs: int, num_blocks: int, seed: int):
    """query_start_loc, kv_lens, block tables (shuffled, disjoint; padded with 0)."""
    need = [-(-kv // bs) for kv in kv_lens]
    perm = torch.randperm(num_blocks, generator=_gen(seed)).tolist()
    tables, i = [], 0
    for n in need:
        tables.append(perm[i:i + n] + [0] * (max(need) - n))
        i += n
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist())
    return qsl, torch.tensor(kv_lens), torch.tensor(tables)


CASES = {
    "decode": ([1, 1, 1], [5, 40, 17], None),
    "prefill": ([9, 20], [9, 20], None),
    "mixed": ([1, 7, 4], [33, 7, 24], None),
    "chunked-prefill": ([6], [38], None),
    "tree": ([1, 5, 8], [19, 21, 45], [None, "chain", "tree"]),
}
TREE = [-1, 0, 0, 1, 1, 2, 5, 3]


def _window(kind: str | None, q: int) -> torch.Tensor | None:
    if kind == "chain":
        return torch.ones(q, q, dtype=torch.bool).tril()
    if kind == "tree":
        return ancestor_mask(TREE)
    return None


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("h, kvh", [(4, 4), (6, 2), (8, 2)], ids=["gqa1", "gqa3", "gqa4"])
@pytest.mark.parametrize("bs", [16, 32])
def test_paged_attention_matches_the_reference(case, h, kvh, bs):
    q_lens, kv_lens, kinds = CASES[case]
    d, num_blocks = 24, 12
    qsl, lens, tables = _batch(q_lens, kv_lens, bs, num_blocks, seed=len(case))
    windows = [_window(k, q) for k, q in zip(kinds or [None] * len(q_lens), q_lens)]
    q = torch.randn(int(qsl[-1]), h, d, generator=_gen(7))
    k_cache, v_cache = _caches(num_blocks, bs, kvh, d, seed=8)
    want = paged_attention_ref(q, k_cache, v_cache, qsl, lens, tables, 0.2, windows)
    got = cn.paged_attention(q, k_cache, v_cache, qsl, lens, tables, 0.2, windows)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("ctx", [21, 250, 520])
def test_a_tree_node_gets_exactly_the_bits_of_plain_decoding_its_path(ctx):
    """The node's visible keys (context + its ancestors, siblings masked) and the same keys laid out
    one after another, as plain decoding of that path writes them: bit-identical outputs, also over
    long contexts (and any split of the keys a kernel might make there must keep it so)."""
    h, kvh, d, bs = 6, 2, 32, 16
    blocks = -(-(ctx + len(TREE)) // bs)
    k_cache, v_cache = _caches(blocks + 5, bs, kvh, d, seed=9)
    table = torch.randperm(blocks + 5, generator=_gen(ctx))[:blocks].unsqueeze(0)
    q = torch.randn(len(TREE), h, d, generator=_gen(10))
    tree = [ancestor_mask(TREE)]
    kv = ctx + len(TREE)
    tree_out = cn.paged_attention(q, k_cache, v_cache, torch.tensor([0, len(TREE)]), torch.tensor([kv]), table, 0.3,
                                  tree)
    for node in (3, 6, 7):
        plain_k, plain_v, kv_len = path_laid_out(k_cache, v_cache, table, ctx, node)
        out = cn.paged_attention(q[node:node + 1], plain_k, plain_v, torch.tensor([0, 1]), torch.tensor([kv_len]),
                                 table, 0.3)
        assert torch.equal(out[0], tree_out[node]), node


def path_laid_out(k_cache, v_cache, table, ctx: int, node: int):
    """Caches where TREE's path root .. node (its nodes' keys at positions ctx + node) lies at
    consecutive positions after the context, as plain decoding of that path writes it; and the
    path's kv_len."""
    bs, kvh, d = k_cache.shape[1:]
    path = [node]
    while TREE[path[-1]] >= 0:
        path.append(TREE[path[-1]])
    path.reverse()
    flat_k, flat_v = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    slot = lambda p: int(table[0, p // bs]) * bs + p % bs  # noqa: E731
    plain_k, plain_v = k_cache.clone(), v_cache.clone()
    for depth, n in enumerate(path):
        plain_k.view(-1, kvh, d)[slot(ctx + depth)] = flat_k[slot(ctx + n)]
        plain_v.view(-1, kvh, d)[slot(ctx + depth)] = flat_v[slot(ctx + n)]
    return plain_k, plain_v, ctx + len(path)


def test_a_sequence_gets_the_same_bits_alone_and_in_a_batch():
    h, kvh, d, bs = 4, 2, 16, 16
    k_cache, v_cache = _caches(10, bs, kvh, d, seed=11)
    qsl, lens, tables = _batch([1, 6, 3], [30, 6, 40], bs, 10, seed=12)
    q = torch.randn(10, h, d, generator=_gen(13))
    together = cn.paged_attention(q, k_cache, v_cache, qsl, lens, tables, 0.25)
    alone = cn.paged_attention(q[7:10], k_cache, v_cache, torch.tensor([0, 3]), lens[2:], tables[2:], 0.25)
    assert torch.equal(alone, together[7:10])


def test_a_token_tree_gets_the_same_bits_in_narrow_and_wide_items():
    """A lone sequence's 11-node tree (33 query rows per KV head) is split into narrow items so that
    both threads work; among other sequences it is one wide item. Its rows get the same bits."""
    from tests.model.test_tree_attention import PARENTS

    h, kvh, d, bs = 9, 3, 16, 16
    k_cache, v_cache = _caches(24, bs, kvh, d, seed=21)
    mask = ancestor_mask(PARENTS)
    n = len(PARENTS)
    q = torch.randn(n + 3, h, d, generator=_gen(22))
    qsl, lens, tables = _batch([n, 1, 1, 1], [70, 40, 33, 20], bs, 24, seed=23)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = cn.paged_attention(q, k_cache, v_cache, qsl, lens, tables, 0.25, [mask, None, None, None])
        alone = cn.paged_attention(q[:n], k_cache, v_cache, torch.tensor([0, n]), lens[:1], tables[:1], 0.25, [mask])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(alone, together[:n])
    torch.testing.assert_close(alone, paged_attention_ref(q[:n], k_cache, v_cache, torch.tensor([0, n]), lens[:1],
                                                          tables[:1], 0.25, [mask]), rtol=2e-5, atol=2e-5)


def test_long_rows_match_the_reference_and_get_the_same_bits_alone_and_in_a_batch():
    """Long rows: a lone decode (its 3 KV heads, 3 items for 2 threads) and a lone tree (narrow items)
    must get the bits they get as items among others, and match the reference."""
    h, kvh, d, bs = 9, 3, 64, 16
    q_lens, kv_lens = [1, 20, len(TREE)], [700, 300, 530]
    num = sum(-(-kv // bs) for kv in kv_lens) + 4
    k_cache, v_cache = _caches(num, bs, kvh, d, seed=31)
    qsl, lens, tables = _batch(q_lens, kv_lens, bs, num, seed=32)
    windows = [None, None, ancestor_mask(TREE)]
    q = torch.randn(int(qsl[-1]), h, d, generator=_gen(33))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = cn.paged_attention(q, k_cache, v_cache, qsl, lens, tables, 0.125, windows)
        alone = cn.paged_attention(q[:1], k_cache, v_cache, torch.tensor([0, 1]), lens[:1], tables[:1], 0.125)
        tree = cn.paged_attention(q[21:], k_cache, v_cache, torch.tensor([0, len(TREE)]), lens[2:], tables[2:], 0.125,
                                  windows[2:])
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(together, paged_attention_ref(q, k_cache, v_cache, qsl, lens, tables, 0.125, windows),
                               rtol=2e-5, atol=2e-5)
    assert torch.equal(alone[0], together[0]) and torch.equal(tree, together[21:])
    bf_k, bf_v = k_cache.bfloat16(), v_cache.bfloat16()  # a bf16 cache: the same arithmetic on widened values
    assert torch.equal(cn.paged_attention(q[:1], bf_k, bf_v, torch.tensor([0, 1]), lens[:1], tables[:1], 0.125),
                       cn.paged_attention(q[:1], bf_k.float(), bf_v.float(), torch.tensor([0, 1]), lens[:1],
                                          tables[:1], 0.125))


# ---------------------------------------------------------------- errors

def test_bad_inputs_are_clear_errors_naming_the_value():
    q, (k, v) = torch.randn(2, 4, 16), _caches(4, 16, 2, 16, seed=0)
    qsl, lens, tables = torch.tensor([0, 2]), torch.tensor([5]), torch.tensor([[1]])
    with pytest.raises(RuntimeError, match=r"block_tables\[0\]\[0\] = 9 is outside the cache's 4 blocks"):
        cn.paged_attention(q, k, v, qsl, lens, torch.tensor([[9]]), 0.1)
    with pytest.raises(RuntimeError, match="kv_len 40"):
        cn.paged_attention(q, k, v, qsl, torch.tensor([40]), tables, 0.1)
    with pytest.raises(RuntimeError, match="must be a float32 CPU tensor, got BFloat16"):
        cn.paged_attention(q.bfloat16(), k, v, qsl, lens, tables, 0.1)
    with pytest.raises(RuntimeError, match=r"slot_mapping\[1\] = 64 is outside the cache's 64 slots"):
        cn.rope_write_kv(torch.randn(2, 8 * 16), torch.ones(2, 8), torch.zeros(2, 8), torch.tensor([0, 64]),
                         k, v, 4, 2)
    with pytest.raises(RuntimeError, match="does not fit x"):
        cn.linear(torch.randn(2, 8), cn.pack_linear(torch.randn(4, 9)), 4)
    with pytest.raises(RuntimeError, match="must be even"):
        cn.silu_and_mul(torch.randn(2, 7))
    assert torch.equal(k, _caches(4, 16, 2, 16, seed=0)[0])  # nothing written by the refused calls


def test_all_layers_in_one_op_give_the_layer_by_layer_bits(tiny_target_dir, monkeypatch):
    """The native backend runs every decoder layer as one op (cpu_native.decoder_layers); the same
    forward layer by layer (each module's hook) gives the same hidden states and K/V bit for bit, for
    prefills, a decode token and a token tree in one batch. num_layers < all (a layer-skip draft)
    takes the layer-by-layer path."""
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model
    from tests.model import Chunk, make_batch, random_ids, random_tables
    from tests.model.test_tree_attention import PARENTS, tree_depths

    model = load_model(tiny_target_dir, dtype=torch.float32).model
    assert set_attention_backend(model, "native") == "native"
    fused = model.fused_layers
    t = random_tables(3, 4, 16, seed=5)
    tree = Chunk(random_ids(len(PARENTS), 256, 6), 21, t[1], positions=[21 + d for d in tree_depths(PARENTS)],
                 window=ancestor_mask(PARENTS))
    steps = [[Chunk(random_ids(17, 256, 1), 0, t[0]), Chunk(random_ids(21, 256, 2), 0, t[1]),
              Chunk(random_ids(9, 256, 3), 0, t[2])],
             [Chunk([5], 17, t[0]), tree, Chunk(random_ids(12, 256, 4), 9, t[2])]]
    calls = []
    real = cn._decoder_layers
    monkeypatch.setattr(cn, "_decoder_layers", lambda *a: calls.append(1) or real(*a))
    outs, caches = [], []
    for layers in (fused, None):
        model.fused_layers = layers
        kv = model.allocate_kv_cache(16, 16)
        with torch.inference_mode():
            outs.append([model(make_batch(s, 16), kv) for s in steps])
        caches.append(kv)
    assert len(calls) == 2  # one op per forward with the hook, none without
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*caches))
    model.fused_layers = fused
    with torch.inference_mode():
        skip = model(make_batch(steps[0], 16), model.allocate_kv_cache(16, 16), num_layers=2)
    assert skip.shape == outs[0][0].shape and len(calls) == 2


def test_all_layers_in_one_op_see_a_weight_changed_in_place_or_packed_anew(tiny_target_dir):
    """The one-op forward keeps its packed weight arguments between forwards: a matrix changed in place
    (its version) or a packed copy made anew (store_as) must reach the next forward, as the layer-by-layer
    forward (which packs per product) sees it."""
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model
    from kernels import cpu_linear
    from tests.model import Chunk, make_batch, random_ids, random_tables

    model = load_model(tiny_target_dir, dtype=torch.float32).model
    assert set_attention_backend(model, "native") == "native"
    fused, t = model.fused_layers, random_tables(1, 4, 16, seed=9)
    step = [Chunk(random_ids(13, 256, 7), 0, t[0])]

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for layers in (fused, None):
            model.fused_layers = layers
            with torch.inference_mode():
                out.append(model(make_batch(step, 16), model.allocate_kv_cache(16, 16)))
        model.fused_layers = fused
        return out[0], out[1]

    first, _ = both()
    down = model.layers[1].mlp.down_proj.weight
    with torch.no_grad():
        down.mul_(0.5)  # in place: a new version
    fused_out, ref = both()
    assert torch.equal(fused_out, ref) and not torch.equal(fused_out, first)
    assert cpu_linear.store_as(down, torch.bfloat16)  # the same version, a new packed copy
    fused_out, ref = both()
    assert torch.equal(fused_out, ref)


@pytest.mark.parametrize("case", ["plain", "self-draft-tree", "layerskip-chain"])
def test_engine_greedy_output_matches_the_torch_backend(case, tiny_target_dir):
    """4 prompts, 12 tokens each, concurrency 2, on the engine: the native backend (its one-op layers
    and its attention for the draft model's trees and layer-skip drafts) emits the torch backend's
    tokens, with and without speculation."""
    from actors.model import attention_backends as ab
    from actors.sampling_params import SamplingParams
    from tests.tiny import BACKEND_SPECS, generate_per_backend, random_prompts

    spec = BACKEND_SPECS[case]
    runs = generate_per_backend(tiny_target_dir, spec, ("torch", "native"), random_prompts(4, seed=7),
                                SamplingParams(max_tokens=12, ignore_eos=True))
    assert runs["native"][0] is ab.native_paged_attention and runs["torch"][0] is not ab.native_paged_attention
    outs = {backend: o for backend, (_, o) in runs.items()}
    assert [o.token_ids for o in outs["native"]] == [o.token_ids for o in outs["torch"]]
    if spec:
        assert sum(o.num_draft_tokens for o in outs["native"]) > 0, "speculation never ran"
