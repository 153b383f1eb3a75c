"""Predicted outputs (OpenAI's ``prediction``): prompt lookup drafts from the prediction as from the
prompt, the answer is the target's own whatever the prediction says, and a bad prediction is
refused naming it."""
from __future__ import annotations

import pytest

from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.request import RequestError
from tests.test_openai_conformance import _call, _chat, app  # noqa: F401  (app: the in-process server)

MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
TOKENS = 48


@pytest.fixture(scope="module")
def engine(default_model):
    from cluster.engine import LLMEngine

    # lookup alone (K=5 chains): without a prediction a poem gives it little to copy
    config = EngineConfig(num_kv_blocks=128, num_threads=1, speculative=SpeculativeConfig.from_draft_arg("ngram", 5))
    eng = LLMEngine(config, loaded=default_model)
    yield eng
    eng.shutdown()


def _answer(engine, prediction=None, temperature=0.0, seed=None):
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, prediction=prediction, temperature=temperature,
                            seed=seed)
    return engine.generate([MESSAGES], params, chat=True)[0]


@pytest.mark.model
def test_a_right_prediction_is_drafted_and_the_answer_is_the_targets(engine):
    plain = _answer(engine)
    right = _answer(engine, prediction=plain.text)
    assert right.token_ids == plain.token_ids
    assert right.num_accepted_tokens >= 0.7 * TOKENS > plain.num_accepted_tokens  # far more tokens a step
    ids = tuple(engine.prompts.tokenizer.encode(plain.text, add_special_tokens=False))
    assert _answer(engine, prediction=ids).token_ids == plain.token_ids  # token ids work too


@pytest.mark.model
def test_a_wrong_prediction_changes_nothing_but_speed(engine):
    plain = _answer(engine)
    wrong = _answer(engine, prediction="The mountains are tall and the valleys are deep. " * 8)
    assert wrong.token_ids == plain.token_ids
    seeded = _answer(engine, temperature=0.9, seed=5)  # a seeded sample: the same with a prediction of itself
    assert _answer(engine, prediction=seeded.text, temperature=0.9, seed=5).token_ids == seeded.token_ids


@pytest.mark.model
def test_a_bad_prediction_is_refused_naming_it(engine):
    long = tuple([7] * (engine.max_model_len + 1))
    with pytest.raises(RequestError, match=f"prediction has {len(long)} tokens, more than the model's context"):
        engine.add_request("long", MESSAGES, SamplingParams(prediction=long), chat=True)
    with pytest.raises(RequestError, match="prediction: token id 99999999 is outside the vocabulary"):
        engine.add_request("vocab", MESSAGES, SamplingParams(prediction=(1, 99999999)), chat=True)
    assert not engine.has_unfinished()  # nothing was admitted
    with pytest.raises(ValueError, match="must be text or a list of token ids"):
        SamplingParams(prediction=[1, -2])


def test_repeated_tokens_counts_the_prediction_kept_in_order():
    from cluster.outputs import repeated_tokens

    assert repeated_tokens((1, 2, 3, 4), [1, 2, 3, 4]) == 4
    assert repeated_tokens((1, 2, 3, 4), [1, 9, 3, 4, 5]) == 3  # one replaced, one added
    assert repeated_tokens((1, 2, 3, 4), [4, 3, 2, 1]) == 1  # in order only
    assert repeated_tokens((), [1]) == repeated_tokens((5, 6), []) == 0


@pytest.mark.model
def test_the_final_output_counts_the_prediction(engine):
    plain = _answer(engine)
    assert plain.num_prediction_tokens == 0
    ids = engine.prompts.tokenizer.encode(plain.text, add_special_tokens=False)
    edited = ids[:10] + [42, 43] + ids[20:]  # 10 tokens replaced by 2 others
    before = _prediction_metrics(engine)
    out = _answer(engine, prediction=tuple(edited))
    assert out.token_ids == plain.token_ids
    assert (out.num_prediction_tokens, out.num_accepted_prediction_tokens) == (len(edited), len(edited) - 2)
    after = _prediction_metrics(engine)  # specray:prediction_tokens_total{outcome} counts the same
    assert (after[0] - before[0], after[1] - before[1]) == (len(edited) - 2, 2)


def _prediction_metrics(engine) -> tuple[float, float]:
    from tests.test_metrics import sample_value

    snap = engine.metrics.snapshot()
    return tuple(sample_value(snap, "specray:prediction_tokens_total", outcome=o) for o in ("accepted", "rejected"))


@pytest.mark.model
def test_the_official_client_sends_a_prediction_and_reads_its_usage(app):  # noqa: F811
    import openai

    plain = _chat(app, max_tokens=24)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None  # no prediction: no prediction counts
    pred = _chat(app, max_tokens=24, prediction={"type": "content", "content": text + " And more."})
    assert pred.choices[0].message.content == text
    details = pred.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 20 and details.rejected_prediction_tokens >= 2  # " And more."
    assert pred.speculation["num_accepted_tokens"] > plain.speculation["num_accepted_tokens"]

    async def stream(client):
        chunks = await client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=24,
            temperature=0, stream=True, stream_options={"include_usage": True},
            prediction={"type": "content", "content": [{"type": "text", "text": text}]})
        return [c async for c in chunks]
    chunks = _call(app, stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens_details.rejected_prediction_tokens == 0

    async def completion(client):  # an extension on completions
        return await client.completions.create(model="smollm2-135m", prompt="The sea is", max_tokens=16,
                                               temperature=0, extra_body={"prediction": {"type": "content",
                                                                                         "content": "x"}})
    assert _call(app, completion).usage.completion_tokens_details.accepted_prediction_tokens == 0

    with pytest.raises(openai.BadRequestError) as e:
        _chat(app, prediction={"type": "content", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]})
    assert e.value.body["param"] == "prediction" and "image_url" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # past the app's 256-token context
        _chat(app, prediction={"type": "content", "content": "sea " * 300})
    assert e.value.body["param"] == "prediction" and "more than the model's context of 256" in e.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError, match="prediction.type"):
        _chat(app, prediction={"type": "file", "content": text})
