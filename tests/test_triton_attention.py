"""The Triton paged-attention kernel against the pure-torch ``paged_attention`` (and the kernel's own
per-sequence reference): decode, prefill, mixed batches, token trees, GQA 1/3/4, block sizes 16/32,
split-K, fp32 and bf16. On CPU the kernel runs under ``TRITON_INTERPRET=1`` (set below, before
triton is imported; tiny shapes); on a CUDA machine the same tests run compiled."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from actors.model.attention import paged_attention  # noqa: E402
from actors.model.attention_backends import triton_paged_attention  # noqa: E402
from kernels import triton_attention as ta  # noqa: E402
from tests.model import Chunk, make_batch, random_tables  # noqa: E402
from tests.model.test_tree_attention import PARENTS, ancestor_mask  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
D = 16
NUM_BLOCKS = 48
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5),
       # bf16 output is one rounding (~0.4% relative); the interpreter also truncates instead of rounding
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _setup(specs, h=4, kvh=2, bs=16, dtype=torch.float32, seed=0, d=D):
    """specs: (q_len, kv_len, window or None) per sequence -> (q [N, h, d], k_cache, v_cache, batch),
    on DEVICE, each sequence's blocks shuffled through the pool; the caches random."""
    per_seq = -(-max(kv for _, kv, _ in specs) // bs)
    num_blocks = 1 + len(specs) * per_seq
    tables = random_tables(len(specs), per_seq, num_blocks, seed)
    batch = make_batch([Chunk([0] * q, kv - q, t, window=w) for (q, kv, w), t in zip(specs, tables)], bs)
    for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "kv_lens", "block_tables"):
        setattr(batch, name, getattr(batch, name).to(DEVICE))
    batch.window_masks = [None if w is None else w.to(DEVICE) for w in batch.window_masks]
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, bs, kvh, d)
    k, v = torch.randn(shape, generator=g).to(DEVICE, dtype), torch.randn(shape, generator=g).to(DEVICE, dtype)
    q = torch.randn(batch.num_tokens, h, d, generator=g).to(DEVICE, dtype)
    return q, k, v, batch


def _check(specs, h=4, kvh=2, bs=16, dtype=torch.float32, seed=0):
    """The kernel through the ForwardBatch adapter equals the torch backend (computed in fp32)."""
    q, k, v, batch = _setup(specs, h, kvh, bs, dtype, seed)
    got = triton_paged_attention(q, k, v, batch, D ** -0.5)
    want = paged_attention(q.float(), k.float(), v.float(), _setup(specs, h, kvh, bs, dtype, seed)[3], D ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    return got, want


def _ref_args(specs, h=4, kvh=2, bs=16, dtype=torch.float32, seed=0, d=D):
    """The kernel's plain-tensor arguments (q, caches, query_start_loc, kv_lens, block_tables, scale)."""
    q, k, v, batch = _setup(specs, h, kvh, bs, dtype, seed, d)
    return q, k, v, batch.query_start_loc, batch.kv_lens, batch.block_tables, d ** -0.5


def _tree(parents=PARENTS):
    return ancestor_mask(parents)


def _chain_tree(nodes: int) -> torch.Tensor:
    """Root + ``nodes`` nodes: a root with two children, then a long chain (window 1 + nodes)."""
    return ancestor_mask([-1, 0, 0] + list(range(2, nodes)))


MIXED = [(1, 17, None), (12, 50, None), (len(PARENTS), 40, _tree()), (20, 20, None), (1, 1, None)]


@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("h,kvh", [(2, 2), (6, 2), (4, 1)], ids=["gqa1", "gqa3", "gqa4"])
def test_decode_only(bs, h, kvh):
    _check([(1, 1, None), (1, 15, None), (1, 33, None), (1, 70, None)], h, kvh, bs)


@pytest.mark.parametrize("bs", [16, 32])
def test_prefill_only(bs):
    _check([(5, 5, None), (37, 37, None), (20, 20, None)], 6, 2, bs)  # fresh prompts, crossing blocks


def test_prefill_chunk_after_context():
    _check([(12, 50, None), (33, 65, None)], 4, 2, 16)


@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("h,kvh", [(2, 2), (6, 2), (4, 1)], ids=["gqa1", "gqa3", "gqa4"])
def test_mixed_batch(bs, h, kvh):
    _check(MIXED, h, kvh, bs)


def test_token_trees_of_several_shapes():
    """Two trees of different shapes in one batch, one a 65-node window (root + 64 nodes: wider
    than one int64 bitmask), beside a decode token."""
    _check([(len(PARENTS), 30, _tree()), (1, 9, None), (65, 70, _chain_tree(64))], 4, 2, 16)


def test_tree_node_sees_only_its_ancestors():
    """Each node's output equals attention over the context plus its own path only, and a mask
    with one sibling made visible changes exactly that node's output (the mask is really read)."""
    specs = [(len(PARENTS), 23 + len(PARENTS), _tree())]
    got, _ = _check(specs)
    bad = _tree().clone()
    bad[3, 2] = True  # node 3 (child of 1) now sees node 2, its parent's sibling
    flipped = ta.paged_attention(*_ref_args(specs), tree=ta.pack_tree_masks([bad.to(DEVICE)], DEVICE))
    differs = (flipped - got).abs().amax(dim=(1, 2)) > 1e-3
    assert differs.tolist() == [i == 3 for i in range(len(PARENTS))]


def test_window_mask_of_any_shape():
    """The contract allows any [q, w] window, also one wider than the new tokens and one letting a
    token see a later one: the kernel reads keys up to kv_len for such sequences in every tile."""
    g = torch.Generator().manual_seed(5)
    window = torch.rand(20, 26, generator=g) > 0.5
    window[:, 0] = True  # every row sees something
    specs = [(20, 45, window), (3, 10, None)]
    args = _ref_args(specs)
    windows = [window.to(DEVICE), None]
    got = ta.paged_attention(*args, tree=ta.pack_tree_masks(windows, DEVICE), block_q=4)
    torch.testing.assert_close(got, ta.paged_attention_ref(*args, windows=windows), **TOL[torch.float32])
    _check(specs)


def test_causal_mask_is_applied():
    """A prefill's first token must not see later tokens: compare against full (non-causal) attention."""
    got, _ = _check([(9, 9, None)])
    full = ta.paged_attention_ref(*_ref_args([(9, 9, None)]), windows=[torch.ones(9, 9, dtype=torch.bool)])
    assert (got[0] - full[0]).abs().max() > 1e-3 and torch.allclose(got[-1], full[-1], atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtypes_mixed_batch(dtype):
    _check(MIXED, 6, 2, 16, dtype)


@pytest.mark.parametrize("segments", [2, 4])
def test_split_k_matches(segments):
    """Split-K: segments of the key range merged by the reduce kernel; decode and a tree, including
    segments that are empty for short sequences."""
    specs = [(1, 70, None), (1, 3, None), (len(PARENTS), 60, _tree()), (4, 40, None)]
    args = _ref_args(specs, 6, 2, 16)
    want = ta.paged_attention_ref(*args, windows=[None, None, _tree().to(DEVICE), None])
    tree = ta.pack_tree_masks([None, None, _tree().to(DEVICE), None], DEVICE)
    got = ta.paged_attention(*args, tree=tree, num_segments=segments)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    one = ta.paged_attention(*args, tree=tree, num_segments=1)
    torch.testing.assert_close(got, one, **TOL[torch.float32])


@pytest.mark.parametrize("block_q", [1, 4, 16])
def test_query_tiles_of_any_size(block_q):
    """The program -> (sequence, query tile) mapping holds for tiles smaller and larger than sequences."""
    args = _ref_args(MIXED[:4], 4, 2, 32)
    windows = [None, None, _tree().to(DEVICE), None]
    got = ta.paged_attention(*args, tree=ta.pack_tree_masks(windows, DEVICE), block_q=block_q, tile_n=16)
    torch.testing.assert_close(got, ta.paged_attention_ref(*args, windows=windows), **TOL[torch.float32])


def test_choose_num_segments():
    assert ta.choose_num_segments(1, 1, 3, 16384) == 16  # one long decode: split
    assert ta.choose_num_segments(1, 1, 3, 256) == 1  # short context: no split
    assert ta.choose_num_segments(64, 64, 3, 16384) == 1  # enough programs already
    assert ta.choose_num_segments(512, 1, 3, 16384) == 1  # a prefill chunk
    assert ta.choose_num_segments(6, 1, 3, 4096) == 1 and ta.choose_num_segments(4, 1, 3, 4096) == 8


def test_pack_tree_masks_layout():
    a, b = _tree(), _chain_tree(5)
    t = ta.pack_tree_masks([None, a, None, b], "cpu")
    assert t.win_lens.tolist() == [0, a.shape[1], 0, b.shape[1]]
    assert t.row_start.tolist() == [0, 0, a.shape[0], a.shape[0]]
    assert t.mask.shape == (a.shape[0] + b.shape[0], max(a.shape[1], b.shape[1]))
    assert torch.equal(t.mask[a.shape[0]:, : b.shape[1]].bool(), b)
    assert ta.pack_tree_masks([None, None], "cpu") is None


def test_kernels_compile_for_a100_and_h100(tmp_path):
    """Every kernel specialisation compiles for sm_80 and sm_90 (to a cubin, no GPU needed): the
    interpreter does not check what only the compiler rejects."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    root = Path(__file__).resolve().parent.parent
    res = subprocess.run([sys.executable, "-m", "tests.triton_compile", "80", "90"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count(": ok") == 2 * 15


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_long_contexts_and_head_dim_64(dtype):
    """Compiled on the GPU: head_dim 64 (bf16 products on the tensor cores), contexts to 4k, split-K."""
    specs = [(1, 4000, None), (1, 700, None), (33, 33 + 64, _chain_tree(32)), (128, 1500, None)]
    windows = [w if w is None else w.to(DEVICE) for _, _, w in specs]
    args = _ref_args(specs, 9, 3, 16, dtype, d=64)
    want = ta.paged_attention_ref(*args, windows=windows)
    tree = ta.pack_tree_masks(windows, DEVICE)
    for s in (1, 8):
        torch.testing.assert_close(ta.paged_attention(*args, tree=tree, num_segments=s).float(), want.float(),
                                   **TOL[dtype])
