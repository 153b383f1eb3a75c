"""Hidden states returned by the engine (``SamplingParams.return_hidden_states``, SGLang's name): the
final output holds the target's final-normed hidden state of every position but the last, as one
teacher-forced forward over prompt and answer gives them (what the EAGLE head's training reads),
with prefill in chunks, the prompt in the prefix cache, drafts accepted along chains and trees,
sequences preempted and recomputed, and beside an EAGLE head reading the same rows."""
from __future__ import annotations

import pytest
import torch

from actors.hidden_states import HiddenRecord, committed_rows
from actors.sampling_params import SamplingParams
from actors.tree import TokenTree
from tests.tiny import tiny_engine

HIDDEN = SamplingParams(max_tokens=8, ignore_eos=True, return_hidden_states=True)


def _reference(engine, ids: list[int]) -> torch.Tensor:
    """[len(ids), H] from a scratch verifier (the engine's cache untouched), one forward from position 0."""
    from actors.verifier import SeqChunk, Verifier

    n = len(ids)
    scratch = Verifier(engine.verifier.model, -(-n // 16) + 1, 16, torch.device("cpu"), torch.float32)
    chunk = SeqChunk(ids, list(range(n)), list(range(n)), n, list(range(-(-n // 16))))
    return scratch.forward_logits_and_hidden([chunk], [n - 1])[1]


def _check(engine, out, prompt: list[int]) -> None:
    conv = prompt + out.token_ids
    assert out.hidden_states is not None and out.hidden_states.shape[0] == len(conv) - 1
    torch.testing.assert_close(out.hidden_states, _reference(engine, conv[:-1]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("budget", [512, 16], ids=["one_chunk", "chunks_of_16"])
def test_hidden_states_are_the_teacher_forced_ones(tiny_target_dir, tiny_prompts, budget):
    engine = tiny_engine(tiny_target_dir, max_num_batched_tokens=budget)
    ids = tiny_prompts[0] + tiny_prompts[1]  # > 16 tokens: several chunks at budget 16
    first, again = engine.generate([ids, ids], [HIDDEN, HIDDEN], concurrency=1)  # the second: prompt cached
    _check(engine, first, ids)
    _check(engine, again, ids)
    plain = engine.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert plain.hidden_states is None and "hidden_states" not in first.to_dict()
    assert plain.num_cached_tokens > 0 and again.num_cached_tokens == 0  # recorded prompts skip the cache
    assert first.token_ids == again.token_ids == plain.token_ids


@pytest.mark.parametrize("spec", [dict(draft="layerskip:1", k=3), dict(draft="draft", tree=[2, 2, 1])],
                         ids=["layerskip_chain", "self_draft_tree"])
def test_hidden_states_with_speculation(tiny_target_dir, tiny_prompts, spec):
    """Accepted drafts commit several positions a step: each position's row is its own node's (a
    tree's accepted path, not its siblings')."""
    engine = tiny_engine(tiny_target_dir, draft_dir=tiny_target_dir, max_num_batched_tokens=64, **spec)
    prompts = tiny_prompts[2:5]
    outs = engine.generate(prompts, HIDDEN)
    assert sum(o.num_accepted_tokens for o in outs) > 0, "nothing accepted: the test checked no drafted step"
    for out, ids in zip(outs, prompts):
        _check(engine, out, ids)


def test_hidden_states_beside_an_eagle_head(tiny_target_dir, tiny_prompts, tmp_path):
    """The head reads the rows of live sequences, the record keeps them through the finishing step."""
    from actors.model.loader import load_model
    from tests.tiny import random_eagle_head

    path = random_eagle_head(load_model(tiny_target_dir).model, 128, tmp_path / "tiny.safetensors")
    engine = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=3, tree_width=2, max_num_batched_tokens=16)
    prompts = tiny_prompts[:3]
    outs = engine.generate(prompts, HIDDEN)
    assert sum(o.num_drafts for o in outs) > 0
    for out, ids in zip(outs, prompts):
        _check(engine, out, ids)


def test_hidden_states_across_preemption(tiny_target_dir, tiny_prompts):
    engine = tiny_engine(tiny_target_dir, num_kv_blocks=24, max_model_len=64)
    params = SamplingParams(max_tokens=24, ignore_eos=True, return_hidden_states=True)
    outs = engine.generate(tiny_prompts[:6], params)
    assert engine.scheduler.num_preemptions > 0, "the pool was large enough: the test did not preempt"
    for out, ids in zip(outs, tiny_prompts[:6]):
        _check(engine, out, ids)


def test_hidden_states_end_at_a_stop_token(tiny_target_dir, tiny_prompts):
    """A stop token ends the output; the rows end one position before it, as they do at max_tokens."""
    engine = tiny_engine(tiny_target_dir, draft="draft", draft_dir=tiny_target_dir, k=4)
    ids = tiny_prompts[0]
    free = engine.generate([ids], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    stop = free[5]
    out = engine.generate([ids], SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[stop],
                                               return_hidden_states=True))[0]
    assert out.finish_reason == "stop" and out.token_ids == free[:free.index(stop) + 1]
    _check(engine, out, ids)


def test_an_aborted_request_returns_no_hidden_states(tiny_target_dir, tiny_prompts):
    engine = tiny_engine(tiny_target_dir)
    engine.add_request("a", tiny_prompts[0], HIDDEN)
    engine.step()
    out = engine.abort("a")
    assert out.finish_reason == "abort" and out.hidden_states is None


def test_a_verifier_without_hidden_states_is_named(tiny_target_dir, tiny_prompts):
    """A verifier that returns logits only (the Ray tensor-parallel shards) refuses the request at once."""
    engine = tiny_engine(tiny_target_dir)

    class LogitsOnly:
        forward_logits = engine.verifier.forward_logits

    engine.verifier = LogitsOnly()
    with pytest.raises(ValueError, match="return_hidden_states: the verifier LogitsOnly"):
        engine.add_request("a", tiny_prompts[0], HIDDEN)
    assert not engine.has_unfinished()


def test_committed_rows_follow_the_tree_path():
    # root 0 -> children 1 (token 7) and 2 (token 8); 2 -> 3 (token 9): commit root, 8, 9
    tree = TokenTree([5, 7, 8, 9], [-1, 0, 0, 2], [None] * 4)
    assert committed_rows(tree, [1, 5, 8, 9, 4], 1, 4) == [0, 2, 3]
    assert committed_rows(tree, [1, 5, 8], 1, 4) == [0, 2]  # a stop after token 8: no row past it
    assert committed_rows(None, [1, 2, 3], 0, 3) == [0, 1, 2]


def test_record_keeps_the_latest_rows_and_names_a_gap():
    rec = HiddenRecord()
    rec.add(0, torch.zeros(3, 2))
    rec.add(0, torch.ones(2, 2))  # recomputed after a preemption
    rec.add(3, torch.full((1, 2), 3.0))
    assert rec.gather(4).tolist() == [[1, 1], [1, 1], [0, 0], [3, 3]]
    with pytest.raises(RuntimeError, match=r"positions \[4\]"):
        rec.gather(5)
