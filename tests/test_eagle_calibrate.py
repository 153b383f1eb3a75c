"""The head's draft temperature (actors/eagle/calibrate.py): the overlap arithmetic, the fit of the
scale, the rows it is fitted on, and the scale's way from the head file into the proposer's q."""
from __future__ import annotations

import pytest
import torch

from actors.eagle.calibrate import (INFO_KEY, SCALES, best_scale, first_draft_logits, overlap,
                                    rewrite_scale)
from actors.eagle.data import Example, target_features
from actors.eagle.head import load_head
from actors.eagle.proposer import EagleProposer
from actors.sampling import logits_to_probs
from actors.sampling_params import SamplingParams
from tests.tiny import random_eagle_head


def test_overlap_is_one_for_the_target_itself_and_falls_as_q_moves_away():
    torch.manual_seed(0)
    logits = torch.randn(50, 40) * 3
    vocab = torch.arange(40)
    assert torch.allclose(overlap(logits, logits, vocab, 1.0, 1.0), torch.ones(50), atol=1e-5)
    assert torch.allclose(overlap(logits, logits, vocab, 0.7, 1.0), torch.ones(50), atol=1e-5)
    near, far = (overlap(logits, logits, vocab, 1.0, s).mean() for s in (0.9, 0.3))
    assert 1.0 > near > far > 0.0
    # over a reduced vocabulary q is 0 elsewhere: the overlap is at most p's mass on the vocabulary
    half = torch.arange(0, 40, 2)
    bound = torch.softmax(logits, -1)[:, half].sum(-1)
    assert (overlap(logits, logits[:, half], half, 1.0, 1.0) <= bound + 1e-6).all()


@pytest.mark.parametrize("temperature, scale", [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)])
def test_overlap_names_a_bad_temperature_or_scale(temperature, scale):
    logits = torch.randn(3, 8)
    with pytest.raises(ValueError, match=f"temperature={temperature} and scale={scale}"):
        overlap(logits, logits, torch.arange(8), temperature, scale)


@pytest.mark.parametrize("flatten", [2.0, 1.25, 1.0])
def test_best_scale_undoes_a_head_flatter_than_the_target(flatten):
    """A head whose logits are the target's divided by ``flatten`` is matched exactly at scale 1 / flatten."""
    torch.manual_seed(1)
    target = torch.randn(200, 64) * 4
    scale, table = best_scale(target, target / flatten, torch.arange(64))
    assert scale == pytest.approx(1 / flatten)
    assert table[scale] == pytest.approx(1.0, abs=1e-5) and set(table) == set(SCALES)


def _example(model, ids: list[int], num_prompt: int) -> Example:
    feats, nxt = target_features(model, [ids], torch.device("cpu"))[0]
    return Example(torch.tensor(ids), feats, nxt, num_prompt, "gen")


def test_first_draft_rows_line_up_with_the_positions_the_head_predicts(tiny_target_dir, tmp_path):
    from actors.model.loader import load_model

    model = load_model(tiny_target_dir).model
    head = load_head(random_eagle_head(model, 64, tmp_path / "h.safetensors")).attach(model)
    ids = [3, 17, 9, 40, 22, 5, 11, 60, 2, 7]
    ex = _example(model, ids, num_prompt=4)
    tl, hl = first_draft_logits(head, [ex, ex], model.lm_head.weight.detach())
    # origin t (t >= num_prompt - 2) drafts the token after position t + 1: answer positions 3..9 predict
    # tokens 4..10, the first of them drafted from the origin before; two copies of the example
    rows = len(ids) - (ex.num_prompt - 1)
    assert tl.shape == (2 * rows, model.config.vocab_size) and hl.shape == (2 * rows, 64)
    assert torch.equal(tl[:rows].argmax(-1), ex.target_next[ex.num_prompt - 1:])
    assert torch.allclose(tl[:rows], tl[rows:]) and torch.allclose(hl[:rows], hl[rows:])
    capped = first_draft_logits(head, [ex, ex], model.lm_head.weight.detach(), max_positions=rows + 2)
    assert capped[0].shape[0] == capped[1].shape[0] == rows + 2


def test_the_scale_goes_from_the_head_file_into_the_draft_distribution(tiny_target_dir, tmp_path):
    from actors.model.loader import load_model

    model = load_model(tiny_target_dir).model
    path = random_eagle_head(model, 64, tmp_path / "h.safetensors")
    assert EagleProposer(load_head(path)).temperature_scale == 1.0  # a file without one drafts at T
    rewrite_scale(path, 0.6)
    head = load_head(path)
    assert head.info[INFO_KEY] == 0.6
    prop = EagleProposer(head)
    logits = torch.randn(64)
    params = SamplingParams(temperature=0.8, max_tokens=4)
    q_small, q = prop._draft_q(logits, params)
    assert torch.allclose(q_small, logits_to_probs(logits, 0.8 * 0.6))
    assert torch.allclose(q[head.draft_vocab], q_small) and float(q.sum()) == pytest.approx(1.0)
    rewrite_scale(path, -1.0)
    with pytest.raises(ValueError, match=f"{INFO_KEY}=-1.0"):
        EagleProposer(load_head(path))
