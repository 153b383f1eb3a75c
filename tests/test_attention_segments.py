"""The native CPU attention's segments (kernels/csrc/attention.cpp): a row's visible keys are cut into
segments of a fixed number of list entries, merged in order. Rows longer than a segment must keep
every property greedy verification stands on: a tree node gets the bits of plain decoding its path,
a prefill row the bits of the same token decoded, a row the same bits alone or in any batch, on one
thread or two, whichever way the call deals its items. Small segments (16, 32 keys) keep shapes tiny."""
from __future__ import annotations

import contextlib
import os

import torch

if not torch.cuda.is_available():  # the reference lives beside the Triton kernels: import it interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels import cpu_native as cn  # noqa: E402
from kernels.triton_attention import paged_attention_ref  # noqa: E402
from tests.model.test_tree_attention import ancestor_mask  # noqa: E402
from tests.test_cpu_native import TREE, _batch, _caches, _gen, path_laid_out  # noqa: E402

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")

H, KVH, D, BS = 9, 3, 64, 16


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _call(q, k, v, qsl, lens, tables, windows=None):
    return cn.paged_attention(q, k, v, qsl, lens, tables, 0.125, windows or [])


def test_the_segment_length_is_process_wide_and_bad_values_are_named():
    assert cn.set_attention_segment(32) == 512  # the default
    try:
        assert cn.set_attention_segment(0) == 32
        for bad in (-16, 24):
            with pytest.raises(RuntimeError, match=f"multiple of 16, got {bad}"):
                cn.set_attention_segment(bad)
        assert cn.set_attention_segment(512) == 0
    finally:
        cn.set_attention_segment(512)


@pytest.mark.parametrize("seg", [16, 32, 512])
def test_a_tree_node_gets_its_path_bits_across_segment_boundaries(seg):
    """Contexts ending just below, at and past a segment boundary: a node's ancestors then sit in the
    next segment, at window positions that are not their list positions."""
    for ctx in (seg - 2, seg, 2 * seg + 1):
        kv = ctx + len(TREE)
        blocks = -(-kv // BS)
        k, v = _caches(blocks + 3, BS, KVH, D, seed=ctx)
        table = torch.randperm(blocks + 3, generator=_gen(ctx))[:blocks].unsqueeze(0)
        q = torch.randn(len(TREE), H, D, generator=_gen(ctx + 1))
        with cn.attention_segment(seg):
            tree = _call(q, k, v, torch.tensor([0, len(TREE)]), torch.tensor([kv]), table, [ancestor_mask(TREE)])
            for node in (3, 6, 7):
                plain_k, plain_v, kv_len = path_laid_out(k, v, table, ctx, node)
                out = _call(q[node:node + 1], plain_k, plain_v, torch.tensor([0, 1]), torch.tensor([kv_len]), table)
                assert torch.equal(out[0], tree[node]), (ctx, node)
        ref = paged_attention_ref(q, k, v, torch.tensor([0, len(TREE)]), torch.tensor([kv]), table, 0.125,
                                  [ancestor_mask(TREE)])
        torch.testing.assert_close(tree, ref, rtol=2e-5, atol=2e-5)


def test_a_prefill_row_gets_the_bits_of_its_token_decoded():
    n = 75  # rows of 1..75 keys: up to five 16-key segments
    k, v = _caches(8, BS, KVH, D, seed=41)
    table = torch.randperm(8, generator=_gen(42))[:5].unsqueeze(0)
    q = torch.randn(n, H, D, generator=_gen(43))
    with cn.attention_segment(16):
        prefill = _call(q, k, v, torch.tensor([0, n]), torch.tensor([n]), table)
        for i in (0, 15, 16, 17, 31, 32, 50, 74):
            decoded = _call(q[i:i + 1], k, v, torch.tensor([0, 1]), torch.tensor([i + 1]), table)
            assert torch.equal(decoded[0], prefill[i]), i
    torch.testing.assert_close(prefill, paged_attention_ref(q, k, v, torch.tensor([0, n]), torch.tensor([n]), table,
                                                            0.125), rtol=2e-5, atol=2e-5)


def test_rows_get_the_same_bits_alone_in_a_batch_and_on_any_thread_count():
    """A lone decode and a lone tree split into one-segment items dealt in contiguous runs; in a batch
    with a long prefill (whose segments would take over 2^20 floats of buffers) every item takes all
    its rows' segments instead. Both ways, one thread or two: the same bits, and the reference's values."""
    q_lens, kv_lens = [1, len(TREE), 400], [150, 97, 400]
    num = sum(-(-kv // BS) for kv in kv_lens) + 2
    k, v = _caches(num, BS, KVH, D, seed=51)
    qsl, lens, tables = _batch(q_lens, kv_lens, BS, num, seed=52)
    q = torch.randn(int(qsl[-1]), H, D, generator=_gen(53))
    windows = [torch.empty(0, dtype=torch.bool), ancestor_mask(TREE), torch.empty(0, dtype=torch.bool)]
    with cn.attention_segment(16):
        # the prefill's rows of more than 16 keys: 9 heads x sum(ceil(n / 16)) segments of 64 floats
        assert H * sum(-(-n // 16) for n in range(17, 401)) * D > 2 ** 20
        runs = {}
        for threads in (1, 2):
            with _threads(threads):
                runs[threads] = (
                    _call(q, k, v, qsl, lens, tables, windows),
                    _call(q[:1], k, v, torch.tensor([0, 1]), lens[:1], tables[:1]),
                    _call(q[1:1 + len(TREE)], k, v, torch.tensor([0, len(TREE)]), lens[1:2], tables[1:2], windows[1:2]))
    for together, decode, tree in runs.values():
        assert torch.equal(decode, together[:1]) and torch.equal(tree, together[1:1 + len(TREE)])
        assert torch.equal(together, runs[1][0])
    ref = paged_attention_ref(q, k, v, qsl, lens, tables, 0.125, [None, ancestor_mask(TREE), None])
    torch.testing.assert_close(runs[2][0], ref, rtol=2e-5, atol=2e-5)


def test_rows_within_one_segment_keep_the_whole_row_arithmetic():
    """A row of at most a segment's keys is one segment: the bits of whole-row attention (segment 0).
    Longer rows differ from them only by rounding."""
    k, v = _caches(10, BS, KVH, D, seed=61)
    qsl, lens, tables = _batch([1, 1], [32, 100], BS, 10, seed=62)
    q = torch.randn(2, H, D, generator=_gen(63))
    with cn.attention_segment(0):
        whole = _call(q, k, v, qsl, lens, tables)
    with cn.attention_segment(32):
        segments = _call(q, k, v, qsl, lens, tables)
    assert torch.equal(segments[0], whole[0])
    torch.testing.assert_close(segments[1], whole[1], rtol=2e-6, atol=2e-6)


def test_a_window_row_that_sees_no_key_gets_zeros():
    """Not a mask the engine makes (a node always sees itself), but a row with an empty list must not
    leave its output as whatever the buffer held."""
    k, v = _caches(2, BS, KVH, D, seed=71)
    q = torch.randn(2, H, D, generator=_gen(72))
    mask = torch.tensor([[True, False], [False, False]])
    garbage = torch.full((2, H, D), float("nan"))
    del garbage  # a freed block of the result's size: what malloc is likely to hand the result
    got = cn.paged_attention(q, k, v, torch.tensor([0, 2]), torch.tensor([2]), torch.tensor([[1]]), 0.125, [mask])
    assert torch.equal(got[1], torch.zeros(H, D)) and not got[0].isnan().any()


def test_the_ab_benchmark_alternates_its_arms_and_restores_the_segment():
    from benchmarks.attention_segments import ab_rounds

    seen = []
    ms = ab_rounds(lambda: seen.append(int(torch.ops.specray_cpu.attention_segment())), [0, 512, 64], rounds=2,
                   reps=2)
    assert set(ms) == {0, 512, 64} and all(t >= 0 for t in ms.values())
    assert seen == [0, 512, 64] + [0] * 2 + [512] * 2 + [64] * 2 + [64] * 2 + [512] * 2 + [0] * 2  # warm, ABBA
    assert int(torch.ops.specray_cpu.attention_segment()) == 512


def test_the_ab_benchmark_names_bad_flags(capsys):
    from benchmarks import attention_segments

    for flags, named in ((["--segments", "0,24"], "--segments 24"), (["--steps", "decode,verify"], "--steps verify"),
                         (["--contexts", "1k"], "'1k'"), (["--rounds", "0"], "at least 1"),
                         (["--kv-cache-dtype", "float16"], "'float16'")):
        with pytest.raises(SystemExit):
            attention_segments.main(flags)
        assert named in capsys.readouterr().err
