"""The CUDA-graph runner's buckets and its padded forward (actors/model/graph_runner.py).

A graph replays the forward of a padded batch, so the padded forward must give the unpadded
one's results: the same hidden states for the real rows and the same KV cache (padded tokens
write nothing). On CPU the padded path runs eagerly (``capture=False``) with the Triton kernels
interpreted (tiny shapes); the batch composition changes every step so stale metadata would show.
The graphs themselves are checked on a GPU (tests/test_gpu_engine.py)."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from actors.model import attention_backends as ab  # noqa: E402
from actors.model.graph_runner import CudaGraphRunner, batch_buckets, bucket_shapes, pick_bucket  # noqa: E402
from actors.model.loader import load_model  # noqa: E402
from actors.verifier import SeqChunk, Verifier, graphs_usable  # noqa: E402
from tests.model import random_ids  # noqa: E402
from tests.model.test_tree_attention import PARENTS, ancestor_mask, tree_depths  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BS, BLOCKS = 4, 64


def test_batch_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_buckets(100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]


def test_bucket_shapes_and_pick():
    shapes = bucket_shapes(8, max_tokens=32, tokens_per_seq=(1, 2, 4, 8, 16, 32))
    assert shapes[:6] == [(1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (1, 32)]
    assert all(n <= 32 and n % b == 0 for b, n in shapes)
    assert pick_bucket(shapes, 1, 1) == (1, 1)
    assert pick_bucket(shapes, 1, 6) == (1, 8)  # a K=5 chain
    assert pick_bucket(shapes, 3, 3) == (4, 4)  # three decode tokens
    assert pick_bucket(shapes, 3, 13) == (4, 16)
    assert pick_bucket(shapes, 8, 33) is None  # more tokens than any bucket: eager
    assert pick_bucket(shapes, 9, 9) is None  # more sequences than any bucket: eager


@pytest.fixture(scope="module")
def triton_model(tiny_target_dir):
    model = load_model(tiny_target_dir, dtype=torch.float32, device=DEVICE).model
    ab.set_attention_backend(model, "triton", fused_ops=True)
    yield model
    ab.set_attention_backend(model, "torch")


class _Seq:
    """A sequence's slots in its own blocks (block b of sequence s is s * 8 + b)."""

    def __init__(self, index: int):
        self.table = [index * 8 + b for b in range(8)]
        self.len = 0

    def chunk(self, tokens: list[int], positions=None, window=None) -> SeqChunk:
        start = self.len
        pos = positions or list(range(start, start + len(tokens)))
        slots = [self.table[p // BS] * BS + p % BS for p in range(start, start + len(tokens))]
        return SeqChunk(tokens, pos, slots, start + len(tokens), self.table[: -(-(start + len(tokens)) // BS)], window)

    def commit(self, n: int) -> None:
        self.len += n


def _steps():
    """(chunks, logit rows) per step, built lazily so each step sees the sequences' lengths."""
    seqs = [_Seq(i) for i in range(4)]
    tree_pos = lambda s: [s.len + d for d in tree_depths(PARENTS)]  # noqa: E731
    plan = [
        [(0, random_ids(5, 256, 1), None, None), (1, random_ids(3, 256, 2), None, None)],  # small prefills
        [(0, [7], None, None)],  # one decode token (bucket (1, 1): no padding at all)
        [(0, [9], None, None), (1, [11], None, None), (2, random_ids(4, 256, 3), None, None)],  # 3 seqs -> 4
        [(1, random_ids(len(PARENTS), 256, 4), "tree", None), (0, [12], None, None)],  # a tree + a decode
        [(2, random_ids(6, 256, 5), "chain", None)],  # a K=5 chain alone: 6 tokens -> 8
        [(3, random_ids(2, 256, 6), None, None), (0, [4], None, None), (2, [8], None, None),
         (1, [3], None, None)],  # 4 seqs, 5 tokens -> (4, 8)
    ]
    for step in plan:
        chunks = []
        for i, toks, kind, _ in step:
            s = seqs[i]
            if kind == "tree":
                chunks.append(s.chunk(toks, tree_pos(s), ancestor_mask(PARENTS)))
            elif kind == "chain":
                chunks.append(s.chunk(toks, window=torch.ones(len(toks), len(toks), dtype=torch.bool).tril()))
            else:
                chunks.append(s.chunk(toks))
        n = sum(len(c.token_ids) for c in chunks)
        yield chunks, list(range(n))
        for (i, toks, _, _), c in zip(step, chunks):
            seqs[i].commit(len(toks))


def test_padded_forward_equals_unpadded(triton_model):
    plain = Verifier(triton_model, BLOCKS, BS, torch.device(DEVICE), torch.float32, enforce_eager=True)
    padded = Verifier(triton_model, BLOCKS, BS, torch.device(DEVICE), torch.float32, enforce_eager=True)
    padded.graphs = CudaGraphRunner(triton_model, padded.kv_caches, BS, max_num_seqs=4, max_model_len=32,
                                    max_tokens=32, capture=False)
    written = []
    for chunks, rows in _steps():
        written += [s for c in chunks for s in c.slots]
        want, want_h = plain.forward_logits_and_hidden(chunks, rows)
        got, got_h = padded.forward_logits_and_hidden(chunks, rows)
        assert got_h.shape == want_h.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert padded.graphs.num_eager == 6  # every step went through the padded path
    unused = torch.ones(BLOCKS * BS, dtype=torch.bool)
    unused[written] = False
    for (k0, v0), (k1, v1) in zip(plain.kv_caches, padded.kv_caches):
        for mine, theirs in ((k1, k0), (v1, v0)):
            flat = mine.reshape(BLOCKS * BS, -1)
            assert not flat[unused.to(flat.device)].any(), "a padded token wrote to the KV cache"
            # the same K/V where real tokens wrote (bit-identical on CPU; GEMMs of other row counts on CUDA)
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_graphs_usable_says_why_not(triton_model):
    assert "CUDA device" in graphs_usable(triton_model, torch.device("cpu"))
    ab.set_attention_backend(triton_model, "torch")
    try:
        assert "triton" in graphs_usable(triton_model, torch.device("cuda"))
    finally:
        ab.set_attention_backend(triton_model, "triton", fused_ops=True)
