"""Penalties, logit_bias and min_tokens stay lossless under speculation: each tree node's row is
processed with that node's own path (actors.logits_processing), checked against a token-by-token
oracle; sampling through trees keeps the penalised target's exact distribution (chi-square on the
toy LM); on the tiny model, speculative output (greedy and seeded, chains and trees) is the plain
decoding output with the same processing, which is itself the transformers forward + oracle."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from actors.logits_processing import process_logits, reference_process
from actors.sampling_params import SamplingParams
from actors.spec_verify import verify_sampling
from actors.tree import TokenTree
from tests.tiny import tiny_engine
from tests.toy_lm import N_TOKENS, P_FAIL, P_PASS, ROOT, TARGET, V, sampled_tree

EOS = 2
PENALISED = SamplingParams(presence_penalty=0.7, frequency_penalty=0.9, repetition_penalty=1.6,
                           logit_bias={5: 3.0, 9: -2.0}, min_tokens=3, max_tokens=64, stop_token_ids=[13])


def _random_tree(vocab: int, n: int, seed: int) -> TokenTree:
    rng = random.Random(seed)
    tree = TokenTree.root(rng.randrange(vocab))
    for _ in range(n - 1):
        tree.add(rng.randrange(tree.size), rng.randrange(8))  # a small alphabet: repeats along paths
    return tree


@pytest.mark.parametrize("seed", range(4))
def test_each_tree_node_is_processed_with_its_own_path(seed):
    vocab, g = 40, torch.Generator().manual_seed(seed)
    tree = _random_tree(vocab, 12, seed)
    logits = torch.randn(tree.size, vocab, generator=g) * 3
    prompt, output = [7, 3, 3, 11], [4, 5, 5, 1][: seed % 4]  # output shorter than min_tokens for some nodes
    got = process_logits(logits, PENALISED, prompt, output, tree.parents, tree.tokens, {EOS})
    for i in range(tree.size):
        path = [tree.tokens[j] for j in tree.path_to(i)[1:]]  # root excluded: it is already generated
        want = reference_process(logits[i], PENALISED, prompt, output + path, {EOS})
        torch.testing.assert_close(got[i].double(), want, atol=1e-5, rtol=0)
    assert not torch.equal(got, logits)


def test_neutral_values_process_nothing():
    assert not SamplingParams().processes_logits
    assert not SamplingParams(presence_penalty=0, frequency_penalty=0.0, repetition_penalty=1, logit_bias={},
                              min_tokens=0).processes_logits
    for change in (dict(presence_penalty=0.1), dict(frequency_penalty=-0.5), dict(repetition_penalty=1.1),
                   dict(logit_bias={"3": 1}), dict(min_tokens=1)):
        assert SamplingParams(**change).processes_logits, change


# ---- sampling through trees keeps the penalised distribution (toy LM, chi-square) --------------
TOY = SamplingParams(temperature=1.0, presence_penalty=0.8, frequency_penalty=1.2, repetition_penalty=1.5,
                     logit_bias={1: 0.7})


def _toy_next(history: list[int]) -> torch.Tensor:
    """The penalised toy target after ROOT + history (the oracle, float64)."""
    last = history[-1] if history else ROOT
    logits = TARGET.dist(len(history), last).log()
    return torch.softmax(reference_process(logits, TOY, [ROOT], history, set()), -1)


def _toy_exact(next_dist) -> np.ndarray:
    joint = np.zeros((V,) * N_TOKENS)
    for seq in np.ndindex(*joint.shape):
        p = 1.0
        for k in range(N_TOKENS):
            p *= float(next_dist(list(seq[:k]))[seq[k]])
        joint[seq] = p
    return joint


def _pvalue(samples: np.ndarray, joint: np.ndarray) -> float:
    cells = np.ravel_multi_index(samples.T, joint.shape)
    observed = np.bincount(cells, minlength=joint.size).astype(float)
    expected = joint.ravel() * len(samples)
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.fixture
def one_thread():
    """Thousands of tiny tensor ops: one intra-op thread (a busy second core makes each op wait ms)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_sampled_trees_keep_the_penalised_distribution(one_thread):
    trials, propose = 12_000, sampled_tree(2, 3)  # two i.i.d. children, each continued by a chain
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    out = np.empty((trials, N_TOKENS), dtype=np.int64)
    for t in range(trials):
        seq = [ROOT]
        while len(seq) <= N_TOKENS:
            tree = propose(len(seq) - 1, seq[-1], rng)
            raw = TARGET.rows(tree, len(seq) - 1).log()
            logits = process_logits(raw, TOY, [ROOT], seq[1:], tree.parents, tree.tokens, set())
            seq += verify_sampling(tree, torch.softmax(logits.double(), -1), gen).output_tokens
        out[t] = seq[1:N_TOKENS + 1]
    assert _pvalue(out, _toy_exact(_toy_next)) > P_PASS
    plain = _toy_exact(lambda h: TARGET.dist(len(h), h[-1] if h else ROOT))
    assert _pvalue(out, plain) < P_FAIL  # the penalties matter, and the test would see them ignored


# ---- the engine: speculative == plain decoding == transformers + oracle ------------------------
SPECS = [
    pytest.param(dict(draft="draft", k=4), id="self-draft-chain"),
    pytest.param(dict(draft="draft", tree=[2, 2, 1]), id="self-draft-tree"),
    pytest.param(dict(draft="layerskip:2", k=3), id="layerskip"),
]
REQUESTS = [
    pytest.param(dict(presence_penalty=0.5, frequency_penalty=0.5), id="openai-penalties"),
    pytest.param(dict(repetition_penalty=1.3, logit_bias={7: 1.5}), id="repetition-bias"),
    pytest.param(dict(frequency_penalty=1.0, temperature=0.8, seed=3), id="seeded-sampling"),
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("request_params", REQUESTS)
def test_speculation_with_processing_equals_plain_decoding(spec, request_params, tiny_target_dir, tiny_prompts):
    eng = tiny_engine(tiny_target_dir, draft_dir=tiny_target_dir, **spec)
    params = SamplingParams(max_tokens=20, ignore_eos=True, **request_params)
    prompts = tiny_prompts[:3]
    spec_out = eng.generate(prompts, params)
    plain = eng.generate(prompts, params.model_copy(update={"spec_tokens": 0}))
    assert [o.token_ids for o in spec_out] == [o.token_ids for o in plain]
    assert sum(o.num_accepted_tokens for o in spec_out) > 0, "no draft was accepted: speculation not exercised"
    unprocessed = eng.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True,
                                                       temperature=params.temperature, seed=params.seed))
    assert [o.token_ids for o in unprocessed] != [o.token_ids for o in plain]  # the processing changed something
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks


def test_plain_decoding_with_penalties_is_the_oracle_on_transformers(tiny_target_dir, tiny_prompts):
    from tests.model import hf_logits

    params = SamplingParams(max_tokens=12, ignore_eos=True, presence_penalty=0.6, frequency_penalty=0.8,
                            repetition_penalty=1.4, logit_bias={11: 2.0})
    prompt = tiny_prompts[1]
    got = tiny_engine(tiny_target_dir, draft="ngram", k=4).generate([prompt], params)[0].token_ids
    want: list[int] = []
    for _ in range(params.max_tokens):
        row = hf_logits(tiny_target_dir, prompt + want)[-1]
        want.append(int(reference_process(row, params, prompt, want, {EOS}).argmax()))
    assert got == want


def test_min_tokens_holds_eos_back_also_in_drafts(tiny_target_dir, tiny_prompts):
    eng = tiny_engine(tiny_target_dir, draft="draft", draft_dir=tiny_target_dir, k=4)
    eager = SamplingParams(max_tokens=30, logit_bias={EOS: 100})  # EOS wins every position
    assert [len(o.token_ids) for o in eng.generate(tiny_prompts[:2], eager)] == [1, 1]
    held = eager.model_copy(update={"min_tokens": 6})
    for out in eng.generate(tiny_prompts[:2], held):
        assert out.token_ids[-1] == EOS and len(out.token_ids) == 7 and out.finish_reason == "stop"
        assert EOS not in out.token_ids[:-1]


@pytest.mark.parametrize("spec", [dict(), dict(draft="draft", k=4)], ids=["plain", "self-draft-chain"])
def test_stop_token_ids_end_the_request_and_min_tokens_holds_them_back(spec, tiny_target_dir, tiny_prompts):
    """vLLM's stop_token_ids: the first generated one ends the choice with "stop" (kept in its ids, not
    in its text), whether it came from plain decoding or an accepted draft; min_tokens masks them."""
    eng = tiny_engine(tiny_target_dir, draft_dir=tiny_target_dir, **spec)
    base = eng.generate(tiny_prompts[:1], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    stop = base.token_ids[4]
    cut = base.token_ids.index(stop) + 1
    out = eng.generate(tiny_prompts[:1], SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=[stop]))[0]
    assert out.token_ids == base.token_ids[:cut] and out.finish_reason == "stop"
    assert out.text == eng.tokenizer.decode(base.token_ids[:cut - 1], skip_special_tokens=True)
    kept = eng.generate(tiny_prompts[:1], SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=[stop],
                                                         include_stop_str_in_output=True))[0]
    assert kept.token_ids == out.token_ids and kept.text == eng.tokenizer.decode(base.token_ids[:cut])
    held = eng.generate(tiny_prompts[:1], SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=[stop],
                                                         min_tokens=cut + 2))[0]
    assert stop not in held.token_ids[:cut + 2] and len(held.token_ids) > cut


def test_engine_checks_logit_bias_ids_and_fit_max_tokens(tiny_target_dir):
    from cluster.request import RequestError

    eng = tiny_engine(tiny_target_dir, max_model_len=32)
    with pytest.raises(RequestError, match=r"logit_bias: token id 256 is outside the vocabulary \[0, 256\)") as e:
        eng.add_request("a", [5, 6], SamplingParams(logit_bias={256: 1}))
    assert e.value.field == "logit_bias"
    with pytest.raises(RequestError, match=r"stop_token_ids: token id 300 is outside the vocabulary") as e:
        eng.add_request("a", [5, 6], SamplingParams(stop_token_ids=[3, 300]))
    assert e.value.field == "stop_token_ids"
    with pytest.raises(ValueError, match=r"prompt has 20 tokens and max_tokens=13: 33 tokens, more than the "
                                         r"model's context of 32 tokens; ask for at most max_tokens=12"):
        eng.add_request("b", list(range(3, 23)), SamplingParams(max_tokens=13), fit_max_tokens=True)
    eng.add_request("c", list(range(3, 23)), SamplingParams(max_tokens=12), fit_max_tokens=True)
    eng.add_request("d", list(range(3, 23)), SamplingParams(max_tokens=13))  # stops at the context end
    assert set(eng.seqs) == {"c", "d"}
