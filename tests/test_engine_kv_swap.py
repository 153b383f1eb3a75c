"""Swap preemption end to end on the tiny model: a device pool small enough to preempt, greedy
output identical with preemption by swap, by recompute, auto, and with no preemption at all; the
preemption counter by mode; speculation (n-gram, EAGLE) keeps its per-sequence state across a swap;
bad input names the value."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig
from tests.test_engine_kv_offload import PROMPTS, _counting
from tests.tiny import TINY_MAX_TOKENS, random_eagle_head, tiny_engine

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)  # 4 sequences growing to ~16 blocks each in 24


@pytest.fixture(scope="module")
def baseline(tiny_target_dir) -> list[list[int]]:
    eng = tiny_engine(tiny_target_dir, num_kv_blocks=256)
    outs = eng.generate(PROMPTS, PARAMS, concurrency=4)
    assert eng.scheduler.num_preemptions == 0
    return [o.token_ids for o in outs]


def _swapping_engine(tiny_target_dir, mode: str, **kw):
    return tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload={"host_blocks": 64, "preemption": mode}, **kw)


def _assert_no_leak(eng, all_back: bool = True) -> None:
    a = eng.allocator
    assert not eng.has_unfinished() and a.num_free_blocks == a.num_blocks
    assert not a.swapped and a.host.num_held == 0
    a.check_invariants()
    stats = eng.kv.stats()
    if all_back:  # every swapped-out block came back
        assert stats["host_blocks_swapped_out"] == stats["host_blocks_swapped_in"]


def _preemptions(eng, mode: str) -> float:
    from tests.test_metrics import sample_value

    return sample_value(eng.metrics.snapshot(), "specray:num_preemptions_total", mode=mode)


@pytest.mark.parametrize("mode", ["swap", "recompute", "auto"])
def test_same_greedy_output_by_swap_recompute_and_auto(tiny_target_dir, baseline, mode):
    eng = _swapping_engine(tiny_target_dir, mode)
    assert [o.token_ids for o in eng.generate(PROMPTS, PARAMS, concurrency=4)] == baseline
    counts = eng.scheduler.preemptions
    assert eng.scheduler.num_preemptions > 0, "the pool was large enough: the test did not preempt"
    assert _preemptions(eng, "swap") == counts["swap"] and _preemptions(eng, "recompute") == counts["recompute"]
    if mode == "swap":
        assert counts["swap"] > 0 and eng.kv.stats()["host_blocks_swapped_in"] > 0
    if mode == "recompute":
        assert counts["swap"] == 0 and eng.kv.stats()["host_blocks_swapped_out"] == 0
    _assert_no_leak(eng)


def test_swap_computes_fewer_tokens_than_recompute(tiny_target_dir, baseline):
    """The point of swapping: a swapped-in sequence resumes where it stopped."""
    done = {}
    for mode in ("swap", "recompute"):
        eng = _swapping_engine(tiny_target_dir, mode, enable_prefix_caching=False)
        computed = _counting(eng)
        assert [o.token_ids for o in eng.generate(PROMPTS, PARAMS, concurrency=4)] == baseline
        done[mode] = computed[0], eng.scheduler.preemptions
    (swap_n, swap_counts), (rec_n, rec_counts) = done["swap"], done["recompute"]
    assert swap_counts["swap"] > 0 and rec_counts["recompute"] > 0
    assert swap_n < rec_n


def test_abort_while_swapped_out_leaks_nothing(tiny_target_dir, baseline):
    eng = _swapping_engine(tiny_target_dir, "swap")
    seqs = [eng.add_request(f"r{i}", p, PARAMS) for i, p in enumerate(PROMPTS)]
    for _ in range(200):
        eng.step()
        if eng.allocator.swapped:
            break
    (sid, *_) = eng.allocator.swapped
    victim = next(s for s in seqs if s.seq_id == sid)
    out = eng.abort(victim.request_id)
    assert out.finished and out.finish_reason == "abort" and not eng.allocator.is_swapped(sid)
    while eng.has_unfinished():
        eng.step()
    for s, want in zip(seqs, baseline):
        if s is not victim:
            assert s.token_ids[s.num_prompt_tokens:] == want
    _assert_no_leak(eng, all_back=False)


def test_swap_over_a_disk_tier_spills_cache_entries_not_swapped_blocks(tiny_target_dir, baseline, tmp_path):
    """A small host tier: swap-outs make room by spilling the host's cache entries to disk (SPILL
    before the EVICT that refills the slot, executed by the real pools); outputs still match."""
    eng = tiny_engine(tiny_target_dir, num_kv_blocks=24, kv_offload={
        "host_blocks": 16, "disk_dir": str(tmp_path / "kv"), "disk_blocks": 64, "preemption": "swap"})
    try:
        for _ in range(2):
            assert [o.token_ids for o in eng.generate(PROMPTS, PARAMS, concurrency=4)] == baseline
        stats = eng.kv.stats()
        assert eng.scheduler.preemptions["swap"] > 0 and stats["disk_blocks_evicted"] > 0
        _assert_no_leak(eng)
    finally:
        eng.shutdown()


def test_swap_with_ngram_drafts_stays_lossless(tiny_target_dir, baseline):
    eng = _swapping_engine(tiny_target_dir, "swap", draft="ngram")
    assert [o.token_ids for o in eng.generate(PROMPTS, PARAMS, concurrency=4)] == baseline
    assert eng.scheduler.preemptions["swap"] > 0
    _assert_no_leak(eng)


def test_eagle_state_continues_across_a_swap(tiny_target_dir, tiny_prompts, tiny_baseline, tmp_path):
    """A swapped-out sequence keeps its EAGLE head state (its KV comes back, so the target never
    re-observes its context): every feature the head observes continues the sequence's state."""
    from actors.model.loader import load_model

    path = random_eagle_head(load_model(tiny_target_dir).model, 128, tmp_path / "tiny.safetensors")
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=3, num_kv_blocks=24, max_model_len=64,
                      max_num_batched_tokens=16, kv_offload={"host_blocks": 64, "preemption": "swap"})
    head, gaps = eng.proposer, []
    observe = head.observe

    def checked(seq_id, start, features):
        st = head.states.get(seq_id)
        if st is not None and start != st.next_pos:
            gaps.append((seq_id, st.next_pos, start))
        observe(seq_id, start, features)

    head.observe = checked
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    assert [o.token_ids for o in eng.generate(tiny_prompts, params)] == tiny_baseline
    assert eng.scheduler.preemptions["swap"] > 0 and not gaps
    assert not head.states  # released when each request finished
    _assert_no_leak(eng)


# ---- bad input ----------------------------------------------------------------------------------
def test_swap_without_a_host_tier_is_refused():
    with pytest.raises(ValidationError, match=r"kv_offload.preemption='swap' needs the host tier"):
        EngineConfig(kv_offload={"preemption": "swap"})
    EngineConfig(kv_offload={"preemption": "auto"})  # auto and recompute need none
    EngineConfig(kv_offload={"preemption": "recompute"})


def test_unknown_preemption_mode_is_refused_naming_it():
    with pytest.raises(ValidationError, match=r"kv_offload.preemption='sideways' is not a preemption mode"):
        EngineConfig(kv_offload={"host_blocks": 4, "preemption": "sideways"})


def test_cli_flag_sets_preemption_and_bad_values_name_themselves(capsys):
    from cluster.cli import EXIT_BAD_INPUT, build_parser, engine_config_from_args, main

    args = build_parser().parse_args(["generate", "x", "--kv-host-gb", "0.5", "--kv-preemption", "swap"])
    assert engine_config_from_args(args).kv_offload.preemption == "swap"
    args = build_parser().parse_args(["generate", "x"])
    assert engine_config_from_args(args).kv_offload.preemption == "auto"
    assert main(["generate", "x", "--kv-preemption", "swap"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "preemption='swap' needs the host tier" in err and "--kv-host-gb" in err
    assert main(["generate", "x", "--kv-host-gb", "0.5", "--kv-preemption", "sideways"]) == EXIT_BAD_INPUT
    assert "'sideways' is not a preemption mode" in capsys.readouterr().err
