"""The tensor-parallel verifier as Ray actors (gloo on CPU): token-identical greedy output to the
in-process TP=1 engine (tiny models at tp=2; the default model at tp=3, since its 3 KV heads rule out
tp=2), per-rank parameter bytes ~1/tp, two groups on one host, a killed rank failing fast and a
restart recovering, bad TP sizes and unsatisfiable placement groups failing with clear errors."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from actors.sampling_params import SamplingParams
from actors.verifier import SeqChunk
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from cluster.shard_group import ShardGroup, VerifierGroupError
from cluster.topology import PlacementError, ReplicaTopology, create_placement_group
from tests.tiny import TINY_MAX_TOKENS, _load

TINY_TOKENS = TINY_MAX_TOKENS  # the shared baseline's length
TINY_BLOCKS, TINY_BS = 256, 4
CHAT_TOKENS, CHAT_PROMPTS = 16, 3
DEFAULT_BLOCKS, DEFAULT_BS = 64, 16
TIMEOUT_S = 30.0


def _tiny_group(tiny_target_dir, compiled: bool | None = None) -> ShardGroup:
    return ShardGroup.create(str(tiny_target_dir), 2, TINY_BLOCKS, TINY_BS, timeout_s=TIMEOUT_S, compiled=compiled)


@pytest.fixture(scope="module")
def tiny_group(ray_cluster, tiny_target_dir):
    group = _tiny_group(tiny_target_dir)
    yield group
    group.shutdown()


def _engine_on(group: ShardGroup, model_dir, draft: str = "none", k: int = 4) -> LLMEngine:
    config = EngineConfig(model=str(model_dir), speculative=SpeculativeConfig.from_draft_arg(draft, k, adaptive=False),
                          num_threads=1, block_size=TINY_BS, num_kv_blocks=TINY_BLOCKS)
    return LLMEngine(config, loaded=_load(str(model_dir)), verifier=group)


def _generate(eng: LLMEngine, tiny_prompts) -> list:
    return eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_TOKENS, ignore_eos=True), concurrency=8)


@pytest.mark.ray
@pytest.mark.parametrize("draft", ["none", "ngram", "layerskip:1"])
def test_tp2_tiny_is_token_identical_to_tp1(draft, tiny_group, tiny_target_dir, tiny_prompts, tiny_baseline):
    eng = _engine_on(tiny_group, tiny_target_dir, draft, k=3)
    outs = _generate(eng, tiny_prompts)
    assert [o.token_ids for o in outs] == tiny_baseline
    if draft != "none":
        assert sum(o.num_draft_tokens for o in outs) > 0, "speculation never ran"
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    assert tiny_group.step_stats.steps > 0 and tiny_group.stats()["overhead_fraction"] < 1


@pytest.mark.ray
def test_tp2_per_rank_parameter_bytes_are_about_half(tiny_group, tiny_target_dir):
    full = _load(str(tiny_target_dir)).model.param_bytes()
    per_rank = tiny_group.param_bytes()
    assert len(per_rank) == 2
    for b in per_rank:
        assert 0.4 <= b / full <= 0.65, (b, full)
    assert [i["kv_heads_per_rank"] for i in tiny_group.rank_info] == [1, 1]  # KV cache split by heads
    # each rank's process moved what it loaded out of the garbage collector's full passes
    assert all(i["gc_frozen_objects"] > 10_000 for i in tiny_group.rank_info), tiny_group.rank_info


@pytest.mark.ray
def test_bad_step_is_rejected_and_group_still_works(tiny_group):
    with pytest.raises(ValueError, match="slot 4096 is outside"):
        tiny_group.forward_logits([SeqChunk([3], [0], [4096], 1, [0])], [0])
    with pytest.raises(ValueError, match="slot -1 is outside"):
        tiny_group.copy_slots([-1], [0])
    assert tiny_group.forward_logits([SeqChunk([3, 4], [0, 1], [0, 1], 2, [0])], [1]).shape == (1, 256)


@pytest.mark.ray
def test_idle_group_outlives_its_collective_timeout(ray_cluster, tiny_target_dir):
    """Idle ranks wait in a collective with a timeout; rank 0's heartbeat keeps them alive."""
    group = ShardGroup.create(str(tiny_target_dir), 2, TINY_BLOCKS, TINY_BS, timeout_s=2)
    try:
        chunk = [SeqChunk([3, 4], [0, 1], [0, 1], 2, [0])]
        first = group.forward_logits(chunk, [1])
        time.sleep(5)
        assert (group.forward_logits(chunk, [1]) - first).abs().max() < 1e-5
    finally:
        group.shutdown()


@pytest.mark.ray
def test_two_groups_on_one_host(tiny_group, tiny_target_dir, tiny_prompts, tiny_baseline):
    other = _tiny_group(tiny_target_dir, compiled=True)  # a Ray compiled graph; tiny_group uses plain actor calls
    try:
        assert other.is_compiled and not tiny_group.is_compiled
        assert other.rank_info[0]["address"] != tiny_group.rank_info[0]["address"]
        engines = [_engine_on(tiny_group, tiny_target_dir, "ngram"), _engine_on(other, tiny_target_dir)]
        params = SamplingParams(max_tokens=TINY_TOKENS, ignore_eos=True)
        for e, eng in enumerate(engines):
            for i, p in enumerate(tiny_prompts):
                eng.add_request(f"g{e}-{i}", p, params)
        done: list[dict] = [{}, {}]
        while any(eng.has_unfinished() for eng in engines):  # interleave the two groups' steps
            for e, eng in enumerate(engines):
                done[e].update({o.request_id: o.token_ids for o in eng.step() if o.finished})
        for e in range(2):
            assert [done[e][f"g{e}-{i}"] for i in range(len(tiny_prompts))] == tiny_baseline
    finally:
        other.shutdown()


def _kill_and_wait(actor) -> None:
    """ray.kill is asynchronous: a call sent right after it may still be answered, so poll until
    the actor is really gone."""
    import ray

    ray.kill(actor)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=TIMEOUT_S)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    pytest.fail(f"actor still answers {TIMEOUT_S:g} s after ray.kill")


@pytest.mark.ray
def test_killed_rank_mid_generation_restarts_group_without_loss(ray_cluster, tiny_target_dir, tiny_prompts, tiny_baseline):
    """The engine restarts the group and re-queues from committed tokens: streams equal TP=1."""
    group = _tiny_group(tiny_target_dir)
    try:
        eng = _engine_on(group, tiny_target_dir, "ngram")
        params = SamplingParams(max_tokens=TINY_TOKENS, ignore_eos=True)
        for i, p in enumerate(tiny_prompts):
            eng.add_request(f"k{i}", p, params)
        streamed: dict[str, list[int]] = {}
        slowest, step = 0.0, 0
        while eng.has_unfinished():
            if step == 4:
                _kill_and_wait(group.actors[1])
            t0 = time.monotonic()
            for o in eng.step():
                streamed.setdefault(o.request_id, []).extend(o.delta_token_ids)
            slowest, step = max(slowest, time.monotonic() - t0), step + 1
        assert group.epoch == 1 and eng.num_verifier_restarts == 1
        assert slowest < 60
        assert [streamed[f"k{i}"] for i in range(len(tiny_prompts))] == tiny_baseline  # nothing lost or repeated
        assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    finally:
        group.shutdown()


@pytest.mark.ray
def test_killed_rank0_raises_group_error_fast_and_restart_recovers(ray_cluster, tiny_target_dir):
    group = _tiny_group(tiny_target_dir, compiled=True)
    try:
        chunk = [SeqChunk([3, 4, 5], [0, 1, 2], [0, 1, 2], 3, [0])]
        before = group.forward_logits(chunk, [2])
        _kill_and_wait(group.actors[0])
        t0 = time.monotonic()
        with pytest.raises(VerifierGroupError, match=r"tp=2, epoch 0\) failed: .*call restart"):
            group.forward_logits(chunk, [2])
        assert time.monotonic() - t0 < 60
        with pytest.raises(VerifierGroupError, match="unusable"):  # stays failed until restart()
            group.forward_logits(chunk, [2])
        old = group.rank_info[0]["address"]
        group.restart()
        assert group.epoch == 1 and group.rank_info[0]["address"] != old and group.is_compiled
        assert (group.forward_logits(chunk, [2]) - before).abs().max() < 1e-5
    finally:
        group.shutdown()


@pytest.mark.ray
def test_unsatisfiable_placement_fails_after_bounded_wait(ray_cluster, tiny_target_dir):
    from ray.util import placement_group_table

    t0 = time.monotonic()
    with pytest.raises(PlacementError, match=r"tp=4 needs 4 GPUs .*in one node.*the cluster has 0 GPUs"):
        create_placement_group(ReplicaTopology(tp_size=4, use_gpu=True), name="too-big", timeout_s=2)
    assert time.monotonic() - t0 < 15
    assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values() if pg["name"] == "too-big")
    with pytest.raises(PlacementError, match="tp=2 needs 2 GPUs"):  # a CUDA group on a CPU-only cluster
        ShardGroup.create(str(tiny_target_dir), 2, TINY_BLOCKS, TINY_BS, device="cuda", timeout_s=2)


def test_tp_not_dividing_kv_heads_is_rejected(tiny_target_dir):
    with pytest.raises(ValueError, match=r"tp=3 exceeds num_kv_heads=2"):
        ShardGroup.create(str(tiny_target_dir), 3, TINY_BLOCKS, TINY_BS)


# ---- the default model (SmolLM2-135M: 9 heads, 3 KV heads -> tp=3) ---------------------------------

@pytest.mark.model
def test_default_model_rejects_tp2(default_model_dir):
    with pytest.raises(ValueError, match=r"tp=2 does not divide num_kv_heads=3.*use tp in \[1, 3\]"):
        ShardGroup.create(str(default_model_dir), 2, DEFAULT_BLOCKS, DEFAULT_BS)


@pytest.fixture(scope="module")
def chat_prompts():
    path = Path(__file__).parent.parent / "benchmarks" / "prompts" / "chat20.jsonl"
    return [json.loads(line)["messages"] for line in path.read_text().splitlines()[:CHAT_PROMPTS]]


def _default_engine(default_model, draft: str = "none", verifier=None) -> LLMEngine:
    config = EngineConfig(speculative=SpeculativeConfig.from_draft_arg(draft, 4, adaptive=False), num_kv_blocks=DEFAULT_BLOCKS,
                          block_size=DEFAULT_BS, num_threads=2)
    return LLMEngine(config, loaded=default_model, verifier=verifier)


@pytest.fixture(scope="module")
def default_group(ray_cluster, default_model_dir):
    group = ShardGroup.create(str(default_model_dir), 3, DEFAULT_BLOCKS, DEFAULT_BS, timeout_s=120)
    yield group
    group.shutdown()


@pytest.mark.ray
@pytest.mark.model
def test_tp3_default_model_is_token_identical_to_tp1(default_model, default_group, chat_prompts):
    params = SamplingParams(max_tokens=CHAT_TOKENS)
    want = [o.token_ids for o in _default_engine(default_model).generate(chat_prompts, params, chat=True)]
    for draft in ("none", "ngram"):
        eng = _default_engine(default_model, draft, verifier=default_group)
        outs = eng.generate(chat_prompts, params, chat=True)
        assert [o.token_ids for o in outs] == want, draft
    full = default_model.model.param_bytes()
    assert all(0.3 <= b / full <= 0.4 for b in default_group.param_bytes())  # ~1/3 per rank


def test_tp2_with_two_merged_drafter_workers_is_lossless(tiny_group, tiny_target_dir, tiny_model_dir, tiny_prompts,
                                                          tiny_baseline):
    """TP=2 verification + two drafter actors (n-gram and a draft model) whose trees are merged."""
    from actors.proposers.worker import DrafterSpec
    from actors.proposers.remote import RemoteProposer

    draft_dir = tiny_model_dir("llama", seed=1, num_hidden_layers=1, tie_word_embeddings=False)
    rp = RemoteProposer([DrafterSpec("ngram", block_size=TINY_BS),
                         DrafterSpec("draft", draft_model=str(draft_dir), block_size=TINY_BS)])
    try:
        spec = SpeculativeConfig(method="ngram", num_spec_tokens=4, adaptive=False)  # draft every step
        config = EngineConfig(model=str(tiny_target_dir), speculative=spec, num_threads=1, block_size=TINY_BS,
                              num_kv_blocks=TINY_BLOCKS)
        eng = LLMEngine(config, loaded=_load(str(tiny_target_dir)), verifier=tiny_group, proposer=rp)
        outs = eng.generate(tiny_prompts, SamplingParams(max_tokens=TINY_TOKENS, ignore_eos=True), concurrency=8)
        assert [o.token_ids for o in outs] == tiny_baseline
        assert sum(o.num_draft_tokens for o in outs) > 0 and eng.num_proposer_failures == 0
    finally:
        rp.shutdown()
