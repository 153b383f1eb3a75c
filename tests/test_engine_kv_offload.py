"""Host KV tier end to end on the tiny model: same greedy output with the tier off and on, and with
it on, a second round of the same prompts loads their prefixes instead of recomputing them."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig
from tests.tiny import random_prompts, tiny_engine

# 4 prompts of 36-39 tokens (9+ blocks of 4) over a 24-block device pool: one prompt's prefix is
# evicted by the next ones before the second round comes back to it.
PROMPTS = [p[:36 + i] for i, p in enumerate(random_prompts(4, seed=11, lo=60, hi=61))]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def _counting(eng) -> list[int]:
    """Count the tokens every target forward computes (prefill chunks + decode tokens)."""
    computed = [0]
    fwd = eng.verifier.forward_logits

    def counted(chunks, rows, num_layers=None):
        computed[0] += sum(len(c.token_ids) for c in chunks)
        return fwd(chunks, rows, num_layers)

    eng.verifier.forward_logits = counted
    return computed


def _two_rounds(eng):
    computed = _counting(eng)
    first = eng.generate(PROMPTS, PARAMS, concurrency=1)
    n1 = computed[0]
    second = eng.generate(PROMPTS, PARAMS, concurrency=1)
    return first, second, n1, computed[0] - n1


def _assert_no_leak(eng):
    assert not eng.has_unfinished()
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    eng.allocator.check_invariants()


def test_host_tier_same_output_and_less_prefill(tiny_target_dir):
    off = tiny_engine(tiny_target_dir, num_kv_blocks=24)
    on = tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload={"host_blocks": 64})
    off1, off2, off_n1, off_n2 = _two_rounds(off)
    on1, on2, on_n1, on_n2 = _two_rounds(on)
    ids = [o.token_ids for o in off1]
    assert [o.token_ids for o in off2] == ids and [o.token_ids for o in on1] == ids
    assert [o.token_ids for o in on2] == ids
    assert on_n1 == off_n1  # nothing to reuse yet
    assert sum(o.num_host_cached_tokens for o in on2) > 0
    assert sum(o.num_cached_tokens for o in on2) > sum(o.num_cached_tokens for o in off2)
    assert on_n2 < off_n2
    for o in on2:
        assert o.num_host_cached_tokens <= o.num_cached_tokens < o.num_prompt_tokens
        assert o.to_dict()["num_cached_tokens"] == o.num_cached_tokens  # what --json prints
    stats = on.kv.stats()
    assert stats["host_blocks_evicted"] > 0 and stats["host_blocks_loaded"] > 0
    assert on.verifier.host_pool.bytes_in == stats["host_blocks_loaded"] * on.verifier.host_pool.block_bytes
    _assert_no_leak(off)
    _assert_no_leak(on)
    _check_metrics(on, stats)


def _check_metrics(eng, stats: dict) -> None:
    from tests.test_metrics import sample_value

    snap, pool = eng.metrics.snapshot(), eng.verifier.host_pool

    def v(name: str, **labels: str) -> float:
        return sample_value(snap, "specray:" + name, **labels)

    assert v("kv_offload_hits_total", tier="host") == stats["host_hits"] > 0
    assert v("kv_offload_hits_total", tier="device") == stats["prefix_hits"] - stats["host_hits"]
    assert v("kv_offload_blocks", tier="host") == stats["host_cached_blocks"]
    assert v("kv_offload_bytes_total", direction="host_to_device") == pool.bytes_in > 0
    assert v("kv_offload_bytes_total", direction="device_to_host") == pool.bytes_out > 0


@pytest.mark.parametrize("host_blocks,draft,concurrency", [(2, "none", 2), (64, "ngram", 4), (8, "ngram", 3)])
def test_host_tier_under_pressure_stays_lossless(tiny_target_dir, host_blocks, draft, concurrency):
    """A small host tier drops most of what is evicted (LRU); speculation's draft slots and
    preemption (two sequences growing to 16 blocks each in 24) move blocks in the same plans.
    Outputs still match."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = [o.token_ids for o in tiny_engine(tiny_target_dir, num_kv_blocks=24).generate(PROMPTS, params)]
    eng = tiny_engine(tiny_target_dir, draft=draft, num_kv_blocks=24, kv_offload={"host_blocks": host_blocks})
    for _ in range(2):
        assert [o.token_ids for o in eng.generate(PROMPTS, params, concurrency=concurrency)] == base
    assert eng.scheduler.num_preemptions > 0 and eng.kv.stats()["host_blocks_loaded"] > 0
    _assert_no_leak(eng)


@pytest.mark.parametrize("bad", [{"host_gb": -1}, {"host_blocks": -2}])
def test_negative_host_tier_is_refused_naming_the_value(bad):
    with pytest.raises(ValidationError, match=next(iter(bad))):
        EngineConfig(kv_offload=bad)


def test_host_tier_smaller_than_one_block_is_refused(tiny_target_dir):
    with pytest.raises(ValueError, match=r"kv_offload.host_gb=1e-09 is smaller than one KV block"):
        tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload={"host_gb": 1e-9})


def test_cli_flag_sets_the_host_tier():
    from cluster.cli import build_parser, engine_config_from_args

    args = build_parser().parse_args(["generate", "x", "--kv-host-gb", "0.5"])
    assert engine_config_from_args(args).kv_offload.host_gb == 0.5
    args = build_parser().parse_args(["generate", "x"])
    assert not engine_config_from_args(args).kv_offload.enabled


def test_openai_usage_reports_cached_tokens():
    from cluster.outputs import RequestOutput
    from deployments.openai_responses import completion_response, usage_chunk

    out = RequestOutput("r", "hi", [7], "", [], True, "stop", num_prompt_tokens=40, num_output_tokens=1,
                        num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, num_cached_tokens=32)
    usage = completion_response("id", "m", [], [out], chat=True)["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 32} and usage["prompt_tokens"] == 40
    assert usage_chunk("id", "m", True, [out])["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}


def test_cli_negative_host_tier_names_the_value(capsys):
    from cluster.cli import EXIT_BAD_INPUT, main

    assert main(["generate", "x", "--kv-host-gb", "-1"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "host_gb" in err and "-1" in err


# ---- disk tier below the host tier --------------------------------------------------------------
def _disk(tmp_path, host_blocks: int = 6, disk_blocks: int = 64, **kw) -> dict:
    return {"host_blocks": host_blocks, "disk_dir": str(tmp_path / "kv"), "disk_blocks": disk_blocks, **kw}


def test_disk_tier_same_output_and_prefixes_come_back_from_disk(tiny_target_dir, tmp_path):
    """Tiers off, host only and host + disk give the same greedy tokens; with a host tier of 6 blocks
    most of the 4 prompts' evicted prefixes overflow to disk, and the second round loads them from
    there (verified like any hit) instead of recomputing them."""
    off = tiny_engine(tiny_target_dir, num_kv_blocks=24)
    host = tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload={"host_blocks": 6})
    disk = tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload=_disk(tmp_path))
    off1, off2, _, off_n2 = _two_rounds(off)
    host1, host2, _, host_n2 = _two_rounds(host)
    disk1, disk2, _, disk_n2 = _two_rounds(disk)
    ids = [o.token_ids for o in off1]
    for outs in (off2, host1, host2, disk1, disk2):
        assert [o.token_ids for o in outs] == ids
    assert sum(o.num_disk_cached_tokens for o in disk2) > 0
    assert disk_n2 < host_n2 <= off_n2  # the disk tier kept what the small host tier had to drop
    for o in disk2:
        assert o.num_host_cached_tokens + o.num_disk_cached_tokens <= o.num_cached_tokens < o.num_prompt_tokens
        assert o.to_dict()["num_disk_cached_tokens"] == o.num_disk_cached_tokens  # what --json prints
    stats = disk.kv.stats()
    assert stats["disk_blocks_evicted"] > 0 and stats["disk_blocks_loaded"] > 0
    for eng in (off, host, disk):
        _assert_no_leak(eng)
    _check_disk_metrics(disk, stats)
    disk.shutdown()
    assert not (tmp_path / "kv" / "specray-kv.blocks").exists()


def _check_disk_metrics(eng, stats: dict) -> None:
    from tests.test_metrics import sample_value

    snap, moved = eng.metrics.snapshot(), eng.verifier.kv_copy_stats()

    def v(name: str, **labels: str) -> float:
        return sample_value(snap, "specray:" + name, **labels)

    assert v("kv_offload_hits_total", tier="disk") == stats["disk_hits"] > 0
    assert v("kv_offload_hits_total", tier="device") == stats["prefix_hits"] - stats["host_hits"] - stats["disk_hits"]
    assert v("kv_offload_blocks", tier="disk") == stats["disk_cached_blocks"]
    for direction, key in (("host_to_disk", "disk_bytes_out"), ("disk_to_device", "disk_bytes_in")):
        assert v("kv_offload_bytes_total", direction=direction) == moved[direction][0] == stats[key] > 0
        assert v("kv_offload_copy_seconds_total", direction=direction) == moved[direction][1] > 0


@pytest.mark.parametrize("draft,concurrency", [("none", 2), ("ngram", 3)])
def test_disk_tier_under_pressure_stays_lossless(tiny_target_dir, tmp_path, draft, concurrency):
    """A 2-block host tier over a 4-block disk: spills, disk LRU drops, loads from both tiers and
    preemption in the same plans; outputs still match."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = [o.token_ids for o in tiny_engine(tiny_target_dir, num_kv_blocks=24).generate(PROMPTS, params)]
    eng = tiny_engine(tiny_target_dir, draft=draft, num_kv_blocks=24,
                      kv_offload=_disk(tmp_path, host_blocks=2, disk_blocks=4))
    for _ in range(2):
        assert [o.token_ids for o in eng.generate(PROMPTS, params, concurrency=concurrency)] == base
    stats = eng.kv.stats()
    assert eng.scheduler.num_preemptions > 0 and stats["disk_blocks_loaded"] > 0
    assert stats["disk_cached_blocks"] <= 4 and stats["host_cached_blocks"] <= 2
    _assert_no_leak(eng)
    eng.shutdown()


def test_disk_dir_is_one_engines_until_shutdown(tiny_target_dir, tmp_path):
    first = tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload=_disk(tmp_path))
    with pytest.raises(ValueError, match=rf"KV disk dir '{tmp_path / 'kv'}' is in use by another engine \(pid \d+\)"):
        tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload=_disk(tmp_path))
    first.shutdown()
    second = tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload=_disk(tmp_path))
    second.shutdown()


def test_unwritable_disk_dir_is_refused_naming_it(tiny_target_dir, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    bad = tmp_path / "file" / "kv"
    with pytest.raises(ValueError, match=rf"KV disk dir '{bad}' is not writable"):
        tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload={"host_blocks": 4, "disk_dir": str(bad),
                                                                   "disk_blocks": 8})


def test_disk_tier_smaller_than_one_block_is_refused(tiny_target_dir, tmp_path):
    with pytest.raises(ValueError, match=r"kv_offload.disk_gb=1e-09 is smaller than one KV block"):
        tiny_engine(tiny_target_dir, num_kv_blocks=24,
                    kv_offload={"host_blocks": 4, "disk_dir": str(tmp_path), "disk_gb": 1e-9})


@pytest.mark.parametrize("bad,named", [
    ({"host_gb": 1, "disk_dir": "/tmp/x", "disk_gb": -1}, "disk_gb"),
    ({"host_gb": 1, "disk_dir": "/tmp/x", "disk_blocks": -3}, "disk_blocks"),
    ({"disk_dir": "/tmp/x", "disk_gb": 2}, r"kv_offload.disk_gb=2.0 needs the host tier"),
    ({"host_gb": 1, "disk_gb": 2}, r"kv_offload.disk_gb=2.0 needs disk_dir"),
    ({"host_gb": 1, "disk_dir": "/tmp/x"}, r"kv_offload.disk_dir='/tmp/x' needs a size"),
])
def test_bad_disk_tier_config_is_refused_naming_the_value(bad, named):
    with pytest.raises(ValidationError, match=named):
        EngineConfig(kv_offload=bad)


def test_cli_flags_set_the_disk_tier(tmp_path, capsys):
    from cluster.cli import EXIT_BAD_INPUT, build_parser, engine_config_from_args, main

    args = build_parser().parse_args(["generate", "x", "--kv-host-gb", "0.5", "--kv-disk-dir", str(tmp_path),
                                      "--kv-disk-gb", "2"])
    off = engine_config_from_args(args).kv_offload
    assert (off.disk_dir, off.disk_gb, off.disk_enabled) == (str(tmp_path), 2.0, True)
    assert main(["generate", "x", "--kv-disk-dir", str(tmp_path), "--kv-disk-gb", "2"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "disk_gb=2.0 needs the host tier" in err and "--kv-host-gb" in err
    assert main(["generate", "x", "--kv-host-gb", "1", "--kv-disk-dir", str(tmp_path), "--kv-disk-gb", "-1"]) \
        == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "disk_gb" in err and "-1" in err
