"""benchmarks/attention_bench.py on CPU: every column measured on tiny shapes, the implementations it
times (the native kernel, the interpreted Triton kernel, the torch reference, dense SDPA) agree, and
the split-K sweep times the Triton kernel at forced counts (the attention stage of gpu_bench:
tests/test_gpu_bench.py)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")


def test_attention_bench_runs_and_agrees(monkeypatch):
    """benchmarks.attention_bench on tiny shapes (CPU: the native kernel): every column measured, and
    the implementations it times compute the same attention for a decode batch, a tree and a prefill
    (the Triton kernel, interpreted, too)."""
    from actors.model.attention import paged_attention
    from actors.model.attention_backends import native_paged_attention, triton_paged_attention
    from benchmarks import attention_bench as ab

    monkeypatch.setattr(ab, "H", 4)
    monkeypatch.setattr(ab, "KVH", 2)
    monkeypatch.setattr(ab, "D", 16)
    rows = [ab.measure(2, 40, None, torch.device("cpu"), reps=1), ab.measure(1, 40, 7, torch.device("cpu"), reps=1),
            ab.measure(1, 24, None, torch.device("cpu"), reps=1, prefill=True)]
    assert all(r["kernel_s"] > 0 and r["torch_ref_s"] > 0 and r["sdpa_dense_s"] > 0 for r in rows)
    assert {r["kernel"] for r in rows} == {"native"}
    text = ab.table(rows)
    assert "| 1 | 40 | 7 |" in text and "| 1 | 24 | 24 |" in text and "native / SDPA" in text
    for tree, prefill in ((None, False), (7, False), (None, True)):
        window = ab.bushy_tree_mask(tree) if tree else None
        qn = 24 if prefill else (tree or 1)
        ctx = 24 if prefill else 40
        q, k, v, fb, dk, dv = ab.case(2, ctx, qn, window, torch.device("cpu"), torch.float32)
        want = paged_attention(q, k, v, fb, 0.25)
        torch.testing.assert_close(native_paged_attention(q, k, v, fb, 0.25), want, atol=1e-4, rtol=1e-4)
        fb.cache.clear()
        torch.testing.assert_close(triton_paged_attention(q, k, v, fb, 0.25), want, atol=1e-4, rtol=1e-4)
        mask = None
        if window is not None:
            mask = torch.ones(tree, 40, dtype=torch.bool)
            mask[:, 40 - tree:] = window
        qd = q.view(2, qn, 4, 16).transpose(1, 2)
        dense = torch.nn.functional.scaled_dot_product_attention(qd, dk, dv, attn_mask=mask, scale=0.25,
                                                                 is_causal=prefill, enable_gqa=True)
        torch.testing.assert_close(dense.transpose(1, 2).reshape(q.shape), want, atol=1e-4, rtol=1e-4)

def test_attention_bench_split_k_sweep(monkeypatch, capsys):
    """--segments times the Triton kernel (interpreted here) at each forced split-K count beside the
    backend's own choice; the table stars that choice and bolds the fastest; bad counts are refused
    naming the value."""
    from benchmarks import attention_bench as ab

    monkeypatch.setattr(ab, "H", 4)
    monkeypatch.setattr(ab, "KVH", 2)
    monkeypatch.setattr(ab, "D", 16)
    rows = [ab.measure(1, 1024, None, torch.device("cpu"), reps=1, segments=[1, 2]),
            ab.measure(1, 40, 7, torch.device("cpu"), reps=1, segments=[1, 2])]
    assert [sorted(r["split"]["times"]) for r in rows] == [[1, 2], [1, 2]]
    assert all(t > 0 for r in rows for t in r["split"]["times"].values())
    assert rows[0]["split"]["heuristic"] == 2 and rows[1]["split"]["heuristic"] == 1  # one long decode splits
    text = ab.split_table(rows)
    assert "| S=1 | S=2 |" in text and text.count("**") == 4 and text.count(" *") >= 2
    assert "| 1 | 1024 | 1 | 2 |" in text and "| 1 | 40 | 7 | 1 |" in text
    for bad, msg in (("3", "3 is not a power of two"), ("a,b", "'a,b'")):
        with pytest.raises(SystemExit):
            ab.main(["--device", "cpu", "--segments", bad])
        assert msg in capsys.readouterr().err
