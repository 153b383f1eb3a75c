"""The recipe's transformers backend (training/hf_data.py) against our own engine and forward."""
from __future__ import annotations

import json

import pytest
import torch

from actors.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def hf_tiny(tiny_target_dir):
    from training.hf_data import load_hf_model

    return load_hf_model(tiny_target_dir, torch.device("cpu"), torch.float32)


@torch.inference_mode()
def test_features_equal_our_forward(hf_tiny, tiny_target_dir, tiny_prompts):
    """Same final-normed hidden states and greedy next tokens as the engine's own forward, for a
    padded batch of conversations of different lengths."""
    from training.data import target_features
    from training.hf_data import hf_target_features
    from actors.model.loader import load_model

    ours = load_model(tiny_target_dir).model
    convs = tiny_prompts[:5]
    assert len({len(c) for c in convs}) > 1, "the batch must need padding"
    for (fa, na), (fb, nb), c in zip(hf_target_features(hf_tiny, convs, torch.device("cpu"), logit_rows=7),
                                     target_features(ours, convs, torch.device("cpu")), convs):
        assert fa.shape == fb.shape == (len(c), ours.config.hidden_size)
        assert fa.dtype == torch.float16 and (fa.float() - fb.float()).abs().max() < 1e-2
        assert torch.equal(na, nb)


def test_greedy_answers_equal_the_engine(hf_tiny, tiny_target_dir, tiny_prompts):
    """Left-padded batched generate = the engine's greedy answers, cut after the first EOS."""
    from training.hf_data import hf_generate
    from tests.tiny import tiny_engine

    eng = tiny_engine(tiny_target_dir)
    eng.eos_ids = {76, 219}  # tokens the tiny target does emit, so that some answers stop early
    want = [o.token_ids for o in eng.generate(tiny_prompts, SamplingParams(max_tokens=20), concurrency=4)]
    got = hf_generate(hf_tiny, tiny_prompts, [76, 219], 20, sampled=None, device=torch.device("cpu"))
    assert got == want
    assert sum(len(w) < 20 for w in want) >= 2 and sum(len(w) == 20 for w in want) >= 1


class _Encoder:
    """Token-id prompts pass through, as PromptEncoder does for them."""

    class tokenizer:  # noqa: N801
        eos_token_id = 2

    def encode(self, prompt, chat=False):
        return list(prompt)


def test_responses_are_shards_of_the_engine_format_and_resume(hf_tiny, tiny_prompts, tmp_path):
    from training.data import _done_indices
    from training.hf_data import hf_generate_responses

    prompts = tiny_prompts[:7]
    assert hf_generate_responses(hf_tiny, _Encoder(), prompts[:5], tmp_path, float("inf"), torch.device("cpu"),
                                 batch=2, max_tokens=6, seed=3) == 5
    shards = sorted((tmp_path / "responses").glob("shard-*.jsonl"))
    assert len(shards) == 3
    rows = [json.loads(line) for s in shards for line in s.read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(5))
    for r in rows:
        assert r["prompt_ids"] == prompts[r["index"]] and 1 <= len(r["output_ids"]) <= 6
    # a second run answers only what is missing, into new shards
    assert hf_generate_responses(hf_tiny, _Encoder(), prompts, tmp_path, float("inf"), torch.device("cpu"),
                                 batch=4, max_tokens=6, seed=3) == 7
    assert _done_indices(tmp_path / "responses") == set(range(7))
    assert len(list((tmp_path / "responses").glob("shard-*.jsonl"))) == 4


def test_a_past_deadline_answers_nothing(hf_tiny, tiny_prompts, tmp_path):
    from training.hf_data import hf_generate_responses

    assert hf_generate_responses(hf_tiny, _Encoder(), tiny_prompts, tmp_path, 0.0, torch.device("cpu")) == 0


def test_step_cap_takes_the_first_of_steps_and_epochs():
    from training.fit import step_cap

    assert step_cap(None, None, 50) is None
    assert step_cap(30, None, 50) == 30
    assert step_cap(None, 4, 50) == 200
    assert step_cap(120, 4, 50) == 120
    assert step_cap(None, 0.01, 50) == 1


@pytest.mark.model
def test_the_recipe_runs_its_data_stages_through_transformers(default_model, tmp_path):
    """``--backend hf`` end to end on the default model: chat prompts of the mix, answers, features
    in the engine backend's files, which the train stage reads."""
    from training.data import load_examples
    from training.train import main

    out = tmp_path / "run"
    assert main(["--out", str(out), "--backend", "hf", "--stages", "gen,features", "--minutes", "3",
                 "--num-prompts", "3", "--max-tokens", "6", "--concurrency", "2", "--threads", "2"]) == 0
    rows = [json.loads(line) for f in sorted((out / "responses").glob("shard-*.jsonl"))
            for line in f.read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == [0, 1, 2]
    examples = load_examples(out)
    assert len(examples) == 3 and all(e.features.shape[1] == default_model.config.hidden_size for e in examples)
    assert {tuple(e.tokens.tolist()) for e in examples} == {tuple(r["prompt_ids"] + r["output_ids"]) for r in rows}
