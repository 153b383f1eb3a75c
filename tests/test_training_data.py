"""training/data.py: the generating engine's own hidden states as the head's training features,
equal to what the teacher-forced features pass computes over the same answers."""
from __future__ import annotations

import json

import torch

from tests.tiny import tiny_engine


def test_recorded_features_equal_the_features_pass(tiny_target_dir, tiny_prompts, tmp_path):
    from training.data import SampledShare, extract_features, generate_responses, load_examples

    engine = tiny_engine(tiny_target_dir, max_num_batched_tokens=32)
    share = SampledShare(frac=0.5, temperature=1.0, top_p=1.0)  # sampled answers: argmax != next token
    rec, ref = tmp_path / "recorded", tmp_path / "teacher_forced"
    n = generate_responses(engine, tiny_prompts[:6], rec, float("inf"), concurrency=4, shard_size=4,
                           max_tokens=10, share=share, seed=1)
    assert n == 6 and sorted(p.name for p in (rec / "features").glob("*.pt")) == ["shard-00000.pt", "shard-00001.pt"]
    (ref / "responses").mkdir(parents=True)
    for shard in (rec / "responses").glob("*.jsonl"):
        (ref / "responses" / shard.name).write_text(shard.read_text())
    assert extract_features(engine.loaded.model, rec, torch.device("cpu")) == 2  # nothing left to compute
    extract_features(engine.loaded.model, ref, torch.device("cpu"))
    shards = sorted((rec / "responses").glob("*.jsonl"))
    rows = [json.loads(line) for f in shards for line in f.read_text().splitlines()]
    got, want = load_examples(rec), load_examples(ref)
    assert len(got) == len(want) == len(rows) == 6
    sampled_differs = False
    for r, g, w in zip(rows, got, want):
        n_tok = len(r["prompt_ids"]) + len(r["output_ids"])
        assert g.tokens.tolist() == (r["prompt_ids"] + r["output_ids"])[:-1] and len(w.tokens) == n_tok
        assert g.num_prompt == w.num_prompt == len(r["prompt_ids"])
        torch.testing.assert_close(g.features.float(), w.features[:-1].float(), atol=2e-3, rtol=1e-3)
        answer = slice(g.num_prompt - 1, None)
        assert g.target_next[answer].tolist() == w.target_next[:-1][answer].tolist()
        assert bool((g.target_next[: g.num_prompt - 1] == -1).all())  # read nowhere: no logits computed
        sampled_differs |= g.target_next[answer].tolist() != r["output_ids"]
    assert sampled_differs, "every answer was its own argmax: the sampled share did not reach the test"


def test_a_failed_answer_is_left_out(tiny_target_dir, tiny_prompts, tmp_path):
    """An answer that ended in an error has no features to learn from: neither it nor its row is
    written (a re-run asks for it again), and the other answers' shards stay aligned."""
    import dataclasses

    from training.data import GREEDY, generate_responses, load_examples

    engine = tiny_engine(tiny_target_dir)
    step, failed = engine.step, []

    def failing_step():
        outs = step()
        if not failed and any(o.finished for o in outs):
            k = next(i for i, o in enumerate(outs) if o.finished)
            failed.append(outs[k].request_id)
            outs[k] = dataclasses.replace(outs[k], finish_reason="error", error="injected", hidden_states=None)
        return outs

    engine.step = failing_step
    assert generate_responses(engine, tiny_prompts[:4], tmp_path, float("inf"), concurrency=2, max_tokens=6,
                              share=GREEDY) == 3
    rows = [json.loads(line) for line in (tmp_path / "responses" / "shard-00000.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(f"eagle-{r['index']}" not in failed for r in rows)
    assert len(load_examples(tmp_path)) == 3
