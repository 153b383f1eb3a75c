"""benchmarks.head_probe: answers grouped by their prompt's category, scored with the recipe's evaluation."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import head_probe


def _write_answers(work, rows):
    (work / "responses").mkdir(parents=True)
    (work / "responses" / "shard-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@torch.inference_mode()
def test_examples_follow_their_prompt_index_not_the_finish_order(tiny_target_dir, tmp_path):
    from training.data import extract_features
    from actors.model.loader import load_model

    model = load_model(tiny_target_dir).model
    # answers finish out of order: the shard holds prompt 2 first; lengths tell the rows apart
    rows = [{"index": i, "prompt_ids": [5] * (3 + i), "output_ids": [7 + i] * (4 + 2 * i)} for i in (2, 0, 1)]
    _write_answers(tmp_path, rows)
    extract_features(model, tmp_path, torch.device("cpu"))
    groups = head_probe.examples_by_category(tmp_path, ["code", "qa", "code"])
    assert sorted(groups) == ["code", "qa"]
    assert sorted(len(e.tokens) for e in groups["code"]) == [7, 13]  # prompts 0 and 2: 7 + 3 * index
    assert [len(e.tokens) for e in groups["qa"]] == [10]
    assert [e.num_prompt for e in groups["qa"]] == [4]
    # several labelings over one read: each adds its groups, in the order given
    both = head_probe.examples_by_category(tmp_path, ["code", "qa", "code"], ["x", "x", "y"])
    assert list(both) == ["code", "qa", "x", "y"]
    assert sorted(len(e.tokens) for e in both["x"]) == [7, 10] and [len(e.tokens) for e in both["y"]] == [13]


@torch.inference_mode()
def test_score_is_the_recipes_chain_acceptance(tiny_target_dir, tmp_path):
    from training.data import extract_features
    from actors.eagle.head import load_head
    from actors.model.loader import load_model
    from tests.tiny import random_eagle_head

    model = load_model(tiny_target_dir).model
    _write_answers(tmp_path, [{"index": i, "prompt_ids": [9, 4, 4], "output_ids": list(range(10 + i, 40 + i))}
                              for i in range(4)])
    extract_features(model, tmp_path, torch.device("cpu"))
    exs = head_probe.examples_by_category(tmp_path, ["a"] * 4)["a"]
    # a head whose draft vocabulary is the whole target vocabulary, so its drafts can be right
    head = load_head(random_eagle_head(model, model.config.vocab_size, tmp_path / "h.safetensors")).attach(model)
    r = head_probe.score(head, exs)
    assert len(r["top1"]) == len(r["chain"]) == head_probe.DEPTH
    assert all(c <= t + 1e-9 for c, t in zip(r["chain"], r["top1"]))
    assert all(b <= a + 1e-9 for a, b in zip(r["chain"], r["chain"][1:]))
    assert r["mean_accepted_length"] == pytest.approx(1 + sum(r["chain"]), abs=0.01)
    assert all(0 < b <= a + 1e-9 <= 1 + 1e-9 for a, b in zip(r["sampled_chain"], r["sampled_chain"][1:]))
    assert r["sampled_mean_accepted_length"] == pytest.approx(1 + sum(r["sampled_chain"]), abs=0.01)
    colder = head_probe.score(head, exs, temperature=0.05)["sampled_chain"]
    assert colder != r["sampled_chain"]  # the temperature reaches both distributions
    # depth 1 counted independently: the head's teacher-forced first draft at each origin t against
    # the target's greedy token after t + 1, over the origins that predict answer tokens
    from tests.test_eagle import _teacher_forced_first_drafts

    hits = n = 0
    for ex in exs:
        ref = _teacher_forced_first_drafts(head, model, ex.tokens.tolist())
        for t in range(ex.num_prompt - 2, len(ex.tokens) - 1):
            hits += ref[t] == int(ex.target_next[t + 1])
            n += 1
    assert r["top1"][0] == pytest.approx(hits / n, abs=1e-3)


def test_missing_head_is_named(capsys):
    with pytest.raises(SystemExit):
        head_probe.main(["--heads", "/nonexistent/head.safetensors"])
    assert "/nonexistent/head.safetensors" in capsys.readouterr().err


def test_language_groups_follow_hangul_in_any_message():
    ko = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "하늘은 왜 파란가요?"}]
    en = [{"role": "user", "content": "Translate into German: good morning"}]
    assert head_probe.language_of(ko) == "korean"
    assert head_probe.language_of(en) == "other"
    assert head_probe.language_of([{"role": "user", "content": "こんにちは"}]) == "other"  # kana is not Hangul


def test_prompt_sets_side_by_side_each_in_its_own_folder(monkeypatch, tmp_path):
    seen = {}

    def fake_prepare(p, args, items, work):
        name = "heldout" if len(items) == 24 else "bench500"  # the held-out set has 24 prompts, taken whole
        seen[name] = work
        return {"all": items, "code": items}

    monkeypatch.setattr(head_probe, "prepare_set", fake_prepare)
    monkeypatch.setattr(head_probe, "report", lambda paths, groups, *a: seen.setdefault("groups", groups) and 0)
    assert head_probe.main(["--work", str(tmp_path)]) == 0  # default: bench500 and the held-out set
    assert seen["bench500"] == tmp_path / "bench500" and seen["heldout"] == tmp_path / "heldout"
    assert list(seen.pop("groups")) == ["bench500:all", "bench500:code", "heldout:all", "heldout:code"]
    seen.clear()
    assert head_probe.main(["--work", str(tmp_path), "--prompts", "heldout", "--sample", "24"]) == 0  # plain names
    assert seen["heldout"] == tmp_path and list(seen["groups"]) == ["all", "code"]


def test_unknown_prompt_set_is_named(capsys):
    with pytest.raises(SystemExit):
        head_probe.main(["--prompts", "bench500,/nonexistent/set.jsonl"])
    assert "/nonexistent/set.jsonl" in capsys.readouterr().err
