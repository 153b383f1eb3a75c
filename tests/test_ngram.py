"""Prompt lookup that fills the draft nodes reserved for it (NgramProposer's width, issue 29):
farther along one continuation, a second continuation beside it, never past the node budget or the
depth the request leaves room for; other proposers' sources reserve no extra width."""
from __future__ import annotations

import pytest

from actors.proposers.base import DraftRequest
from actors.proposers.ngram import NgramProposer
from actors.sampling_params import SamplingParams
from cluster.config import SpeculativeConfig


def _req(tokens, k, max_nodes, max_depth=None):
    return DraftRequest(0, list(tokens), [1] * k, max_nodes, SamplingParams(), None, [], max_depth)


COPY = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1, 5, 6]  # "5 6" recurs: 7 .. 16 followed it


def test_width_one_drafts_the_expansions_depth_whatever_the_budget():
    tree = NgramProposer(2, 16).propose([_req(COPY, 3, 10, max_depth=50)])[0]
    assert tree.tokens == [6, 7, 8, 9]


def test_a_wider_lookup_continues_as_far_as_its_nodes_go():
    ngram = NgramProposer(2, 16, width=2)
    assert ngram.propose([_req(COPY, 3, 6, max_depth=50)])[0].tokens == [6, 7, 8, 9, 10, 11, 12]
    assert ngram.propose([_req(COPY, 3, 6, max_depth=4)])[0].tokens == [6, 7, 8, 9, 10]  # room for 4 only
    assert ngram.propose([_req(COPY, 3, 6)])[0].tokens == [6, 7, 8, 9]  # no max_depth: the expansion's
    assert ngram.propose([_req(COPY, 3, 20, max_depth=50)])[0].tokens == [6, *range(7, 17), 1, 5, 6]  # history ends


def test_a_wider_lookup_merges_two_continuations_breadth_first_within_its_nodes():
    tokens = [1, 2, 10, 11, 12, 13, 1, 2, 20, 21, 22, 23, 9, 1, 2]  # "1 2" went on two ways
    tree = NgramProposer(2, 16, width=2).propose([_req(tokens, 3, 6, max_depth=50)])[0]
    assert tree.num_draft_tokens == 6
    assert [tree.tokens[i] for i in tree.children(0)] == [20, 10]  # most recent first
    assert sorted(tree.depths[1:]) == [1, 1, 2, 2, 3, 3]


def test_no_match_still_drafts_nothing():
    assert NgramProposer(2, 16, width=2).propose([_req([1, 2, 3, 4], 3, 6, max_depth=50)])[0].size == 1


def test_wider_lookup_reserves_its_width_for_lookup_sources_only():
    ngram = NgramProposer(2, 16, width=2)
    assert [ngram.nodes_per_depth(s) for s in ("ngram2", "ngram9", "eagle", None)] == [2, 2, 1, 1]
    assert NgramProposer(2, 4).nodes_per_depth("ngram3") == 1
    with pytest.raises(ValueError, match="width must be >= 1"):
        NgramProposer(2, 4, width=0)


def test_default_draft_fills_two_nodes_per_depth_and_default_chain_keeps_chains():
    assert SpeculativeConfig.from_draft_arg("default").lookup_width == 2
    chain = SpeculativeConfig.from_draft_arg("default-chain")
    assert (chain.method, chain.lookup_first, chain.lookup_width) == ("eagle", True, 1)
    assert SpeculativeConfig.from_draft_arg("eagle").lookup_first is False


def test_max_depth_defaults_to_the_expansion():
    assert _req(COPY, 3, 6).depth_limit == 3 and _req(COPY, 3, 6, max_depth=7).depth_limit == 7


@pytest.mark.parametrize("alphabet", [3, 40, 2000])  # loops (the last token everywhere), text, rare repeats
def test_draft_source_per_sequence_equals_the_scan(alphabet):
    """The source a sequence's kept occurrences give (draft_source with seq_id, grown a few tokens
    at a time as the engine grows it) is the whole-history scan's, step after step; release drops
    them, and a sequence asked again from the start is indexed anew."""
    import random

    rng = random.Random(alphabet)
    ngram = NgramProposer(2, 16)
    for seq_id in range(3):
        tokens = [rng.randrange(alphabet) for _ in range(5)]
        for _ in range(150):
            if rng.random() < 0.3 and len(tokens) > 20:  # copy an earlier stretch: long matches
                start = rng.randrange(len(tokens) - 20)
                tokens += tokens[start: start + rng.randrange(1, 20)]
            else:
                tokens += [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
            assert ngram.draft_source(tokens, seq_id) == ngram.draft_source(tokens), (seq_id, len(tokens))
        assert seq_id in ngram._occurrences
        ngram.release(seq_id)
        assert seq_id not in ngram._occurrences
    fresh = [1, 2, 3, 1, 2]
    ngram.draft_source([9, 9, 9, 9, 9, 9], 7)
    assert ngram.draft_source(fresh, 7) == ngram.draft_source(fresh) == "ngram2"  # shorter: indexed anew


# ---- a request's prediction (OpenAI's predicted outputs) -----------------------------------------
PREDICTION = (40, 41, 42, 43, 44, 45, 46)


def _predicted(tokens, k, max_nodes, prediction=PREDICTION):
    return DraftRequest(0, list(tokens), [1] * k, max_nodes, SamplingParams(prediction=prediction), None, [], 50)


def test_lookup_drafts_from_the_prediction():
    ngram = NgramProposer(2, 16, width=2)
    assert ngram.propose([_predicted([1, 2, 41, 42], 3, 4)])[0].tokens == [42, 43, 44, 45, 46]
    assert ngram.draft_source([1, 2, 41, 42], 3, PREDICTION) == "ngram2p"
    assert ngram.draft_source([1, 2, 41, 42], 4) is None  # without it: nothing to copy
    # a longer match in the sequence's own tokens counts too; a request with a prediction keeps its
    # own kind of source (the adaptive policy's estimates apart from plain lookup's)
    own = [41, 42, 43, 7, 8, 9, 10, 7, 8, 9, 10]
    assert ngram.draft_source(own, 5, PREDICTION) == "ngram4p" and ngram.draft_source(own, 6) == "ngram4"


def test_a_prediction_draft_stops_at_its_end_and_never_matches_across_it():
    ngram = NgramProposer(2, 16, width=1)
    # the prediction's last tokens match: its continuation ends with it (not into the prompt)
    tree = ngram.propose([_predicted([44, 45], 5, 10, prediction=(43, 44, 45))])[0]
    assert tree.size == 1  # nothing follows "44 45" in the prediction
    tree = ngram.propose([_predicted([9, 43, 44], 5, 10, prediction=(43, 44, 45))])[0]
    assert tree.tokens == [44, 45]
    # the end of the prediction followed by the start of the prompt is not a match
    assert ngram.draft_source([46, 1, 2, 3, 46, 1], 6, PREDICTION) == "ngram2p"  # in the prompt itself
    assert ngram.draft_source([1, 9, 9, 46, 1], 7, PREDICTION) is None
    # the prediction's array is kept per sequence while it drafts, and dropped with it
    assert ngram._references[6][0] is PREDICTION
    ngram.release(6)
    assert 6 not in ngram._references
