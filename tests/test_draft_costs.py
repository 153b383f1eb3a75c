"""What the adaptive policy learns a draft costs (cluster/drafting.py): a feature-reading head's catch-up
on a long backlog is paid once, not charged to every round of its later drafts."""
from __future__ import annotations

import pytest

from actors.spec_policy import SpecPolicy
from cluster.drafting import steady_draft_s


def test_a_long_catch_up_counts_as_one_round_of_the_draft():
    """A head that did not draft for a while (or has just seen its prompt) first feeds the backlog
    of committed positions: paid once, not by every later draft. Up to one round's cost it stays."""
    assert steady_draft_s(0.010, 0.0, 4) == pytest.approx(0.010)  # no catch-up (lookup, a draft model)
    assert steady_draft_s(0.010, 0.002, 4) == pytest.approx(0.010)  # a step's own: at most a round
    assert steady_draft_s(0.060, 0.056, 4) == pytest.approx(0.004 + 0.001)  # a prompt's: one round
    assert steady_draft_s(0.010, 0.010, 1) == pytest.approx(0.0)  # nothing but catch-up: no rounds to go by
    assert steady_draft_s(0.010, 0.020, 2) == pytest.approx(0.0)  # a clock that ran backwards caps at draft_s


def test_a_steady_catch_up_is_charged_in_full():
    """A sequence drafting every step catches up on one step's commits each time: that is the head's
    forward for the first depth, paid every step (a depth-1 draft is nothing else)."""
    assert steady_draft_s(0.010, 0.010, 1, steady=True) == pytest.approx(0.010)
    assert steady_draft_s(0.060, 0.056, 4, steady=True) == pytest.approx(0.060)


SLEEP = 1.0  # seconds a long backlog's catch-up takes in the test below


@pytest.mark.parametrize("lookup_first", [False, True])
def test_the_heads_backlog_is_not_charged_to_its_draft_rounds(lookup_first, tiny_target_dir, tiny_prompts, tmp_path):
    """An engine whose EAGLE head catches up slowly on long backlogs (a sleep stands in for the work):
    what the adaptive policy learns a head draft costs per round stays at what its rounds cost.
    Charged in full, the backlog made the head look several times dearer than it is, and the policy
    stopped drafting with it (2026-11-28, the default model at c=1). The sleep is long beside a tiny
    model's round, so that a busy machine (a tiny round at tens of ms) cannot reach the bound: charged
    in full, a round would cost at least SLEEP / K."""
    import time

    from actors.model.loader import load_model
    from actors.sampling_params import SamplingParams
    from tests.tiny import TINY_MAX_TOKENS, random_eagle_head, tiny_engine

    model = load_model(tiny_target_dir).model
    path = random_eagle_head(model, 128, tmp_path / "tiny.safetensors", seed=1)
    policy = SpecPolicy(max_depth=3, explore_every=1)  # a random head: only explorations draft, each step
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=3, adaptive=True, lookup_first=lookup_first,
                      spec_policy=policy)
    head = eng.proposer.second if lookup_first else eng.proposer
    catch_up, backlogs, learned = head._catch_up, [], []

    def slow_backlog(reqs):
        n = sum(len(p) for r in reqs for p in head.states[r.seq_id].pending)
        backlogs.append(n)
        if n > 8:
            time.sleep(SLEEP)
        return catch_up(reqs)

    observe = policy.observe_draft

    def recording(num_seqs, depth, seconds, sources=frozenset()):
        if head.name in sources:
            learned.append(seconds / depth)
        return observe(num_seqs, depth, seconds, sources)

    head._catch_up, policy.observe_draft = slow_backlog, recording
    eng.generate(tiny_prompts[:3], SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=1)
    assert max(backlogs) > 8 and min(backlogs) <= 8, backlogs  # prompts and steady steps both caught up
    assert len(learned) >= 10 and max(learned) < SLEEP / 4, learned


def test_a_depth_one_draft_pays_its_steady_catch_up(tiny_target_dir, tiny_prompts, tmp_path):
    """K=1 EAGLE drafts, every step: each catch-up feeds only the previous step's commits and is the
    whole draft; the policy learns what it costs (a sleep stands in for the work), not ~0."""
    import time

    from actors.model.loader import load_model
    from actors.sampling_params import SamplingParams
    from tests.tiny import TINY_MAX_TOKENS, random_eagle_head, tiny_engine

    model = load_model(tiny_target_dir).model
    path = random_eagle_head(model, 128, tmp_path / "tiny.safetensors", seed=1)
    policy = SpecPolicy(max_depth=1, explore_every=1)  # every step explores: drafts at depth 1 each step
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=1, adaptive=True, spec_policy=policy)
    head, learned, steady = eng.proposer, [], []
    catch_up = head._catch_up

    def slow(reqs):
        n = sum(head.states[r.seq_id].num_pending for r in reqs)
        steady.append(n <= 2)
        time.sleep(0.02)
        return catch_up(reqs)

    observe = policy.observe_draft

    def recording(num_seqs, depth, seconds, sources=frozenset()):
        learned.append((steady[-1], seconds / depth))
        return observe(num_seqs, depth, seconds, sources)

    head._catch_up, policy.observe_draft = slow, recording
    eng.generate(tiny_prompts[:2], SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True), concurrency=1)
    charged = [s for st, s in learned if st]
    assert len(charged) >= 5 and min(charged) >= 0.02, learned
