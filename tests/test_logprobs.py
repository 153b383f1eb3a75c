"""Per-token logprobs from the engine: equal to log_softmax of a plain transformers forward over the
same tokens, identical with and without speculation (chains and trees, where an accepted token's
row is its parent node's), streamed as deltas that line up with the tokens, and free when not asked."""
from __future__ import annotations

import pytest
import torch

from actors.logprobs import record_logprobs, token_logprobs
from actors.sampling_params import SamplingParams
from tests.tiny import tiny_engine

MAX_TOKENS = 20
K = 5


@pytest.fixture(scope="module")
def hf_target(tiny_target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_target_dir, torch_dtype=torch.float32).eval()


def _hf_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), V] log_softmax of the rows that predicted each output token."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1)


def _collect(eng, prompts, params) -> list[tuple[list[int], list]]:
    """(token ids, logprobs) per prompt, gathered from the streamed deltas."""
    got = {f"r{i}": ([], []) for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    while eng.has_unfinished():
        for out in eng.step():
            assert out.delta_logprobs is not None and len(out.delta_logprobs) == len(out.delta_token_ids)
            got[out.request_id][0].extend(out.delta_token_ids)
            got[out.request_id][1].extend(out.delta_logprobs)
    return [got[f"r{i}"] for i in range(len(prompts))]


SPECS = [dict(draft="none"), dict(draft="draft", k=4, self_draft=True), dict(draft="draft", tree=[1, 3, 1]),
         dict(draft="ngram", k=4)]


@pytest.fixture(scope="module")
def plain(tiny_target_dir, tiny_prompts):
    eng = tiny_engine(tiny_target_dir)
    return _collect(eng, tiny_prompts[:4], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=K))


def test_greedy_logprobs_equal_a_transformers_forward(plain, hf_target, tiny_prompts):
    for prompt, (ids, lps) in zip(tiny_prompts[:4], plain):
        assert len(ids) == len(lps) == MAX_TOKENS
        ref = _hf_logprobs(hf_target, prompt, ids)
        for row, tok, lp in zip(ref, ids, lps):
            assert lp.token_id == tok
            assert lp.logprob == pytest.approx(float(row[tok]), abs=1e-3)
            top_v, top_i = row.topk(K)
            assert [t for t, _ in lp.top] == top_i.tolist()
            assert [v for _, v in lp.top] == pytest.approx(top_v.tolist(), abs=1e-3)
            assert lp.top[0][0] == tok  # greedy: the chosen token is the most likely one


@pytest.mark.parametrize("spec", SPECS[1:], ids=["self-draft-chain", "draft-tree", "ngram"])
def test_speculation_gives_the_same_logprobs(spec, plain, tiny_target_dir, tiny_draft_dir, tiny_prompts):
    spec = dict(spec)
    draft_dir = tiny_target_dir if spec.pop("self_draft", False) else tiny_draft_dir
    eng = tiny_engine(tiny_target_dir, draft_dir=draft_dir, **spec)
    got = _collect(eng, tiny_prompts[:4], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=K))
    for (ids, lps), (ref_ids, ref_lps) in zip(got, plain):
        assert ids == ref_ids
        for lp, ref in zip(lps, ref_lps):
            assert lp.logprob == pytest.approx(ref.logprob, abs=1e-4)
            assert [t for t, _ in lp.top] == [t for t, _ in ref.top]
    assert not eng.has_unfinished() and eng.allocator.num_free_blocks == eng.allocator.num_blocks


def test_self_draft_accepts_so_parent_rows_are_used(tiny_target_dir, tiny_prompts):
    """The speculative comparison above is only meaningful when drafts were accepted."""
    eng = tiny_engine(tiny_target_dir, draft="draft", draft_dir=tiny_target_dir, k=4)
    outs = eng.generate(tiny_prompts[:4], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0))
    assert sum(o.num_accepted_tokens for o in outs) > 10


def test_sampled_tokens_get_their_raw_logprob(tiny_target_dir, tiny_prompts, hf_target):
    """With temperature the figures are still the raw distribution's (not the tempered one)."""
    eng = tiny_engine(tiny_target_dir)
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.5, seed=7, logprobs=0)
    [(ids, lps)] = _collect(eng, tiny_prompts[:1], params)
    ref = _hf_logprobs(hf_target, tiny_prompts[0], ids)
    assert [lp.logprob for lp in lps] == pytest.approx([float(ref[i, t]) for i, t in enumerate(ids)], abs=1e-3)
    assert all(lp.top == () for lp in lps)


def test_not_asked_means_none(tiny_target_dir, tiny_prompts):
    eng = tiny_engine(tiny_target_dir)
    out = eng.generate(tiny_prompts[:1], SamplingParams(max_tokens=4))[0]
    assert out.delta_logprobs is None


def test_a_step_cut_short_records_only_the_kept_tokens():
    """A step proposes 3 tokens but appending stopped after 2 (EOS or the length limit)."""
    from actors.sequence import Sequence

    seq = Sequence("r", [5, 6], SamplingParams(logprobs=1))
    logits = torch.randn(4, 16)
    seq.token_ids += [7, 8]
    record_logprobs(seq, logits, [1, 2, 3], [7, 8, 9])
    assert [lp.token_id for lp in seq.logprobs] == [7, 8]
    assert seq.logprobs[1].logprob == pytest.approx(float(torch.log_softmax(logits[2], -1)[8]))
    record_logprobs(seq, logits, [0], [9])  # nothing new was appended: nothing recorded
    assert len(seq.logprobs) == 2


def test_token_logprobs_checks_shape_and_bad_values():
    rows = torch.tensor([[0.0, 1.0, 2.0]])
    [lp] = token_logprobs(rows, [2], k=2)
    expect = torch.log_softmax(rows[0], -1)
    assert lp.logprob == pytest.approx(float(expect[2])) and [t for t, _ in lp.top] == [2, 1]
    with pytest.raises(ValueError, match=r"rows must be \[2, V\]"):
        token_logprobs(rows, [1, 2], k=0)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
