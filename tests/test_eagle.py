"""The EAGLE draft head (actors/eagle): file round trip, clear errors, lossless speculation with the
committed default head and a random one (greedy at batch 1 and 4, sampling by a chi-square test),
the proposer's bookkeeping under preemption and prefix caching, and a tiny training run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from actors.eagle.head import DEFAULT_HEADS, EagleHead, HeadConfig, load_head
from actors.sampling_params import SamplingParams
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
from tests.tiny import random_eagle_head as random_head
from training.prompt_mix import BENCHMARK_TOPICS, build_prompt_mix, vocabulary_words

PROMPTS_FILE = Path(__file__).parent.parent / "benchmarks" / "prompts" / "chat20.jsonl"
MAX_TOKENS = 32


# ---- the head file --------------------------------------------------------------------------------

def test_head_shapes_and_save_load_round_trip(tiny_target_dir, tmp_path):
    from actors.model.loader import load_model

    target = load_model(tiny_target_dir).model
    head = EagleHead(HeadConfig.for_target(target.config, 64, "tiny"))
    head.draft_vocab.copy_(torch.arange(0, 256, 4))
    head.init_from_target(target)
    head.attach(target)
    toks, feats = torch.tensor([5, 6, 7]), torch.randn(3, 64)
    h = head.entry(toks, feats)
    q, k, v = head.qkv_rope(h, torch.arange(3))
    assert h.shape == (3, 64) and q.shape == (3, 4, 16) and k.shape == v.shape == (3, 2, 16)
    out = head.finish(h, torch.randn(3, 64))
    assert out.shape == (3, 64) and head.logits(out).shape == (3, 64)

    head.save(tmp_path / "h.safetensors", {"note": "test"})
    back = load_head(tmp_path / "h.safetensors")
    assert back.cfg == head.cfg
    assert torch.equal(back.draft_vocab, head.draft_vocab)
    for (name, a), (_, b) in zip(head.named_parameters(), back.named_parameters()):
        assert torch.equal(a.detach().half().float(), b), name
    assert (tmp_path / "h.safetensors").stat().st_size < 1e6


def test_committed_default_head_is_small_and_matches_the_default_model(default_model):
    path = DEFAULT_HEADS["smollm2-135m"]
    assert path.is_file() and path.stat().st_size <= 25 * 2**20
    head = load_head(path).attach(default_model.model)
    assert head.cfg.hidden_size == default_model.config.hidden_size
    assert len(head.draft_vocab.unique()) == head.cfg.draft_vocab_size


def test_draft_arg_parsing():
    default, alone = SpeculativeConfig.from_draft_arg("default"), SpeculativeConfig.from_draft_arg("eagle")
    assert (default.method, default.lookup_first) == ("eagle", True)
    assert (alone.method, alone.lookup_first) == ("eagle", False)
    spec = SpeculativeConfig.from_draft_arg("eagle:/x/head.safetensors")
    assert (spec.method, spec.eagle_head) == ("eagle", "/x/head.safetensors")
    with pytest.raises(ValueError, match="eagle:PATH"):
        SpeculativeConfig.from_draft_arg("eagle:")
    both = SpeculativeConfig.from_draft_arg("default:/x/head.safetensors")
    assert (both.method, both.eagle_head, both.lookup_first) == ("eagle", "/x/head.safetensors", True)
    with pytest.raises(ValueError, match="default:PATH"):
        SpeculativeConfig.from_draft_arg("default: ")


def test_clear_errors(default_model, tiny_target_dir, tmp_path):
    from actors.proposers.eagle import build_eagle_proposer
    from actors.model.loader import load_model

    tiny = load_model(tiny_target_dir).model
    tiny_head = random_head(tiny, 32, tmp_path / "tiny.safetensors")
    with pytest.raises(ValueError, match=r"hidden size 64, vocabulary 256.*hidden size 576, vocabulary 49152"):
        LLMEngine(_cfg(f"eagle:{tiny_head}"), loaded=default_model)
    with pytest.raises(ValueError, match="does not exist"):
        LLMEngine(_cfg(f"eagle:{tmp_path / 'missing.safetensors'}"), loaded=default_model)
    (tmp_path / "other.safetensors").write_bytes((tiny_target_dir / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="not an EAGLE head"):
        LLMEngine(_cfg(f"eagle:{tmp_path / 'other.safetensors'}"), loaded=default_model)
    with pytest.raises(ValueError, match="no EAGLE head is committed for model"):
        build_eagle_proposer(None, str(tiny_target_dir), object())
    with pytest.raises(ValueError, match="--ray"):  # a TP shard group is not the in-process Verifier
        build_eagle_proposer(None, "smollm2-135m", object())


# ---- lossless on the default model ----------------------------------------------------------------

def _cfg(draft: str, k: int = 5, **kw) -> EngineConfig:
    spec = SpeculativeConfig.from_draft_arg(draft, k, adaptive=False)
    return EngineConfig(speculative=spec, num_kv_blocks=256, num_threads=2, **kw)


@pytest.fixture(scope="module")
def chat_prompts():
    return [json.loads(line)["messages"] for line in PROMPTS_FILE.read_text().splitlines()[:4]]


@pytest.fixture(scope="module")
def greedy_baseline(default_model, chat_prompts):
    eng = LLMEngine(_cfg("none"), loaded=default_model)
    return [o.token_ids for o in eng.generate(chat_prompts, SamplingParams(max_tokens=MAX_TOKENS), chat=True)]


@pytest.fixture(scope="module")
def random_default_head(default_model, tmp_path_factory):
    return random_head(default_model.model, 1024, tmp_path_factory.mktemp("eagle") / "rand.safetensors")


@pytest.mark.model
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("which", ["default", "random", "lookup+random"])
def test_greedy_eagle_is_lossless(which, concurrency, default_model, chat_prompts, greedy_baseline,
                                  random_default_head):
    """``default``: lookup first, the committed head elsewhere; ``random``: an untrained head alone;
    ``lookup+random``: lookup first, then that head file (``default:PATH``)."""
    draft = {"default": "default", "random": f"eagle:{random_default_head}",
             "lookup+random": f"default:{random_default_head}"}[which]
    eng = LLMEngine(_cfg(draft), loaded=default_model)
    outs = eng.generate(chat_prompts, SamplingParams(max_tokens=MAX_TOKENS), chat=True, concurrency=concurrency)
    assert [o.token_ids for o in outs] == greedy_baseline
    assert sum(o.num_drafts for o in outs) > 0
    head = eng.proposer
    if which == "default":  # both proposers drafted; a trained head gets drafts accepted (a random one: almost never)
        assert eng.proposer.num_first > 0 and eng.proposer.num_second > 0
        assert sum(o.num_accepted_tokens for o in outs) / sum(o.num_drafts for o in outs) > 0.1
        head = eng.proposer.second
    if which == "lookup+random":  # lookup drafted, and the head is the file's, not the committed one
        assert eng.proposer.num_first > 0
        head = eng.proposer.second
        assert head.head.cfg.draft_vocab_size == 1024
    assert not head.states, "finished sequences left head state behind"


def _next_probs(verifier, ids: list[int], top_k: int) -> torch.Tensor:
    """The target's top-k distribution after ``ids`` (a scratch verifier: the engine's cache is untouched)."""
    from actors.sampling import logits_to_probs
    from actors.verifier import SeqChunk

    n = len(ids)
    chunk = SeqChunk(ids, list(range(n)), list(range(n)), n, list(range(-(-n // verifier.block_size))))
    return logits_to_probs(verifier.forward_logits([chunk], [n - 1])[0], 1.0, top_k)


@pytest.mark.model
def test_sampled_eagle_matches_the_target_distribution(default_model):
    """First three tokens at temperature 1 with top-k 2 (8 outcomes): tokens 2 and 3 come out of
    verifying a chain of two drafts sampled from the head; their joint law must be the target's."""
    from actors.verifier import Verifier

    eng = LLMEngine(_cfg("eagle", k=2), loaded=default_model)
    ids = eng.prompts.encode("A list of the three primary colors:\n1.")  # short: cheap prefills
    n = 300
    params = [SamplingParams(max_tokens=4, temperature=1.0, top_k=2, seed=i, ignore_eos=True) for i in range(n)]
    outs = eng.generate([ids] * n, params, concurrency=64)
    assert sum(o.num_draft_tokens for o in outs) >= n, "speculation did not run"
    accepted = sum(o.num_accepted_tokens for o in outs)
    assert 0 < accepted < sum(o.num_draft_tokens for o in outs), "need both accepted and rejected drafts"
    exact: dict[tuple, float] = {}
    scratch = Verifier(default_model.model, 8, 16, torch.device("cpu"), torch.float32)
    p1 = _next_probs(scratch, ids, 2)
    for t1 in p1.nonzero().flatten().tolist():
        p2 = _next_probs(scratch, ids + [t1], 2)
        for t2 in p2.nonzero().flatten().tolist():
            p3 = _next_probs(scratch, ids + [t1, t2], 2)
            for t3 in p3.nonzero().flatten().tolist():
                exact[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    seen = [tuple(o.token_ids[:3]) for o in outs]
    assert set(seen) <= set(exact), "a sequence the target cannot produce was generated"
    total = sum(exact.values())
    big = [c for c in sorted(exact) if exact[c] * n / total >= 5]  # rare outcomes pooled into one cell
    observed = [seen.count(c) for c in big] + [sum(1 for t in seen if t not in big)]
    expected = [exact[c] * n / total for c in big] + [n - sum(exact[c] * n / total for c in big)]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)


# ---- bookkeeping on a tiny target -----------------------------------------------------------------

def test_preemption_chunked_prefill_and_prefix_hits_stay_lossless(tiny_target_dir, tiny_prompts, tiny_baseline,
                                                                  tmp_path):
    from actors.model.loader import load_model
    from tests.tiny import TINY_MAX_TOKENS, tiny_engine

    path = random_head(load_model(tiny_target_dir).model, 128, tmp_path / "tiny.safetensors")
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=3, num_kv_blocks=24, max_model_len=64,
                      max_num_batched_tokens=16, adaptive=False)
    assert [o.token_ids for o in eng.generate(tiny_prompts, params)] == tiny_baseline
    assert eng.scheduler.num_preemptions > 0
    again = eng.generate(tiny_prompts[:2], params)  # prefix-cache hits: the head starts mid-prompt
    assert [o.token_ids for o in again] == tiny_baseline[:2]
    assert not eng.proposer.states


def _teacher_forced_first_drafts(head: EagleHead, model, ids: list[int]) -> list[int]:
    """The head's depth-1 prediction at every origin t of ``ids`` from the target's true features:
    entry (x_{t+1}, f_t) -> the token after position t + 1 (what training and evaluation score)."""
    from training.data import target_features

    feats = target_features(model, [ids], torch.device("cpu"))[0][0].to(head.fc.weight.dtype)  # [n, H]
    n = len(ids)
    h = head.entry(torch.tensor(ids[1:]), feats[:-1])
    q, k, v = head.qkv_rope(h, torch.arange(n - 1))
    g = q.shape[1] // k.shape[1]
    mask = torch.ones(n - 1, n - 1, dtype=torch.bool).tril()
    attn = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1), v.repeat_interleave(g, 1).transpose(0, 1),
        attn_mask=mask).transpose(0, 1).reshape(n - 1, -1)
    return head.draft_vocab[head.logits(head.finish(h, attn)).argmax(-1)].tolist()


@torch.inference_mode()
@pytest.mark.parametrize("lookup_first", [False, True])
def test_online_drafts_equal_the_teacher_forced_predictions(lookup_first, tiny_target_dir, tiny_prompts,
                                                            tiny_baseline, tmp_path):
    """The proposer's incremental cache (catch-up of prefill chunks and accepted paths) must give the
    same first draft at every step as the head run once over the whole finished sequence: what the
    offline held-out figures measure is then what serving gets. With ``lookup_first`` the head is
    skipped on the steps lookup drafts, and must still catch up exactly."""
    from actors.model.loader import load_model
    from tests.tiny import TINY_MAX_TOKENS, tiny_engine

    model = load_model(tiny_target_dir).model
    path = random_head(model, 128, tmp_path / "tiny.safetensors", seed=1)
    eng = tiny_engine(tiny_target_dir, draft=f"eagle:{path}", k=3, max_num_batched_tokens=16,
                      lookup_first=lookup_first)
    head_proposer = eng.proposer.second if lookup_first else eng.proposer
    drafts: dict[int, list[tuple[int, int]]] = {}  # seq_id -> (root position, depth-1 draft)
    propose = head_proposer.propose

    def recording(reqs):
        trees = propose(reqs)
        for r, t in zip(reqs, trees):
            if len(t.tokens) > 1:
                drafts.setdefault(r.seq_id, []).append((r.root_position, t.tokens[1]))
        return trees

    head_proposer.propose = recording
    params = SamplingParams(max_tokens=TINY_MAX_TOKENS, ignore_eos=True)
    seqs = [eng.add_request(f"r{i}", p, params) for i, p in enumerate(tiny_prompts[:4])]
    while eng.has_unfinished():
        eng.step()
    assert [s.output_ids for s in seqs] == tiny_baseline[:4]
    if lookup_first:
        assert eng.proposer.num_first >= 4 and eng.proposer.num_second >= 4 * 5, "both must have drafted"
    same = shifted = total = 0
    for seq in seqs:
        ref = _teacher_forced_first_drafts(head_proposer.head, model, seq.token_ids)
        for root, tok in drafts[seq.seq_id]:
            total += 1
            same += tok == ref[root - 1]
            shifted += tok == ref[root - 2]
    assert total >= 4 * 10
    assert same / total >= 0.95, (same, total)
    assert shifted / total < 0.5, "the reference does not tell positions apart"


# ---- the recipe -----------------------------------------------------------------------------------

class _Vocab:
    def __init__(self, tokens):
        self.tokens = tokens

    def get_vocab(self):
        return {t: i for i, t in enumerate(self.tokens)}


def test_vocabulary_words_are_whole_lowercase_words():
    tok = _Vocab(["\u0120garden", "\u2581window", "\u0120Garden", "garden", "\u0120ab", "\u0120na\u00efve",
                  "\u0120fish3s", "\u0120-ing", "\u0120planet"])
    assert vocabulary_words(tok, min_len=5) == ["garden", "planet", "window"]


def _benchmark_contents() -> set[str]:
    bench = set()
    for f in (Path(__file__).parent.parent / "benchmarks" / "prompts").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                bench.add((d.get("messages") or [{"content": d.get("prompt", "")}])[-1]["content"])
    return bench


@pytest.mark.parametrize("words", [None, [f"{a}{b}ing" for a in "bcdfglmprst" for b in "aeiou"] + ["planet"]])
def test_prompt_mix_is_varied_and_avoids_the_benchmarks(words):
    mix = [m[-1]["content"] for m in build_prompt_mix(3000, words=words)]
    assert len(set(mix)) == 3000
    bench = _benchmark_contents()
    assert not bench & set(mix)
    assert not [m for m in mix if any(t in m.lower() for t in BENCHMARK_TOPICS)]
    kinds = {m.split()[0] for m in mix}
    assert len(kinds) >= 15, kinds
    long_docs = [m for m in mix if len(m.split()) >= 400]  # documents to summarize, like long-context traffic
    assert len(long_docs) >= 100, len(long_docs)
    if words:
        used = [w for w in words if any(w in m for m in mix)]
        assert len(used) >= 0.9 * len(words) - 1 and "planet" not in used  # a benchmark topic is filtered


def test_korean_share_of_the_mix_and_the_english_mix_unchanged():
    import re

    hangul = re.compile("[\uac00-\ud7a3]")
    english = build_prompt_mix(1000)
    assert build_prompt_mix(400, korean_frac=0.0) == english[:400]  # the committed head's recipe is reproducible
    mixed = build_prompt_mix(1000, korean_frac=0.3)
    kept = [m for m in mixed if m in english]
    assert kept == english[:len(kept)]  # the English prompts are the English mix's, in its order
    ko = [m[-1]["content"] for m in mixed if m not in english]
    assert 0.22 <= len(ko) / len(mixed) <= 0.38, len(ko)
    assert all(hangul.search(c) or "Korean" in c for c in ko)  # in Korean, or asking for Korean
    assert sum(bool(hangul.search(c)) for c in ko) >= 0.8 * len(ko)
    assert len(set(ko)) == len(ko) and not _benchmark_contents() & set(ko)
    assert len({c.split()[0] for c in ko}) >= 30  # varied openings, not one template
    with pytest.raises(ValueError, match="korean_frac=1.5"):
        build_prompt_mix(10, korean_frac=1.5)


def test_revocab_keeps_the_weights_and_changes_only_the_vocabulary(tiny_target_dir):
    from training.fit import with_vocab
    from actors.model.loader import load_model

    target = load_model(tiny_target_dir).model
    head = EagleHead(HeadConfig.for_target(target.config, 64, "tiny"))
    head.draft_vocab.copy_(torch.arange(0, 256, 4))
    vocab = torch.arange(100, 196)
    new = with_vocab(head, vocab)
    assert new.cfg.draft_vocab_size == 96 and torch.equal(new.draft_vocab, vocab)
    for (name, a), (_, b) in zip(head.named_parameters(), new.named_parameters()):
        assert torch.equal(a, b), name
    new.attach(target)
    assert torch.equal(new.lm_rows, target.lm_head.weight[vocab])  # the target's rows of the new vocabulary


@pytest.mark.parametrize("argv, bad", [(["--minutes", "0"], "--minutes 0.0"),
                                       (["--gen-frac", "0.8", "--feat-frac", "0.3"], "--gen-frac 0.8"),
                                       (["--magpie-frac", "-0.1"], "--magpie-frac -0.1"),
                                       (["--gen-frac", "0.5", "--magpie-frac", "0.4", "--feat-frac", "0.2"],
                                        "--magpie-frac 0.4"),
                                       (["--init", "/no/such/head.safetensors"], "'/no/such/head.safetensors'"),
                                       (["--stages", "gen,fly"], "'gen,fly'"),
                                       (["--max-epochs", "-1"], "--max-epochs -1.0"),
                                       (["--backend", "vllm"], "'vllm'"),
                                       (["--data", "/no/such/run"], "'/no/such/run'"),
                                       (["--sampled-frac", "1.5"], "sampled share 1.5"),
                                       (["--sample-temperature", "0"], "temperature 0.0"),
                                       (["--sample-top-p", "1.2"], "top_p 1.2")])
def test_training_flags_name_the_bad_value(argv, bad, tmp_path, capsys):
    from training.train import main

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "run"), *argv])
    assert e.value.code == 2 and bad in capsys.readouterr().err


@pytest.mark.model
def test_tiny_training_run_writes_a_loadable_head(default_model, tmp_path):
    from training.train import main

    out = tmp_path / "run"
    assert main(["--out", str(out), "--minutes", "4", "--num-prompts", "3", "--max-tokens", "6",
                 "--concurrency", "3", "--text-items", "4", "--max-steps", "2", "--draft-vocab", "256",
                 "--batch-tokens", "512", "--threads", "2", "--sampled-frac", "1", "--sample-temperature", "1"]) == 0
    assert sorted(p.name for p in (out / "features").glob("*.pt")) == ["shard-00000.pt", "text-00000.pt"]
    head = load_head(out / "head.safetensors").attach(default_model.model)
    assert head.cfg.draft_vocab_size <= 256
    info = json.loads(__import__("safetensors").safe_open(str(out / "head.safetensors"), "pt").metadata()["info"])
    assert info["steps"] == 2
    assert info["held_out"] and all(0 < r["sampled_accepted_per_position"][0] <= 1 for r in info["held_out"].values())

    first = out / "first.safetensors"
    (out / "head.safetensors").rename(first)
    assert main(["--out", str(out), "--stages", "train", "--init", str(first), "--max-steps", "1",
                 "--batch-tokens", "512", "--threads", "2"]) == 0  # continue training: same vocabulary
    again = load_head(out / "head.safetensors")
    assert torch.equal(again.draft_vocab, load_head(first).draft_vocab)
    assert not torch.equal(again.fc.weight, load_head(first).fc.weight)


@pytest.mark.model
def test_magpie_stage_feeds_the_features_stage(default_model, tmp_path):
    """The magpie stage (not in the default stages) writes waves the features stage reads like any shard."""
    from training.train import main

    out = tmp_path / "run"
    assert main(["--out", str(out), "--stages", "magpie,features", "--minutes", "2", "--gen-frac", "0",
                 "--magpie-frac", "0.05", "--feat-frac", "0.9", "--magpie-wave", "2", "--max-tokens", "4",
                 "--concurrency", "4", "--threads", "2"]) == 0
    shards = sorted(p.stem for p in (out / "responses").glob("*.jsonl"))
    assert shards and all(s.startswith("magpie-") for s in shards)
    assert sorted(p.stem for p in (out / "features").glob("*.pt")) == shards
