"""Drafter workers as Ray actors: merged proposals stay lossless, overlapped micro-batches stay
lossless, dead / slow drafters are replaced while requests finish unchanged, bad specs fail clearly,
and two proposers on one host keep to themselves. The first tests run the worker in-process."""
from __future__ import annotations

import re

import pytest
import torch

from actors.proposers.worker import DraftCall, DrafterSpec, DrafterWorker
from actors.sampling_params import SamplingParams
from tests.tiny import TINY_MAX_TOKENS, tiny_engine

MAX_TOKENS = TINY_MAX_TOKENS  # the shared baseline's length
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def _ids(outs):
    return [o.token_ids for o in outs]


def _specs(tiny_draft_dir, *methods):
    return [DrafterSpec("ngram") if m == "ngram" else DrafterSpec("draft", draft_model=str(tiny_draft_dir), block_size=4)
            for m in methods]


def _engine(tiny_target_dir, proposer):
    """An engine whose speculation budget comes from a k=4 chain and whose proposer is ``proposer``."""
    eng = tiny_engine(tiny_target_dir, draft="ngram", k=4)
    eng.drafting.proposer = proposer
    return eng


def _run_killing(eng, tiny_prompts, kill_at: dict):
    """Step the engine by hand; kill_at: step number -> callable run before that step."""
    for i, p in enumerate(tiny_prompts):
        eng.add_request(f"r{i}", p, GREEDY)
    done, step = {}, 0
    while eng.has_unfinished():
        if step in kill_at:
            kill_at[step]()
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.token_ids
        step += 1
    return [done[f"r{i}"] for i in range(len(tiny_prompts))]


def _assert_workers_clean(proposer):
    proposer.flush()
    for info in proposer.ping():
        assert info["num_sequences"] == 0, info
        assert info["free_blocks"] in (None, 256), info  # the draft model's KV blocks all back


# ---- in-process worker ------------------------------------------------------------------
def test_spec_validation_names_the_problem():
    with pytest.raises(ValueError, match="layerskip.*beside the verifier"):
        DrafterSpec("layerskip")
    with pytest.raises(ValueError, match="'draft' needs draft_model"):
        DrafterSpec("draft")
    with pytest.raises(ValueError, match="'medusa' is not one of"):
        DrafterSpec("medusa")
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        DrafterSpec("ngram", dtype="fp8")


def test_worker_keeps_history_and_asks_for_resend(tiny_draft_dir):
    w = DrafterWorker(DrafterSpec("ngram"))
    toks = [5, 6, 7, 8, 5, 6, 7]
    reply = w.propose([DraftCall(1, 0, toks, [1, 1], 2, SamplingParams())])
    assert reply.trees[0].tokens == [7, 8, 5] and not reply.resend
    reply = w.propose([DraftCall(1, 7, [8], [1, 1], 2, SamplingParams())])  # only the new token
    assert w.history[1] == toks + [8] and reply.trees[0].tokens == [8, 5, 6]
    reply = w.propose([DraftCall(2, 5, [9, 9], [1], 1, SamplingParams())])  # unknown history
    assert reply.resend == [2] and reply.trees[0].tokens == [9]
    w.propose([], released=[1])
    assert w.history == {}


def test_worker_sampling_is_seeded_and_returns_q(tiny_draft_dir):
    """Unseeded requests draw from the worker seed; seeded ones from the request's (seed, position) race."""
    w = DrafterWorker(_specs(tiny_draft_dir, "draft")[0])
    unseeded, seeded = SamplingParams(temperature=0.9), SamplingParams(temperature=0.9, seed=1)
    call = lambda sid, seed, params=unseeded: DraftCall(sid, 0, [5, 6, 7, 8], [1, 2], 3, params, seed)  # noqa: E731
    a, b, c = (w.propose([call(i, s)]).trees[0] for i, s in ((1, 11), (2, 11), (3, 12)))
    assert a.tokens == b.tokens and a.num_draft_tokens == 3
    for node in range(1, a.size):  # each draft token was drawn from the q sent back with it
        q = a.draft_probs[node]
        assert q.shape == (256,) and torch.isclose(q.sum(), torch.tensor(1.0)) and q[a.tokens[node]] > 0
    assert c.tokens != a.tokens  # another worker seed, another draw
    d, e = (w.propose([call(i, s, seeded)]).trees[0] for i, s in ((4, 11), (5, 12)))
    assert d.tokens == e.tokens  # the request's seed decides, not the worker's
    f = w.propose([call(6, 11, seeded.model_copy(update={"seed": 2}))]).trees[0]
    assert f.tokens != d.tokens


def test_build_checks_the_draft_on_the_driver_first(tiny_target_dir, tiny_draft_dir, tmp_path):
    """Bad draft models fail before any worker starts (no Ray needed to see the error)."""
    from cluster.config import SpeculativeConfig
    from cluster.proposers import build_remote_proposer

    eng = tiny_engine(tiny_target_dir)
    missing = str(tmp_path / "missing-draft")
    with pytest.raises(ValueError, match=re.escape(repr(missing))):
        build_remote_proposer(SpeculativeConfig(method="draft", draft_model=missing), eng.proposer_context())
    with pytest.raises(ValueError, match="has no tokenizer files"):
        build_remote_proposer(SpeculativeConfig(method="draft", draft_model=str(tiny_draft_dir)), eng.proposer_context())

    class Wide(type(eng.tokenizer)):
        def __len__(self):
            return 512

    with pytest.raises(ValueError, match="different tokenizer: vocab size 512"):
        build_remote_proposer(SpeculativeConfig(method="draft", draft_model=str(tiny_draft_dir)), eng.proposer_context(),
                              draft_tokenizer=Wide())


# ---- Ray actors -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def merged(ray_cluster, tiny_target_dir, tiny_draft_dir):
    """ngram + draft-model workers, built as the engine would (driver-side tokenizer check first)."""
    from cluster.config import SpeculativeConfig
    from cluster.proposers import build_remote_proposer

    eng = tiny_engine(tiny_target_dir, num_kv_blocks=256)
    spec = SpeculativeConfig(method="draft", draft_model=str(tiny_draft_dir), num_spec_tokens=4)
    rp = build_remote_proposer(spec, eng.proposer_context(), ["ngram", "draft"], draft_tokenizer=eng.tokenizer)
    assert [(s.spec.method, s.spec.draft_model, s.spec.block_size) for s in rp.slots] == [
        ("ngram", None, 4), ("draft", str(tiny_draft_dir), 4)]
    yield rp
    rp.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize("concurrency", [1, 8])
def test_two_merged_workers_are_lossless(concurrency, merged, tiny_target_dir, tiny_prompts, tiny_baseline):
    eng = _engine(tiny_target_dir, merged)
    outs = eng.generate(tiny_prompts, GREEDY, concurrency=concurrency)
    assert _ids(outs) == tiny_baseline
    assert sum(o.num_draft_tokens for o in outs) > 0, "speculation never ran"
    assert eng.num_proposer_failures == 0 and merged.num_restarts == 0
    assert all(info["num_calls"] > 0 for info in merged.ping()), "a worker never drafted"
    # a worker actor's process moved what it loaded out of the garbage collector's full passes
    assert all(info["gc_frozen_objects"] > 10_000 for info in merged.ping())
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    _assert_workers_clean(merged)


@pytest.mark.ray
def test_overlapped_micro_batches_are_lossless(merged, tiny_target_dir, tiny_prompts, tiny_baseline):
    eng = _engine(tiny_target_dir, merged)
    stepper = eng.set_draft_overlap(2)
    outs = eng.generate(tiny_prompts, GREEDY)
    assert _ids(outs) == tiny_baseline
    assert sum(o.num_draft_tokens for o in outs) > 0
    assert max(len(t.micro) for t in stepper.timings) == 2
    assert all(m.draft_compute_s >= 0 and m.verify_s > 0 for t in stepper.timings for m in t.micro)
    _assert_workers_clean(merged)
    # the same through the engine's own config knob
    from cluster.engine import LLMEngine

    knob = eng.config.model_copy(update={"draft_overlap_micro_batches": 2})
    eng2 = LLMEngine(knob, loaded=eng.loaded, proposer=merged)
    assert _ids(eng2.generate(tiny_prompts, GREEDY)) == tiny_baseline
    assert max(len(t.micro) for t in eng2.overlap.timings) == 2
    _assert_workers_clean(merged)


@pytest.mark.ray
def test_overlapped_steps_run_the_adaptive_policy(merged, tiny_target_dir, tiny_prompts, tiny_baseline):
    """Overlap is only the verification half of the engine's step: the policy begins every step
    (its per-step memo stays one step's worth), learns verify and draft costs per micro-batch and
    chooses the depths the workers draft."""
    eng = tiny_engine(tiny_target_dir, draft="ngram", k=4, adaptive=True)
    eng.drafting.proposer = merged
    stepper = eng.set_draft_overlap(2)
    policy, steps, seen = eng.spec_policy, [], []
    begin = policy.begin_step
    policy.begin_step = lambda: (steps.append(1), seen.append(len(eng.drafting.sources)), begin())[-1]
    outs = eng.generate(tiny_prompts, GREEDY, concurrency=4)
    assert _ids(outs) == tiny_baseline
    assert len(steps) >= len(stepper.timings) > 0
    assert max(seen) <= 4, "the draft-source memo outlived its step"
    assert policy.verify_cost.measured and policy.draft_cost.measured
    assert sum(o.num_draft_tokens for o in outs) > 0
    _assert_workers_clean(merged)


@pytest.mark.ray
def test_sampling_through_workers_is_reproducible(merged, tiny_target_dir, tiny_prompts):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=7, ignore_eos=True)
    a = _engine(tiny_target_dir, merged).generate(tiny_prompts[:3], params)
    b = _engine(tiny_target_dir, merged).generate(tiny_prompts[:3], params, concurrency=1)
    c = _engine(tiny_target_dir, merged).generate(tiny_prompts[:3], params.model_copy(update={"seed": 8}))
    assert _ids(a) == _ids(b) != _ids(c)
    assert sum(o.num_draft_tokens for o in a) > 0


@pytest.mark.ray
def test_killing_one_drafter_mid_generation(ray_cluster, tiny_target_dir, tiny_draft_dir, tiny_prompts, tiny_baseline):
    from actors.proposers.remote import RemoteProposer

    rp = RemoteProposer(_specs(tiny_draft_dir, "ngram", "draft"))
    try:
        victim = rp.handles()[1]
        eng = _engine(tiny_target_dir, rp)
        assert _run_killing(eng, tiny_prompts, {3: lambda: ray_cluster.kill(victim)}) == tiny_baseline
        assert rp.num_restarts == 1 and eng.num_proposer_failures == 0  # the n-gram worker kept answering
        assert rp.wait_ready(60) and rp.num_live == 2 and rp.handles()[1] is not victim
        outs = _engine(tiny_target_dir, rp).generate(tiny_prompts[:2], GREEDY)  # the replacement drafts again
        assert _ids(outs) == tiny_baseline[:2] and rp.num_failed_steps == 0
    finally:
        rp.shutdown()


@pytest.mark.ray
def test_killing_all_drafters_and_a_missed_deadline(ray_cluster, tiny_target_dir, tiny_draft_dir, tiny_prompts, tiny_baseline):
    from actors.proposers.remote import RemoteProposer

    rp = RemoteProposer(_specs(tiny_draft_dir, "ngram", "draft"))
    try:
        def kill_all():
            for h in rp.handles():
                ray_cluster.kill(h)

        eng = _engine(tiny_target_dir, rp)
        assert _run_killing(eng, tiny_prompts, {2: kill_all}) == tiny_baseline
        assert rp.num_restarts == 2 and eng.num_proposer_failures > 0  # steps decoded plainly
        assert rp.wait_ready(60) and rp.num_live == 2
        rp.timeout_s = 0.0  # every answer now misses its deadline: the workers are killed and replaced
        eng = _engine(tiny_target_dir, rp)
        assert _ids(eng.generate(tiny_prompts[:2], GREEDY)) == tiny_baseline[:2]
        assert rp.num_timeouts >= 2 and rp.num_restarts >= 4
    finally:
        rp.shutdown()


@pytest.mark.ray
def test_bad_draft_model_fails_at_construction(ray_cluster, tmp_path):
    """The worker's own load error comes back at construction, naming the slot and the path."""
    from actors.proposers.remote import RemoteProposer

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=re.escape(f"drafter 1 (draft({broken})) failed to start") +
                       ".*cannot load draft model .*no \\*.safetensors"):
        RemoteProposer([DrafterSpec("ngram"), DrafterSpec("draft", draft_model=str(broken))])


@pytest.mark.ray
def test_two_proposers_on_one_host_do_not_interfere(ray_cluster, merged, tiny_target_dir, tiny_draft_dir, tiny_prompts, tiny_baseline):
    from actors.proposers.remote import RemoteProposer

    other = RemoteProposer(_specs(tiny_draft_dir, "draft"))
    try:
        restarts = merged.num_restarts
        a, b = _engine(tiny_target_dir, merged), _engine(tiny_target_dir, other)
        for i, p in enumerate(tiny_prompts[:4]):
            a.add_request(f"a{i}", p, GREEDY)
            b.add_request(f"b{i}", p, GREEDY)
        done, step = {}, 0
        while a.has_unfinished() or b.has_unfinished():
            if step == 3:
                ray_cluster.kill(other.handles()[0])
            for o in a.step() + b.step():  # interleaved steps, same seq-id space, separate workers
                if o.finished:
                    done[o.request_id] = o.token_ids
            step += 1
        assert [done[f"a{i}"] for i in range(4)] == [done[f"b{i}"] for i in range(4)] == tiny_baseline[:4]
        assert other.num_restarts == 1 and merged.num_restarts == restarts and a.num_proposer_failures == 0
        pids = {i["pid"] for i in merged.ping()}
        assert other.wait_ready(60) and not pids & {i["pid"] for i in other.ping()}
    finally:
        other.shutdown()
