"""Prompt logprobs (``SamplingParams.prompt_logprobs``, the completions API's echo): every prompt token
after the first gets the target's log-probability from the row before it, as a teacher-forced forward
over the prompt gives them, with prefill cut in chunks and with the prompt in the prefix cache."""
from __future__ import annotations

import pytest
import torch

from actors.sampling_params import SamplingParams
from tests.tiny import tiny_engine

K = 3


def _reference(engine, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """log-softmax rows [n - 1, V] over the prompt from a scratch verifier (the engine's cache untouched),
    and the logprob of each next prompt token [n - 1]."""
    from actors.verifier import SeqChunk, Verifier

    n = len(ids)
    scratch = Verifier(engine.verifier.model, -(-n // 16) + 1, 16, torch.device("cpu"), torch.float32)
    chunk = SeqChunk(ids, list(range(n)), list(range(n)), n, list(range(-(-n // 16))))
    logp = torch.log_softmax(scratch.forward_logits([chunk], list(range(n - 1))).float(), dim=-1)
    return logp, logp.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def _check(out, ids: list[int], logp: torch.Tensor, chosen: torch.Tensor) -> None:
    assert out.prompt_token_ids == ids and len(out.prompt_logprobs) == len(ids) - 1
    assert [e.token_id for e in out.prompt_logprobs] == ids[1:]
    torch.testing.assert_close(torch.tensor([e.logprob for e in out.prompt_logprobs]), chosen, atol=2e-4, rtol=0)
    top = logp.topk(K, dim=-1)
    for e, values, indices in zip(out.prompt_logprobs, top.values, top.indices):
        assert [t for t, _ in e.top] == indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in e.top]), values, atol=2e-4, rtol=0)


@pytest.mark.parametrize("budget", [512, 16], ids=["one_chunk", "chunks_of_16"])
def test_prompt_logprobs_are_the_teacher_forced_ones(tiny_target_dir, tiny_prompts, budget):
    engine = tiny_engine(tiny_target_dir, max_num_batched_tokens=budget)
    ids = tiny_prompts[0] + tiny_prompts[1]  # > 16 tokens: several chunks at budget 16
    logp, chosen = _reference(engine, ids)
    params = SamplingParams(max_tokens=3, prompt_logprobs=K)
    first, again = engine.generate([ids, ids], [params, params], concurrency=1)  # the second: prompt cached
    _check(first, ids, logp, chosen)
    _check(again, ids, logp, chosen)
    plain = engine.generate([ids], SamplingParams(max_tokens=3))[0]
    assert plain.prompt_logprobs is None and plain.prompt_token_ids is None
    assert plain.num_cached_tokens > 0 and again.num_cached_tokens == 0  # scored prompts skip the cache
    assert first.token_ids == again.token_ids == plain.token_ids


def test_prompt_logprobs_with_speculation_and_a_batch(tiny_target_dir, tiny_prompts):
    """Decoding with drafts beside prompts being scored: each sequence's own prompt rows."""
    engine = tiny_engine(tiny_target_dir, draft="layerskip:1", k=3, max_num_batched_tokens=32)
    prompts = tiny_prompts[2:5]
    outs = engine.generate(prompts, SamplingParams(max_tokens=6, prompt_logprobs=0, ignore_eos=True))
    for out, ids in zip(outs, prompts):
        logp, chosen = _reference(engine, ids)
        assert all(e.top == () for e in out.prompt_logprobs)
        torch.testing.assert_close(torch.tensor([e.logprob for e in out.prompt_logprobs]), chosen, atol=2e-4, rtol=0)
    assert sum(o.num_draft_tokens for o in outs) > 0
