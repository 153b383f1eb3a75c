"""`specray bench` / `specray tune`: bad input, one small in-process run on the default model
(JSON + Markdown + PNG), the transformers peers and a tune run. The HTTP client is in
tests/test_bench_url.py, the arithmetic in tests/test_bench_metrics.py."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks.prompt_set import load_prompt_set
from cluster.cli import main
from tests.bench_cli import run_cli, write_prompts
from tests.ports import free_port

@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("prompts") / "p.jsonl")


def test_prompt_set_names_the_bad_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"category": "a", "messages": [{"role": "user", "content": "hi"}]}\n{"category": "a"}\n')
    with pytest.raises(ValueError, match=f"{f}:2"):
        load_prompt_set(f)
    f.write_text('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}\n')
    with pytest.raises(ValueError, match="max_tokens=0"):
        load_prompt_set(f)


# ---- bad input: one line naming the value, exit 2, before anything loads -----------------------

@pytest.mark.parametrize("argv, needle", [
    (["--draft", "ngram,eagle9"], "'eagle9'"),
    (["--draft", "eagle:"], "eagle:PATH"),
    (["--draft", "layerskip:x"], "layerskip:x"),
    (["--concurrency", "1,x"], "--concurrency '1,x'"),
    (["--concurrency", "0,2"], "--concurrency '0,2'"),
    (["--temperature", "-1"], "--temperature '-1'"),
    (["--spec-tokens", "3,0"], "--spec-tokens '3,0'"),
    (["--sample", "9"], "--sample 9"),
    (["--max-tokens", "0"], "--max-tokens 0"),
    (["--tree", "1,0"], "--tree '1,0'"),
    (["--kv-cache-gb", "0"], "--kv-cache-gb 0.0"),
    (["--tree-width", "1,0"], "--tree-width '1,0'"),
    (["--tree-width", "9"], "--tree-width 9"),
])
def test_bench_bad_input_one_line_exit_2(capsys, prompts_file, argv, needle):
    code, out, err = run_cli(capsys, "bench", "--prompts", str(prompts_file), *argv)
    assert code == 2 and out == ""
    assert err.startswith("specray: error: ") and err.count("\n") == 1, err
    assert needle in err and "Traceback" not in err


def test_bench_missing_prompts_and_unreachable_url(capsys, prompts_file, tmp_path):
    code, _, err = run_cli(capsys, "bench", "--prompts", str(tmp_path / "nope.jsonl"))
    assert code == 2 and "nope.jsonl" in err and err.count("\n") == 1
    url = f"http://127.0.0.1:{free_port()}"
    start = time.perf_counter()
    code, _, err = run_cli(capsys, "bench", "--prompts", str(prompts_file), "--url", url)
    assert code == 2 and f"--url {url}: unreachable" in err and err.count("\n") == 1, err
    assert time.perf_counter() - start < 30
    code, _, err = run_cli(capsys, "tune", "--prompts", str(prompts_file), "--draft", "none")
    assert code == 2 and "--draft 'none'" in err


# ---- the in-process sweep on the default model --------------------------------------------------

# One torch thread in these runs: the test box's 2 cores are shared, and oversubscribed torch
# threads make a step several times slower.
@pytest.fixture(scope="module")
def bench_out(prompts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    code = main(["bench", "--prompts", str(prompts_file), "--sample", "6", "--max-tokens", "8",
                 "--concurrency", "1,2", "--draft", "ngram", "--out", str(out), "--threads", "1"])
    assert code == 0
    return out


@pytest.mark.model
def test_bench_writes_json_markdown_and_plots(bench_out):
    doc = json.loads((bench_out / "bench.json").read_text())
    assert doc["prompts"]["num_prompts"] == 6
    assert doc["prompts"]["categories"] == {"code_generation": 2, "short_qa": 3, "translation": 1}
    runs = {(r["method"], r["concurrency"]): r for r in doc["runs"]}
    assert set(runs) == {("none", 1), ("none", 2), ("ngram", 1), ("ngram", 2)}
    for (method, c), r in runs.items():
        assert r["output_tokens"] <= 6 * 8 and r["num_errors"] == 0
        assert r["tokens_per_s"] > 0 and r["e2e_p95_s"] >= r["e2e_p50_s"] > 0
        assert r["ttft_p50_s"] > 0 and r["tpot_p50_s"] > 0
        assert set(r["categories"]) == {"code_generation", "short_qa", "translation"}
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / runs[("none", c)]["tokens_per_s"])
        if method == "none":
            assert r["acceptance_rate"] is None and r["per_position_acceptance"] == []
        else:
            assert 0 <= r["acceptance_rate"] <= 1 and r["mean_accepted_length"] >= 1
            # greedy speculation is lossless: the same tokens, so the same count, as the baseline
            assert r["output_tokens"] == runs[("none", c)]["output_tokens"]
    md = (bench_out / "bench.md").read_text()
    assert "## Runs" in md and "## Per category" in md and "| ngram | K=5 | 0 | 2 |" in md
    for name in ("speedup_vs_concurrency.png", "speedup_vs_temperature.png", "speedup_vs_k.png"):
        assert (bench_out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.model
def test_tune_recommends_a_measured_candidate(capsys, prompts_file):
    code, out, _ = run_cli(capsys, "tune", "--prompts", str(prompts_file), "--sample", "2", "--draft", "ngram",
                           "--spec-tokens", "1,3", "--tree", "1,2", "--max-tokens", "8", "--threads", "1", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [r["spec"] for r in doc["runs"]] == ["-", "K=1", "K=3", "tree 1,2"]
    assert doc["runs"][3]["tree"] == "1,2" and doc["runs"][3]["output_tokens"] == doc["runs"][0]["output_tokens"]
    best = max(r["tokens_per_s"] for r in doc["runs"])
    chosen = next(r for r in doc["runs"] if (r["spec"] if r["method"] == "ngram" else "off (K=0)")
                  == doc["recommended"]["1"])
    assert chosen["tokens_per_s"] >= best * (1 - 0.02)


@pytest.mark.model
def test_peers_plain_and_prompt_lookup_with_ratios(prompts_file):
    from benchmarks.peers import attach_ratios, run_peers

    prompts = load_prompt_set(prompts_file)[:2]
    peers = run_peers("smollm2-135m", prompts, 4, ["ngram", "layerskip:4", "default"], [2], threads=1)
    by_name = {p.peer: p for p in peers}
    assert set(by_name) == {"transformers.generate", "transformers.prompt_lookup", "transformers.early_exit",
                            "transformers.assisted"}
    for name in ("transformers.generate", "transformers.prompt_lookup", "transformers.early_exit"):
        assert 0 < by_name[name].output_tokens <= 8 and by_name[name].tokens_per_s > 0
    assert by_name["transformers.prompt_lookup"].spec_tokens == 2
    assert by_name["transformers.early_exit"].counterpart == "layerskip:4" and by_name["transformers.early_exit"].spec_tokens == 2
    assert "not a draft model" in by_name["transformers.assisted"].note  # the EAGLE head (default)
    rows = [{"method": "none", "spec_tokens": None, "tree": None, "concurrency": 1, "temperature": 0.0,
             "tokens_per_s": 2 * by_name["transformers.generate"].tokens_per_s}]
    attach_ratios(peers, rows)
    assert by_name["transformers.generate"].ratio == pytest.approx(2.0)
    assert by_name["transformers.prompt_lookup"].ratio is None and "no specray run" in by_name[
        "transformers.prompt_lookup"].note


def test_peer_ratio_compares_with_the_fixed_k_run_not_the_adaptive_one():
    from benchmarks.peers import PeerResult, attach_ratios

    row = dict(method="ngram", spec_tokens=5, tree=None, concurrency=1, temperature=0.0)
    rows = [{**row, "spec": "K=5", "tokens_per_s": 30.0}, {**row, "spec": "auto K<=5", "tokens_per_s": 20.0}]
    peer = PeerResult("transformers.prompt_lookup", "ngram", 5, 100, 10.0, 10.0)
    attach_ratios([peer], rows)
    assert peer.specray_tokens_per_s == 30.0 and peer.ratio == pytest.approx(3.0)


def test_ab_adaptive_alternates_and_prints_ratios(capsys, prompts_file, default_model_dir):
    from benchmarks.ab_adaptive import main

    main(["--model", str(default_model_dir), "--prompts", str(prompts_file), "--sample", "2", "--concurrency", "2",
          "--reps", "2", "--max-tokens", "4", "--threads", "1"])
    out = capsys.readouterr().out
    order = [line.split()[-3] for line in out.splitlines() if line.startswith("# c=2 rep")]
    assert order == ["none:", "auto:", "auto:", "none:"]  # ABBA
    (summary,) = [line for line in out.splitlines() if line.startswith("c=2:")]
    assert "ratio" in summary and summary.count("paired") == 1 and len(summary.split("paired: ")[1].split(",")) == 2


def test_spec_tokens_auto_alone_runs_only_the_adaptive_policy():
    from benchmarks.options import parse_spec_tokens
    from benchmarks.sweep import plan_groups

    assert parse_spec_tokens("auto") == ([], True)
    assert parse_spec_tokens("3,7,auto") == ([3, 7], True)
    assert parse_spec_tokens("5") == ([5], False)
    ks, adaptive = parse_spec_tokens("auto")
    (_, ngram) = plan_groups(["ngram"], ks, adaptive=adaptive)
    assert [v.adaptive for v in ngram.variants] == [True] and ngram.variants[0].spec_tokens == 5
    ks, adaptive = parse_spec_tokens("3,7,auto")
    (_, ngram) = plan_groups(["ngram"], ks, adaptive=adaptive)
    assert [(v.spec_tokens, v.adaptive) for v in ngram.variants] == [(3, False), (7, False), (7, True)]


def test_tree_widths_make_one_group_per_width_for_eagle_methods_only():
    from benchmarks.sweep import plan_groups

    groups = plan_groups(["ngram", "default", "eagle:/x.safetensors"], [5], adaptive=True, tree_widths=(1, 3))
    got = [(g.method, [(v.label, v.tree_width) for v in g.variants]) for g in groups]
    assert got == [("none", [("-", 1)]),
                   ("ngram", [("K=5", 1), ("auto K<=5", 1)]),
                   ("default", [("K=5", 1), ("auto K<=5", 1)]), ("default", [("K=5 w3", 3), ("auto K<=5 w3", 3)]),
                   ("eagle:/x.safetensors", [("K=5", 1), ("auto K<=5", 1)]),
                   ("eagle:/x.safetensors", [("K=5 w3", 3), ("auto K<=5 w3", 3)])]
    # unset, EAGLE methods get the engine's default tree (and say so in the label)
    assert [[v.label for v in g.variants] for g in plan_groups(["ngram", "eagle"], [5])] == [
        ["-"], ["K=5"], ["K=5 w3 n10"]]
    assert [v.label for v in plan_groups(["default"], [5], tree_nodes=(6,))[1].variants] == ["K=5 w3 n6"]
    # the engine's default on the CPU (cluster.config.default_tree_width), which the bench's runs use there
    assert [v.label for v in plan_groups(["default"], [5], default_width=2)[1].variants] == ["K=5 w2 n10"]
    capped = plan_groups(["ngram", "default"], [6], tree_widths=(1, 3), tree_nodes=(8, 10))
    assert [(g.method, [(v.label, v.tree_nodes) for v in g.variants]) for g in capped] == [
        ("none", [("-", None)]), ("ngram", [("K=6", None)]), ("default", [("K=6", None)]),
        ("default", [("K=6 w3 n8", 8)]), ("default", [("K=6 w3 n10", 10)])]


def test_url_runs_refuse_engine_flags(capsys, prompts_file):
    url = f"http://127.0.0.1:{free_port()}"
    for flag in (["--tree-width", "2"], ["--tree-nodes", "8"], ["--dtype", "bfloat16"]):
        code, _, err = run_cli(capsys, "bench", "--prompts", str(prompts_file), "--url", url, *flag)
        assert code == 2 and "the server's" in err and flag[0] in err, err


def test_tree_nodes_need_a_tree_width(capsys, prompts_file):
    code, _, err = run_cli(capsys, "bench", "--prompts", str(prompts_file), "--tree-width", "1", "--tree-nodes", "8")
    assert code == 2 and "--tree-nodes 8" in err and "--tree-width" in err, err
    code, _, err = run_cli(capsys, "bench", "--prompts", str(prompts_file), "--tree-width", "3", "--tree-nodes", "0")
    assert code == 2 and "--tree-nodes '0'" in err, err


def test_early_exit_peer_puts_the_generation_config_back():
    from types import SimpleNamespace

    from benchmarks.peers import _early_exit_peers

    config = SimpleNamespace(num_assistant_tokens=20, num_assistant_tokens_schedule="heuristic",
                             assistant_confidence_threshold=0.4)
    seen = []

    def run(**kw):
        seen.append((kw, config.num_assistant_tokens, config.num_assistant_tokens_schedule))
        return 10, 1.0

    out = _early_exit_peers(SimpleNamespace(generation_config=config), run, "layerskip:3", [2, 5])
    assert seen == [({"assistant_early_exit": 3}, 2, "constant"), ({"assistant_early_exit": 3}, 5, "constant")]
    assert [(r.peer, r.counterpart, r.spec_tokens) for r in out] == [("transformers.early_exit", "layerskip:3", 2),
                                                                      ("transformers.early_exit", "layerskip:3", 5)]
    assert vars(config) == {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "heuristic",
                            "assistant_confidence_threshold": 0.4}


@pytest.mark.parametrize("warmup_batch", [False, True])
def test_warmup_batch_runs_one_unmeasured_batch_at_the_runs_concurrency(warmup_batch):
    """--warmup-batch: before the timed generate, the warm-up prompt once per slot of the run's
    concurrency (32 tokens each, the run's temperature and K): not timed, not in the records."""
    from types import SimpleNamespace

    from benchmarks.engine_bench import WARMUP_BATCH_TOKENS, EngineBackend
    from benchmarks.prompt_set import BenchPrompt
    from benchmarks.results import Variant

    calls = []

    class FakeEngine:
        def generate(self, prompts, params, chat, concurrency):
            calls.append((prompts, params, concurrency))
            out = SimpleNamespace(num_output_tokens=3, e2e_s=0.1, ttft_s=0.01, num_drafts=0, num_draft_tokens=0,
                                  num_accepted_tokens=0, accepted_per_pos=[], error=None, finish_reason="length")
            return [out] * len(prompts)

    backend = EngineBackend.__new__(EngineBackend)  # no model: the run logic only
    backend.max_tokens, backend.seed, backend.warmup_batch = 8, 0, warmup_batch
    prompts = [BenchPrompt(f"p{i}", "short_qa", f"question {i}") for i in range(5)]
    warm = BenchPrompt("w", "short_qa", "warm up")
    run = backend._run(FakeEngine(), "default", Variant(spec_tokens=4), prompts, 3, 0.0, warm)
    assert len(run.records) == 5
    timed = calls[-1]
    assert timed[0] == [p.prompt for p in prompts] and timed[2] == 3
    if not warmup_batch:
        assert len(calls) == 1
        return
    assert len(calls) == 2
    wprompts, wparams, wconc = calls[0]
    assert wprompts == ["warm up"] * 3 and wconc == 3
    assert wparams.max_tokens == WARMUP_BATCH_TOKENS and wparams.spec_tokens == 4 and wparams.temperature == 0.0
