"""benchmarks.multiturn on the tiny model: the workload's shape (turn t's prompt is turn t-1's
prompt + answer + question), the host tier (and small host + disk) serving prompt tokens with the
same greedy output as no tier, the preemption run's modes agreeing, bad flags named."""
from __future__ import annotations

import pytest

from benchmarks.kv_bench_engines import EngineFactory
from benchmarks.multiturn import main, multiturn_sizes, preemption_sizes, run_multiturn
from benchmarks.preemption_bench import run_preemption
from benchmarks.multiturn_workload import build_workload, next_prompt
from tests.tiny import _load

TURNS, MAX_TOKENS = 3, 6


@pytest.fixture(scope="module")
def factory(tiny_target_dir):
    return EngineFactory(str(tiny_target_dir), _load(str(tiny_target_dir)), device="cpu", threads=1, block_size=4)


def test_workload_is_deterministic_and_varied(factory):
    tok = factory.loaded.tokenizer
    a, b = build_workload(tok, 4, TURNS, (40, 60), seed=0), build_workload(tok, 4, TURNS, (40, 60), seed=0)
    assert a == b and a != build_workload(tok, 4, TURNS, (40, 60), seed=1)
    assert len({tuple(c.first) for c in a}) == 4 and all(len(c.followups) == TURNS - 1 for c in a)


def test_turns_extend_and_host_tier_hits_with_same_output(factory, tmp_path):
    convs = build_workload(factory.loaded.tokenizer, 6, TURNS, (40, 60), seed=0)
    size = multiturn_sizes(convs, MAX_TOKENS, 2, factory.block_size)
    assert size["device_blocks"] < size["workload_blocks"]  # conversations leave the device pool
    rows, runs = run_multiturn(factory, convs, MAX_TOKENS, 2, size["device_blocks"], size["host_blocks"],
                               disk_dir=str(tmp_path))
    assert [r["config"] for r in rows] == ["no tier", "host tier", "small host + disk"]
    base = runs["no tier"]
    for c, (prompts, outs) in enumerate(zip(base["prompts"], base["outputs"])):
        assert len(prompts) == len(outs) == TURNS and prompts[0] == convs[c].first
        for t in range(1, TURNS):
            assert prompts[t][:len(prompts[t - 1])] == prompts[t - 1]
            assert prompts[t] == next_prompt(prompts[t - 1], outs[t - 1], convs[c].followups[t - 1], {2})
    none, host, disk = rows
    assert none["hit_rate"]["host"] == 0 and host["hit_rate"]["host"] > 0
    assert disk["hit_rate"]["host"] + disk["hit_rate"]["disk"] > 0
    for name in ("host tier", "small host + disk"):
        assert runs[name]["prompts"] == base["prompts"] and runs[name]["outputs"] == base["outputs"]
    assert host["same_outputs_as_no_tier"] and disk["same_outputs_as_no_tier"]
    assert none["requests"] == 6 * TURNS and none["ttft_later_p50_s"] > 0


def test_preemption_modes_agree(factory):
    prompts = [c.first for c in build_workload(factory.loaded.tokenizer, 8, 1, (30, 50), seed=1)]
    size = preemption_sizes(prompts, 16, factory.block_size)
    rows, outs = run_preemption(factory, prompts, 16, 8, size["device_blocks"], size["host_blocks"],
                                ("swap", "recompute", "recompute-no-tier"))
    assert outs["swap"] == outs["recompute"] == outs["recompute-no-tier"] and all(r["same_outputs"] for r in rows)
    swap, rec, notier = (r["preemptions"] for r in rows)
    assert swap["swap"] > 0 and rec["swap"] == 0 < rec["recompute"] and notier["recompute"] > 0


@pytest.mark.parametrize("argv, named", [(["--turns", "0"], "--turns 0"),
                                         (["--doc-tokens", "2000,1000"], "--doc-tokens '2000,1000'"),
                                         (["--doc-tokens", "abc"], "--doc-tokens 'abc'"),
                                         (["--preempt-modes", "swap,bogus"], "'bogus'"),
                                         (["--parts", "multiturn,x"], "--parts"),
                                         (["--disk-dir", "/nonexistent/kv"], "--disk-dir /nonexistent/kv")])
def test_bad_flag_is_named(argv, named, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and named in capsys.readouterr().err
