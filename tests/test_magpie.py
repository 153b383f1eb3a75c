"""training/magpie.py: conversations the target writes itself (requests, answers, second turns,
back-translations), driven here by a scripted ``complete`` and, for the two real backends, a tiny model."""
from __future__ import annotations

import json
import random
import time

import pytest
import torch

from training.data import SampledShare
from training.magpie import (OPENERS, REQUEST_DRAW, Conversation, clean_request, draw_openers, engine_complete,
                             generate_magpie, hf_complete, length_batches, run_wave, user_turn_prefix)


@pytest.fixture(scope="module")
def encoder(default_model_dir):
    from actors.model.loader import load_tokenizer
    from cluster.prompts import PromptEncoder

    return PromptEncoder(load_tokenizer(default_model_dir))


class Scripted:
    """A ``complete`` that answers from a script keyed by what the prompt ends with, and records calls."""

    def __init__(self, tokenizer, requests: dict[str, str], answer: str = "An answer."):
        self.tok, self.requests, self.answer, self.calls = tokenizer, requests, answer, []

    def __call__(self, prompts, max_tokens, draws):
        self.calls.append((len(prompts), max_tokens, list(draws)))
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            if text.endswith("<|im_start|>user\n") or not text.endswith("assistant\n"):  # a request
                key = next((k for k in self.requests if text.endswith(k)), "")
                reply = self.requests.get(key, "")
            else:
                reply = self.answer + f" ({len(p)} tokens)"
            out.append(self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id])
        return out


def test_user_turn_prefix_ends_where_the_users_text_begins(encoder):
    tok = encoder.tokenizer
    first = tok.decode(user_turn_prefix(tok))
    assert first.endswith("<|im_start|>user\n") and first.count("<|im_start|>user") == 1
    history = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    second = tok.decode(user_turn_prefix(tok, history))
    assert "Hello! How can I help?<|im_end|>" in second and second.endswith("<|im_start|>user\n")
    assert second.count("<|im_start|>user") == 2


def test_clean_request_cuts_at_the_turn_end_and_drops_short_ones():
    assert clean_request("Quick question: ", "why is ice slippery?<|im_end|>\n<|im_start|>assistant") == \
        "Quick question: why is ice slippery?"
    assert clean_request("", "Tell me more<|im_start|>user") is None  # three words: too short
    assert clean_request("", "   ") is None


def test_openers_are_seeded_weighted_and_fill_topics_and_languages():
    paras = [f"Paragraph {i} " + "word " * 100 for i in range(60)]
    a = draw_openers(random.Random(5), 400, ["lantern", "harbour"], paras, first_index=800)
    b = draw_openers(random.Random(5), 400, ["lantern", "harbour"], paras, first_index=800)
    assert [(c.kind, c.opener, c.messages) for c in a] == [(c.kind, c.opener, c.messages) for c in b]
    assert [c.index for c in a] == list(range(800, 1200))
    kinds = {c.kind for c in a}
    assert kinds == set(OPENERS), f"every kind drawn in 400: missing {set(OPENERS) - kinds}"
    assert not [c for c in a if "{" in c.opener], "placeholders left unfilled"
    docs = [c for c in a if c.kind == "long_doc"]
    assert all(len(c.messages) == 1 and len(c.messages[0]["content"].split()) >= 1500 for c in docs)
    assert all(not c.messages for c in a if c.kind != "long_doc"), "only long documents come complete"


def test_a_wave_answers_every_request_follows_up_and_translates_back(encoder):
    tok = encoder.tokenizer
    convs = [Conversation(0, "short_qa", "Quick question: ", []),
             Conversation(1, "translate", "Translate into French: ", []),
             Conversation(2, "free", "", []),
             Conversation(3, "short_qa", "What is ", []),  # its request names a benchmark topic: dropped
             Conversation(4, "how_to", "How do I ", [])]  # no request beyond the opener: dropped
    script = Scripted(tok, {"Quick question: ": "how do tides form in a harbour?",
                            "Translate into French: ": "the cat sleeps on the warm windowsill.",
                            "What is ": "photosynthesis in simple words, please?",
                            "<|im_start|>user\n": "Could you say more about that, with an example?"},
                      answer="Voici la réponse")
    share = SampledShare(0.5, 1.0, 1.0)
    rows = run_wave(script, encoder, convs, seed=3, share=share, max_tokens=40, request_tokens=20, follow_up=1.0)

    # call 1: the requests, sampled; call 2: the answers, each drawn by the share
    n_req, req_tokens, req_draws = script.calls[0]
    assert (n_req, req_tokens) == (5, 20) and all(d[:2] == REQUEST_DRAW for d in req_draws)
    n_ans, ans_tokens, ans_draws = script.calls[1]
    assert (n_ans, ans_tokens) == (3, 40)  # conversations 0, 1, 2
    assert [d is not None for d in ans_draws] == [share.is_sampled(i, 3) for i in (0, 1, 2)]

    first = [r for r in rows if r["turn"] == 1 and r["kind"] != "translate_back"]
    assert sorted(r["index"] for r in first) == [0, 1, 2]
    for r in first:
        assert tok.decode(r["output_ids"]).startswith("Voici la réponse")
        assert r["output_ids"][-1] == tok.eos_token_id
    assert "Quick question: how do tides form" in tok.decode(next(r for r in first if r["index"] == 0)["prompt_ids"])

    back = [r for r in rows if r["kind"] == "translate_back"]
    assert len(back) == 1 and back[0]["index"] == 1
    back_prompt = tok.decode(back[0]["prompt_ids"])
    assert "Translate into English:\n\nVoici la réponse" in back_prompt
    assert "the cat sleeps" not in back_prompt, "a back-translation is a fresh conversation"

    follow = [r for r in rows if r["turn"] == 2]
    assert sorted(r["index"] for r in follow) == [0, 2]
    for r in follow:  # follow-ups carry the first turn and its answer
        text = tok.decode(r["prompt_ids"])
        assert "Voici la réponse" in text and text.rstrip().endswith("assistant")
        assert "Could you say more about that" in text and r["kind"] in ("short_qa", "free")
    assert all(r["index"] not in (3, 4) for r in rows)


def test_follow_ups_take_about_their_share(encoder):
    tok = encoder.tokenizer
    convs = [Conversation(i, "free", "", []) for i in range(200)]
    script = Scripted(tok, {"<|im_start|>user\n": "Tell me about the history of bread making."})
    rows = run_wave(script, encoder, convs, seed=1, share=SampledShare(0.0), max_tokens=8, request_tokens=8)
    second = sum(r["turn"] == 2 for r in rows)
    assert sum(r["turn"] == 1 for r in rows) == 200 and 45 <= second <= 95  # 35% of 200 = 70


def test_generate_magpie_writes_one_shard_per_wave_and_resumes(encoder, tmp_path):
    tok = encoder.tokenizer
    script = Scripted(tok, {"": "Please explain how a bicycle gear works in detail."})
    words = ["lantern", "harbour", "meadow"]
    n = generate_magpie(script, encoder, words, tmp_path, float("inf"), wave=6, seed=2, max_waves=1)
    shards = sorted((tmp_path / "responses").glob("magpie-*.jsonl"))
    assert [s.name for s in shards] == ["magpie-00000.jsonl"]
    rows = [json.loads(line) for line in shards[0].read_text(encoding="utf-8").splitlines()]
    assert n == len(rows) >= 6 and {r["index"] for r in rows} <= set(range(6))
    assert set(rows[0]) == {"index", "kind", "turn", "prompt_ids", "output_ids"}

    assert generate_magpie(script, encoder, words, tmp_path, time.time() - 1, wave=6, seed=2) == n  # out of time
    n2 = generate_magpie(script, encoder, words, tmp_path, float("inf"), wave=6, seed=2, max_waves=1)
    shards = sorted((tmp_path / "responses").glob("magpie-*.jsonl"))
    assert len(shards) == 2 and n2 > n
    second = [json.loads(line) for line in shards[1].read_text(encoding="utf-8").splitlines()]
    assert {r["index"] for r in second} <= set(range(6, 12)), "the next wave continues the numbering"


def test_engine_and_hf_backends_complete_alike(tiny_target_dir, tiny_prompts):
    """Both ``Complete`` backends give the same greedy ids (EOS kept); sampled rows are seeded."""
    from training.hf_data import load_hf_model
    from tests.tiny import ByteTokenizer, tiny_engine

    prompts = [list(p) for p in tiny_prompts[:3]]
    ours = engine_complete(tiny_engine(tiny_target_dir), concurrency=2)
    hf = hf_complete(load_hf_model(tiny_target_dir, torch.device("cpu"), torch.float32), ByteTokenizer(),
                     torch.device("cpu"))
    assert ours(prompts, 6, [None] * 3) == hf(prompts, 6, [None] * 3)
    draws = [(1.0, 1.0, 7), None, (1.0, 1.0, 9)]
    assert ours(prompts, 6, draws) == ours(prompts, 6, draws)
    assert hf(prompts, 6, draws) == hf(prompts, 6, draws)
    assert ours([], 6, []) == [] == hf([], 6, [])


def test_length_batches_keep_padded_tokens_within_the_budget():
    lengths = [30, 3000, 40, 35, 2900, 50, 45]
    batches = length_batches(lengths, max_tokens=100, budget=1000)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * (max(lengths[i] for i in b) + 100) <= 1000
    assert [1] in batches and [4] in batches, "each long document alone"
    assert [lengths[b[0]] for b in batches] == sorted(lengths[b[0]] for b in batches), "by length"
    assert length_batches([], 10, 100) == []


def test_engine_complete_records_the_answers_features(tiny_target_dir, tiny_prompts):
    """With record=True the engine's answers come with their features from the generating forwards,
    as the teacher-forced features pass computes them over the same tokens."""
    from training.data import target_features
    from tests.tiny import tiny_engine

    engine = tiny_engine(tiny_target_dir)
    ours = engine_complete(engine, concurrency=2)
    prompts = [list(p) for p in tiny_prompts[:3]]
    draws = [None, (1.0, 1.0, 7), None]
    recorded = ours(prompts, 6, draws, record=True)
    assert [ids for ids, _ in recorded] == ours(prompts, 6, draws)  # recording changes no token
    for p, d, (ids, (tokens, feats, nxt)) in zip(prompts, draws, recorded):
        conv = p + ids
        assert tokens.tolist() == conv[:-1]
        ref_feats, ref_next = target_features(engine.loaded.model, [conv[:-1]], torch.device("cpu"))[0]
        torch.testing.assert_close(feats.float(), ref_feats.float(), atol=2e-3, rtol=1e-3)
        assert nxt[len(p) - 1:].tolist() == (ids if d is None else ref_next[len(p) - 1:].tolist())
        assert bool((nxt[:len(p) - 1] == -1).all())


def test_a_wave_writes_its_answers_features_beside_them(encoder, tmp_path):
    """A ``complete`` that records features: the wave's shard gets a features file of its rows, in
    order, and the JSON rows carry no tensors."""
    from training.data import load_examples

    tok = encoder.tokenizer

    class Recording(Scripted):
        records_features = True

        def __call__(self, prompts, max_tokens, draws, record=False):
            outs = super().__call__(prompts, max_tokens, draws)
            if not record:
                return outs
            return [(ids, (torch.tensor((p + ids)[:-1], dtype=torch.int32),
                           torch.full((len(p) + len(ids) - 1, 4), float(len(p)), dtype=torch.float16),
                           torch.zeros(len(p) + len(ids) - 1, dtype=torch.int32))) for p, ids in zip(prompts, outs)]

    script = Recording(tok, {"": "Please explain how a bicycle gear works in detail."})
    n = generate_magpie(script, encoder, ["lantern"], tmp_path, float("inf"), wave=6, seed=2, max_waves=1)
    rows = [json.loads(line) for line in (tmp_path / "responses" / "magpie-00000.jsonl").read_text().splitlines()]
    assert n == len(rows) > 0 and all("_features" not in r for r in rows)
    examples = load_examples(tmp_path)
    assert [e.tokens.tolist() for e in examples] == [(r["prompt_ids"] + r["output_ids"])[:-1] for r in rows]
    assert [e.num_prompt for e in examples] == [len(r["prompt_ids"]) for r in rows]
    assert [float(e.features[0, 0]) for e in examples] == [float(len(r["prompt_ids"])) for r in rows]
