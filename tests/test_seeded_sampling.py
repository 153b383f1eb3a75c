"""Seeded sampling is drafter-invariant: the (seed, position) race makes a seeded request's output
the one plain decoding gives, whatever the proposer, draft depth, batch or adaptive policy did,
and the output still has exactly the target's distribution."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.sampling import position_race, sample_at, sample_next
from actors.spec_verify import verify_keyed
from actors.sampling_params import SamplingParams
from actors.tree import TokenTree
from tests.toy_lm import (
    DRAFT,
    N_TOKENS,
    P_PASS,
    ROOT,
    TARGET,
    TARGET_TOPK,
    TRIALS,
    ToyLM,
    chi_square_pvalues,
    deterministic_tree,
    sampled_tree,
)
from tests.tiny import TINY_MAX_TOKENS, tiny_engine


def test_position_race_depends_on_seed_and_position_only():
    a = position_race(5, 17, 100)
    assert a.shape == (100,) and a.dtype == torch.float64 and bool((a > 0).all())
    assert torch.equal(a, position_race(5, 17, 100))
    assert not torch.equal(a, position_race(5, 18, 100))
    assert not torch.equal(a, position_race(6, 17, 100))
    assert not torch.equal(position_race(6, 17, 100), position_race(5, 18, 100))  # no linear aliasing


def test_cached_races_are_the_generator_s_own_draws():
    """The race cache changes no draw: a race is what a fresh generator seeded with the position's
    key gives, whichever way the device is named, and a repeat is served from the cache."""
    from actors.sampling import _MASK64, _race_for_key, _splitmix64, exponential_draws

    _race_for_key.cache_clear()
    first = position_race(11, 40, 5000, "cpu")
    key = _splitmix64(_splitmix64(11) ^ 40) & _MASK64
    fresh = exponential_draws(5000, torch.Generator().manual_seed(key), "cpu")
    assert torch.equal(first, fresh) and bool((fresh >= 0).all())
    assert position_race(11, 40, 5000, torch.device("cpu")) is first
    assert _race_for_key.cache_info().hits == 1
    assert not torch.equal(position_race(11, 41, 5000), first)


@pytest.mark.parametrize("width", [1, 4, 50])
def test_race_top_among_a_support_equals_race_top_over_the_whole_vocabulary(width):
    from actors.sampling import race_top, race_top_among

    g = torch.Generator().manual_seed(width)
    support = torch.randperm(1000, generator=g)[:30]  # unsorted, as a head's vocabulary may be
    q = torch.softmax(torch.randn(30, generator=g) * 3, -1)
    q[5] = 0.0  # a token of the support without mass is never a pick
    full = torch.zeros(1000).index_copy_(0, support, q)
    for position in range(20):
        rows = race_top_among(q, support, 1000, 7, position, width)
        assert support[rows].tolist() == race_top(full, 7, position, width)
        assert 5 not in rows.tolist()


def test_sample_at_follows_the_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2])
    draws = np.array([sample_at(probs, seed, 9) for seed in range(6000)])
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert freq[1] == 0
    assert np.abs(freq - probs.numpy()).max() < 0.03
    with pytest.raises(ValueError, match="shape"):
        sample_at(probs[None], 0, 0)


def test_sample_next_seeded_needs_the_position():
    logits = torch.tensor([0.0, 2.0, 1.0])
    params = SamplingParams(temperature=0.8, seed=3)
    with pytest.raises(ValueError, match="position"):
        sample_next(logits, params)
    assert sample_next(logits, params, position=4) == sample_next(logits, params, torch.Generator(), position=4)


def keyed_drafts(width: int, depth: int, draft: ToyLM = DRAFT):
    """What actors.proposers.model_draft does for a seeded request: the top-width of q / E, E the race of
    the child's position, each continued by the race's winner."""

    def propose(pos: int, root: int, seed: int) -> TokenTree:
        tree = TokenTree.root(root)
        frontier = [0]
        for d in range(depth):
            new = []
            for parent in frontier:
                q = draft.dist(pos + d, tree.tokens[parent])
                race = position_race(seed, pos + d + 1, q.shape[0])
                picks = (q / race).topk(width if d == 0 else 1).indices.tolist()
                new += [tree.add(parent, int(t), q) for t in picks]
            frontier = new
        return tree

    return propose


def _keyed_generate(propose, target: ToyLM, trials: int, reseed_proposer: bool) -> np.ndarray:
    """[trials, N_TOKENS]: trial t is a request with seed t; rows as in test_sampling.generate."""
    import random

    out = np.empty((trials, N_TOKENS), dtype=np.int64)
    for t in range(trials):
        seq, rng = [ROOT], random.Random(t)
        while len(seq) <= N_TOKENS:
            pos = len(seq) - 1
            tree = propose(pos, seq[-1], t if reseed_proposer else rng)
            seq += verify_keyed(tree, target.rows(tree, pos), seed=t, root_position=pos).output_tokens
        out[t] = seq[1: N_TOKENS + 1]
    return out


KEYED_CASES = {
    "keyed_chain_k3": (keyed_drafts(1, 3), TARGET, True),
    "keyed_tree_width3": (keyed_drafts(3, 3), TARGET_TOPK, True),
    "iid_sampled_tree": (sampled_tree(3, 3), TARGET, False),
    "deterministic_tree_topk_target": (deterministic_tree(2, 3), TARGET_TOPK, False),
}


@pytest.mark.parametrize("case", list(KEYED_CASES))
def test_keyed_verification_is_lossless(case):
    propose, target, keyed = KEYED_CASES[case]
    samples = _keyed_generate(propose, target, TRIALS // 2, reseed_proposer=keyed)
    pvalues = chi_square_pvalues(samples, target)
    assert min(pvalues.values()) > P_PASS, pvalues


@pytest.mark.parametrize("propose", [keyed_drafts(2, 3), deterministic_tree(3, 2)])
def test_keyed_output_is_plain_decodings(propose):
    """Whatever the tree, the tokens are those of plain decoding with the same seed."""
    for seed in range(200):
        plain = [ROOT]
        while len(plain) <= N_TOKENS:
            plain.append(sample_at(TARGET.dist(len(plain) - 1, plain[-1]), seed, len(plain)))
        spec = [ROOT]
        while len(spec) <= N_TOKENS:
            pos = len(spec) - 1
            tree = propose(pos, spec[-1], seed)
            spec += verify_keyed(tree, TARGET.rows(tree, pos), seed, pos).output_tokens
        assert spec[: N_TOKENS + 1] == plain[: N_TOKENS + 1], seed


def test_keyed_drafts_are_accepted_more_than_independent_ones():
    """Drafting with the verifier's race (the seeded model drafter) accepts more than i.i.d. draws."""

    def accepted(propose, use_seed: bool) -> int:
        import random
        total = 0
        for seed in range(3000):
            tree = propose(0, ROOT, seed if use_seed else random.Random(seed))
            total += len(verify_keyed(tree, TARGET.rows(tree, 0), seed, 0).accepted_nodes)
        return total

    assert accepted(keyed_drafts(1, 1), True) > 1.2 * accepted(sampled_tree(1, 1), False)


# ---- the engine ---------------------------------------------------------------------------------

ENGINE_SPECS = [
    dict(draft="none"),
    dict(draft="ngram", k=4),
    dict(draft="layerskip:1", k=3),
    dict(draft="draft", k=4),
    dict(draft="draft", tree=[2, 2, 1]),
    dict(draft="ngram", k=5, adaptive=True),
    dict(draft="eagle", k=3),
]


def test_seeded_output_does_not_depend_on_speculation_or_batch(tiny_target_dir, tiny_draft_dir, tiny_prompts,
                                                               tmp_path):
    from actors.model.loader import load_model
    from tests.tiny import random_eagle_head

    head = random_eagle_head(load_model(tiny_target_dir).model, 128, tmp_path / "head.safetensors")
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, temperature=1.0, top_p=0.95, seed=21, ignore_eos=True)
    prompts = tiny_prompts[:4]
    reference = None
    drafted = 0
    for spec in ENGINE_SPECS:
        if spec["draft"] == "eagle":
            spec = {**spec, "draft": f"eagle:{head}"}
        eng = tiny_engine(tiny_target_dir, draft_dir=tiny_draft_dir, **spec)
        for concurrency in (1, 4):
            outs = eng.generate(prompts, params, concurrency=concurrency)
            ids = [o.token_ids for o in outs]
            reference = reference or ids
            assert ids == reference, (spec, concurrency)
            drafted += sum(o.num_draft_tokens for o in outs)
    assert drafted > 0
    other = tiny_engine(tiny_target_dir).generate(prompts, params.model_copy(update={"seed": 22}))
    assert [o.token_ids for o in other] != reference
