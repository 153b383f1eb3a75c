"""The EAGLE head's drafting step as one native op (kernels/csrc/eagle.cpp): its top-k
log-probabilities kernel against torch's, and the whole step against the head's step op by op (the
same K/V bits, the same drafts)."""
from __future__ import annotations

import pytest
import torch

from actors.sampling_params import SamplingParams
from kernels import cpu_native as cn

pytestmark = pytest.mark.skipif(not cn.load(), reason=f"CPU kernels not built: {cn.unavailable_reason()}")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("v, k", [(1, 1), (17, 5), (100, 17), (8192, 3), (49152, 8)])
def test_top_logprobs_is_log_softmax_topk(v, k):
    """Drafting reads each row's k likeliest tokens and their log-probabilities from it."""
    x = torch.randn(4, v, generator=_gen(v + k)) * 4
    values, indices = cn.top_logprobs(x, k)
    ref = torch.log_softmax(x, -1).topk(k)
    assert torch.equal(indices, ref.indices)
    torch.testing.assert_close(values, ref.values, rtol=0, atol=2e-6)
    alone = cn.top_logprobs(x[2:3].clone(), k)
    assert torch.equal(alone[0][0], values[2]) and torch.equal(alone[1][0], indices[2])


def test_top_logprobs_orders_ties_by_index_and_keeps_torchs_answers_for_odd_rows():
    x = torch.tensor([[0., 2., 1., 2., 2., -1.] * 3,
                      [float("-inf"), 3., float("-inf"), 1.] + [float("-inf")] * 14,
                      [0., float("nan"), 5., 1.] + [0.] * 14])
    values, indices = cn.top_logprobs(x, 4)
    assert indices[0].tolist() == [1, 3, 4, 7] and len(set(values[0].tolist())) == 1  # equal values: lower index first
    assert indices[1].tolist()[:2] == [1, 3] and values[1, 3].item() == float("-inf")  # masked logits stay -inf
    torch.testing.assert_close(values[:2, :2], torch.log_softmax(x[:2], -1).topk(2).values)
    assert indices[2, 0].item() == 1 and values[2].isnan().all()  # a NaN ranks first and spoils the row, as in torch
    assert cn.top_logprobs(x, 0)[0].shape == (3, 0)
    with pytest.raises(RuntimeError, match=r"k=19 must be in \[0, 18\]"):
        cn.top_logprobs(x, 19)


@torch.inference_mode()
@pytest.mark.parametrize("width", [1, 3], ids=["chain", "tree"])
def test_the_native_head_step_drafts_and_caches_what_the_op_by_op_step_does(width, tiny_target_dir, tmp_path):
    """With the native CPU kernels a head step (entries, layer, LM rows, top-k) is one op
    (cpu_native.head_step): it must write the same K/V bits and give the same drafts as the step
    op by op (head_forward, then head_scores), for greedy and seeded requests."""
    import copy

    from actors.model.loader import load_model
    from actors.proposers.eagle import EagleProposer
    from benchmarks.draft_cost import DraftLoop
    from tests.tiny import random_eagle_head, tiny_engine

    model = load_model(tiny_target_dir).model
    path = random_eagle_head(model, 128, tmp_path / "tiny.safetensors", seed=2)
    native = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=4, tree_width=width).proposer
    if not native.head.native_layer:
        pytest.skip("the native CPU kernels are not built here")
    head = copy.copy(native.head)  # the same tensors, drafting op by op
    head.native_layer = False
    ref = EagleProposer(head, width)
    ref.attend = native.attend
    cfg = model.config
    loops = [DraftLoop(p, 3, 30, cfg.hidden_size, cfg.vocab_size, torch.device("cpu"), width) for p in (native, ref)]
    for loop in loops:
        loop.reqs[1].params = SamplingParams(temperature=0.8, seed=7)
    drafted = 0
    for _ in range(4):
        a, b = (loop.step() for loop in loops)
        assert [(t.tokens, t.parents) for t in a] == [(t.tokens, t.parents) for t in b]
        drafted += sum(len(t.tokens) - 1 for t in a)
    assert drafted >= 4 * 3 * 4
    assert torch.equal(native.kv.k, ref.kv.k) and torch.equal(native.kv.v, ref.kv.v)


@torch.inference_mode()
def test_a_bad_head_step_is_a_clear_error_that_writes_nothing(tiny_target_dir, tmp_path):
    from actors.model.loader import load_model
    from actors.proposers.head_kv import native_head_step
    from actors.verifier import SeqChunk, build_forward_batch
    from tests.tiny import random_eagle_head, tiny_engine

    model = load_model(tiny_target_dir).model
    path = random_eagle_head(model, 128, tmp_path / "tiny.safetensors", seed=3)
    proposer = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=2).proposer
    if not proposer.head.native_layer:
        pytest.skip("the native CPU kernels are not built here")
    pool, vocab = proposer.kv, model.config.vocab_size
    table = pool.reserve(0, 2)
    feats = torch.randn(2, model.config.hidden_size)
    before = pool.k.clone(), pool.v.clone()

    def step(tokens, score, k=2):
        batch = build_forward_batch([SeqChunk(tokens, [0, 1], pool.slots(0, 0, 2), 2, table)], pool.block_size,
                                    torch.device("cpu"))
        return native_head_step(proposer.head, batch, feats, pool, score, k)

    with pytest.raises(RuntimeError, match=f"token id {vocab} is outside the embedding's {vocab} rows"):
        step([1, vocab], [1])
    with pytest.raises(RuntimeError, match="score row 2 is not one of the step's 2 rows"):
        step([1, 2], [2])
    with pytest.raises(RuntimeError, match=r"top_k=129 must be in \[0, 128\]"):
        step([1, 2], [1], k=129)
    assert torch.equal(pool.k, before[0]) and torch.equal(pool.v, before[1])
    picked, scores = step([1, 2], [0, 1])
    assert picked.shape == (2, model.config.hidden_size) and len(scores.ids[1]) == 2
    assert not torch.equal(pool.k, before[0])  # a good step writes its entries
