"""Scheduler policy (no model needed) and the n-gram proposer."""
from __future__ import annotations

import pytest

from actors.proposers.base import DraftRequest, Proposer
from actors.proposers.combined import FallbackProposer, MergedProposer
from actors.proposers.ngram import NgramProposer
from actors.kv_service import KVService
from actors.sampling_params import SamplingParams
from actors.scheduler import BatchScheduler
from actors.sequence import Sequence
from actors.tree import TokenTree


def _seqs(n, length=10):
    return [Sequence(f"r{i}", list(range(10 * i + 3, 10 * i + 3 + length)), SamplingParams()) for i in range(n)]


def _finish_prefill(sched, spec=0):
    """Pretend the model ran: computed tokens advance, a prefill that completes samples token 7."""
    out = sched.schedule({s.seq_id: spec for s in sched.running})
    for s in out.scheduled:
        s.seq.num_computed += s.num_query
        if s.seq.num_computed == s.seq.num_tokens:
            s.seq.token_ids.append(7)
    return out


def test_max_num_seqs_and_token_budget():
    sched = BatchScheduler(KVService(64, 4), max_num_seqs=2, max_num_batched_tokens=16, block_size=4)
    for s in _seqs(4):
        sched.add(s)
    out = _finish_prefill(sched)
    assert sched.num_running == 2 and sched.num_waiting == 2
    assert out.num_tokens <= 16
    assert [s.num_query for s in out.scheduled] == [10, 6]  # second prompt chunked to the budget


def test_decode_gets_spec_slots_then_shrinks_when_blocks_run_out():
    sched = BatchScheduler(KVService(6, 4), max_num_seqs=4, max_num_batched_tokens=64, block_size=4)  # 24 slots
    a, b = _seqs(2, length=8)
    sched.add(a)
    sched.add(b)
    _finish_prefill(sched)  # each: 8 computed + 1 sampled = 9 tokens -> 3 blocks each, pool full
    out = sched.schedule({s.seq_id: 5 for s in sched.running})
    # a wants 8 + 1 + 5 = 14 slots (4 blocks): no room, so speculation is dropped, then b is preempted
    assert out.preempted == [b]
    assert [(s.seq, s.num_spec) for s in out.scheduled] == [(a, 5)]
    assert b.num_computed == 0 and b.num_preemptions == 1 and sched.waiting[0] is b


def test_abort_while_waiting_and_running_frees_blocks():
    kv = KVService(32, 4)
    sched = BatchScheduler(kv, max_num_seqs=1, max_num_batched_tokens=64, block_size=4)
    a, b = _seqs(2)
    sched.add(a)
    sched.add(b)
    _finish_prefill(sched)
    sched.remove(b)  # waiting
    sched.remove(a)  # running
    assert not sched.has_unfinished() and kv.allocator.num_free_blocks == 32


def _req(tokens, expansion, max_nodes=None):
    return DraftRequest(0, tokens, expansion, max_nodes or sum(expansion), SamplingParams(), None, [])


def test_ngram_proposes_continuation_of_longest_match():
    toks = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    tree = NgramProposer(1, 3).propose([_req(toks, [1, 1, 1])])[0]
    assert tree.tokens == [3, 4, 5, 9] and tree.parents == [-1, 0, 1, 2]


def test_ngram_width_gives_distinct_continuations_and_no_match_gives_root():
    toks = [7, 1, 7, 2, 7, 3, 7]
    tree = NgramProposer(1, 2).propose([_req(toks, [3, 1])])[0]
    assert sorted(tree.tokens[i] for i in tree.children(0)) == [1, 2, 3]
    empty = NgramProposer(2, 3).propose([_req([1, 2, 3, 4], [1, 1])])[0]
    assert empty.size == 1 and empty.tokens == [4]


def test_merged_proposer_respects_node_budget():
    toks = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3]
    merged = MergedProposer([NgramProposer(1, 3), NgramProposer(1, 1)])
    tree = merged.propose([_req(toks, [2, 1, 1], max_nodes=4)])[0]
    assert tree.size - 1 <= 4 and tree.tokens[0] == 3


def test_ngram_draft_source_is_the_longest_match():
    ngram = NgramProposer(1, 4)
    assert ngram.draft_source([1, 2, 3, 4, 5, 9, 1, 2, 3]) == "ngram3"
    assert ngram.draft_source([5, 1, 2, 3, 4, 9, 1, 2, 3, 4]) == "ngram4"  # capped at n_max
    assert NgramProposer(2, 4).draft_source([1, 2, 3, 4, 5, 1]) is None  # only a 1-token match: no draft
    assert ngram.draft_source([7]) is None


class _Fixed(Proposer):
    """A proposer that always drafts ``token`` once (stands in for a model proposer)."""

    name = "model"

    def __init__(self, token: int):
        self.token, self.calls, self.released = token, [], []

    def propose(self, reqs):
        self.calls.append([r.seq_id for r in reqs])
        return [TokenTree.chain(r.token_ids[-1], [self.token]) for r in reqs]

    def draft_source(self, token_ids, seq_id=None, reference=()):
        return self.name

    def release(self, seq_id):
        self.released.append(seq_id)


def test_fallback_drafts_by_lookup_where_it_matches_and_by_the_model_elsewhere():
    model = _Fixed(42)
    fb = FallbackProposer(NgramProposer(2, 4), model)
    repeat = DraftRequest(1, [1, 2, 3, 9, 1, 2], [1, 1], 2, SamplingParams(), None, [])
    fresh = DraftRequest(2, [1, 2, 3, 4, 5, 6], [1, 1], 2, SamplingParams(), None, [])
    trees = fb.propose([repeat, fresh])
    assert trees[0].tokens == [2, 3, 9] and trees[1].tokens == [6, 42]
    assert model.calls == [[2]], "the model drafts only where lookup has nothing"
    assert (fb.num_first, fb.num_second) == (1, 1)
    assert fb.draft_source(repeat.token_ids) == "ngram2" and fb.draft_source(fresh.token_ids) == "model"
    fb.release(2)
    assert model.released == [2]


def _brute_force_match(tokens: list[int], n_min: int, n_max: int) -> tuple[int, list[int]]:
    """Every earlier window of every size, longest first: the definition _longest_match speeds up."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        starts = [s for s in range(len(tokens) - n) if tokens[s:s + n] == tokens[-n:]]
        if starts:
            return n, starts
    return 0, []


def test_ngram_longest_match_equals_the_brute_force_definition():
    import random

    import numpy as np

    rng = random.Random(0)
    for _ in range(1500):
        n_min = rng.randint(1, 3)
        n_max = rng.randint(n_min, 5)
        vocab = rng.choice([2, 3, 5, 50])
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        n, starts = NgramProposer(n_min, n_max)._longest_match(np.asarray(tokens, dtype=np.int64))
        assert (n, starts.tolist()) == _brute_force_match(tokens, n_min, n_max), (tokens, n_min, n_max)


def test_ngram_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_min=3, n_max=2"):
        NgramProposer(3, 2)


class _CountingKV:
    """Wraps a KVService and counts calls: the scheduler must batch one plan + one settle per step."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def wrapped(*a, **k):
            self.calls.append(name)
            return fn(*a, **k)
        return wrapped


def test_engine_makes_one_kv_call_each_way_per_step(tiny_model_dir):
    from tests.tiny import random_prompts, tiny_engine

    kv = _CountingKV(KVService(256, 4))
    eng = tiny_engine(tiny_model_dir("llama", seed=0, tie_word_embeddings=False), draft="ngram", k=3)
    eng.kv = eng.scheduler.kv = kv
    for i, p in enumerate(random_prompts(6, seed=5)):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=8, ignore_eos=True))
    steps = 0
    while eng.has_unfinished():
        kv.calls.clear()
        eng.step()
        steps += 1
        assert kv.calls == ["plan", "settle"], kv.calls
    assert steps > 1 and kv.inner.allocator.num_free_blocks == 256
