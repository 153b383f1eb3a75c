"""Conversations the target writes itself (Magpie-style), for the EAGLE head (issue 29, item 2).

The prompt mix (training/prompt_mix.py) is our own templates; users' requests are not. Here the
target is given its chat template up to where a user's text begins, sometimes with a short opener
naming a kind of request and a topic from its own vocabulary, and samples the request itself; then
it answers. On top of single turns this makes what the prompt mix lacks:

- **multi-turn**: a share of the conversations get a second user turn, sampled the same way after
  the first answer (the template up to the next user turn), and a second answer;
- **translations both ways**: a request to translate into another language is followed by a
  request to translate the target's own translation back into English;
- **long documents**: 1,500-3,000-word documents of standard-library docstrings to summarise
  (the prompt mix's are 400-1,100 words).

Work goes in waves of a few hundred conversations, each wave four batched calls of a ``complete``
function (requests, answers, follow-up requests, answers to follow-ups and back-translations), and
each wave is one response shard ``responses/magpie-*.jsonl`` in training/data.py's format, so the
features and train stages read it like any other shard. ``complete`` is the engine's continuous
batch (``engine_complete``) or transformers' padded ``generate`` on a GPU (``hf_complete``). The
engine's also returns the answers' features from its own forwards (``records_features``): the wave
then writes ``features/magpie-*.pt`` too, and the features stage has nothing left to do for it.
"""
from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from training.data import SampledShare, _atomic_write, _save_features, recorded_features
from training.prompt_mix import BENCHMARK_TOPICS, TARGET_LANGS, long_document

log = logging.getLogger("specray.eagle.magpie")

# How a sampled request or answer is drawn: None = greedy, else (temperature, top_p, seed).
Draw = tuple[float, float, int] | None
# complete(prompts: token-id lists, max_tokens, draws: one per prompt) -> generated ids (EOS kept)
Complete = Callable[[list[list[int]], int, list[Draw]], list[list[int]]]

REQUEST_DRAW = (0.9, 0.9)  # how the target samples a user's request (at T=1 top-p 0.95 it drifts into noise)
BACK_LANGS = TARGET_LANGS + ("Korean",)

# kind -> (weight, openers); "{w}" is a topic from the target's vocabulary, "{lang}" a language.
OPENERS = {
    "free": (14, ("",)),
    "short_qa": (14, ("Quick question: ", "What is ", "Why do ", "How does {w}", "Is it true that ",
                      "In one sentence, ", "Can you tell me ")),
    "how_to": (8, ("How do I ", "What's the best way to ", "Give me tips on {w}", "Step by step, how ")),
    "code": (10, ("Write a Python function that ", "Write a JavaScript function to ", "In SQL, how do I ",
                  "Fix this code:\n", "Write a bash command that ", "Explain this code:\n")),
    "structured": (7, ("Return a JSON object ", "Give me a markdown table of ", "Output YAML for ",
                       "Make a list of {w}")),
    "creative": (9, ("Write a short poem about ", "Write a story about {w}", "Write a haiku about ",
                     "Write a limerick about ", "Write a dialogue between ")),
    "rewrite": (7, ("Rewrite this more formally: ", "Make this sentence shorter: ", "Fix the grammar: ",
                    "Summarize this in one sentence: ", "Paraphrase: ")),
    "translate": (13, ("Translate into {lang}: ", "Translate this to {lang}:\n", "How do you say \"",
                       "Please translate into {lang}: {w}")),
    "long_doc": (5, ()),
}
FOLLOW_UP_FRAC = 0.35  # share of conversations with a second user turn
FEATURES = "_features"  # a row's recorded example while its wave is written (not in the JSON)


def user_turn_prefix(tokenizer, history: list[dict] | None = None) -> list[int]:
    """The chat template's ids for ``history`` up to where the next user message's text begins."""
    mark = "XQZMARKX"
    msgs = list(history or []) + [{"role": "user", "content": mark}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    return tokenizer.encode(text[: text.index(mark)], add_special_tokens=False)


def clean_request(opener: str, continuation: str, min_words: int = 4) -> str | None:
    """The request: the opener plus the sampled text up to the end of the turn; None if too short."""
    text = (opener + continuation).split("<|im_end|>")[0].split("<|im_start|>")[0].strip()
    return text if len(text.split()) >= min_words else None


@dataclass(slots=True)
class Conversation:
    index: int
    kind: str
    opener: str
    messages: list[dict]


def draw_openers(rng: random.Random, n: int, words: list[str], paras: list[str], first_index: int
                 ) -> list[Conversation]:
    """``n`` conversations started: a kind, its opener (topics and languages filled in); long
    documents come complete (document + request), the others wait for the target's request."""
    kinds = list(OPENERS)
    weights = [OPENERS[k][0] for k in kinds]
    out = []
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        if kind == "long_doc":
            out.append(Conversation(first_index + i, kind, "", [
                {"role": "user", "content": long_document(rng, paras, (1500, 3000))}]))
            continue
        w = rng.choice(words) if words else "the weather"
        opener = rng.choice(OPENERS[kind][1]).format(w=w, lang=rng.choice(BACK_LANGS))
        out.append(Conversation(first_index + i, kind, opener, []))
    return out


def _draws(share: SampledShare, indices: list[int], seed: int, salt: int) -> list[Draw]:
    return [(share.temperature, share.top_p, seed * 7919 + 4 * i + salt) if share.is_sampled(i, seed) else None
            for i in indices]


def run_wave(complete: Complete, encoder, convs: list[Conversation], seed: int, share: SampledShare,
             max_tokens: int = 160, request_tokens: int = 96, follow_up: float = FOLLOW_UP_FRAC) -> list[dict]:
    """Requests, answers, follow-ups (``follow_up`` of the conversations that are not translations)
    and back-translations for ``convs``; returns response rows
    ({index, kind, prompt_ids, output_ids}) of every answer, first turns and second turns."""
    tok = encoder.tokenizer
    rng = random.Random(seed * 1_000_003 + (convs[0].index if convs else 0))
    prefix = user_turn_prefix(tok)
    asks = [c for c in convs if not c.messages]
    texts = complete([prefix + tok.encode(c.opener, add_special_tokens=False) for c in asks], request_tokens,
                     [(*REQUEST_DRAW, seed * 7919 + 4 * c.index) for c in asks])
    for c, ids in zip(asks, texts):
        req = clean_request(c.opener, tok.decode(ids, skip_special_tokens=False))
        if req is not None and not any(t in req.lower() for t in BENCHMARK_TOPICS):
            c.messages = [{"role": "user", "content": req}]
    live = [c for c in convs if c.messages]
    rows = _answer(complete, encoder, live, seed, share, max_tokens, salt=1)

    # second turns: a follow-up request sampled after the answer, or a back-translation into English
    backs = [c for c in live if c.kind == "translate"]
    more = [c for c in live if c.kind != "translate" and rng.random() < follow_up]
    texts = complete([user_turn_prefix(tok, c.messages) for c in more], request_tokens,
                     [(*REQUEST_DRAW, seed * 7919 + 4 * c.index + 2) for c in more])
    second = []
    for c, ids in zip(more, texts):
        req = clean_request("", tok.decode(ids, skip_special_tokens=False))
        if req is not None:
            c.messages.append({"role": "user", "content": req})
            second.append(c)
    for c in backs:
        back = Conversation(c.index, "translate_back", "",
                            [{"role": "user", "content": "Translate into English:\n\n" + c.messages[1]["content"]}])
        second.append(back)
    return rows + _answer(complete, encoder, second, seed, share, max_tokens, salt=3)


def _answer(complete: Complete, encoder, convs: list[Conversation], seed: int, share: SampledShare,
            max_tokens: int, salt: int) -> list[dict]:
    """Answer each conversation's last user turn; appends the answer and returns one row each."""
    prompts = [encoder.encode(c.messages, chat=True) for c in convs]
    draws = _draws(share, [c.index for c in convs], seed, salt)
    if getattr(complete, "records_features", False):  # (ids, example or None) per answer
        answers, feats = map(list, zip(*complete(prompts, max_tokens, draws, record=True))) if prompts else ([], [])
    else:
        answers, feats = complete(prompts, max_tokens, draws), [None] * len(prompts)
    rows = []
    eos = encoder.tokenizer.eos_token_id
    for c, p, a, f in zip(convs, prompts, answers, feats):
        text = encoder.tokenizer.decode([t for t in a if t != eos], skip_special_tokens=True)
        c.messages.append({"role": "assistant", "content": text})
        rows.append({"index": c.index, "kind": c.kind, "turn": (len(c.messages) // 2), "prompt_ids": p,
                     "output_ids": list(a), **({FEATURES: f} if f is not None else {})})
    return rows


def engine_complete(engine, concurrency: int) -> Complete:
    """``Complete`` through the engine's continuous batch. With ``record=True`` each answer comes with
    its features from the generating forwards (``training.data.recorded_features``; None for an
    answer that ended in an error): [(ids, (tokens, features, target_next) or None)]."""
    from actors.sampling_params import SamplingParams

    def complete(prompts: list[list[int]], max_tokens: int, draws: list[Draw], record: bool = False) -> list:
        if not prompts:
            return []
        params = [SamplingParams(max_tokens=max_tokens, return_hidden_states=record) if d is None else
                  SamplingParams(max_tokens=max_tokens, temperature=d[0], top_p=d[1], seed=d[2],
                                 return_hidden_states=record) for d in draws]
        outs = engine.generate(prompts, params, concurrency=concurrency)
        if not record:
            return [list(o.token_ids) for o in outs]
        return [(list(o.token_ids), None if o.hidden_states is None else recorded_features(
            engine.loaded.model, p, list(o.token_ids), o.hidden_states, engine.device, d is None))
            for p, o, d in zip(prompts, outs, draws)]

    complete.records_features = True
    return complete


def length_batches(lengths: list[int], max_tokens: int, budget: int) -> list[list[int]]:
    """Indices of prompts of ``lengths`` in batches for a padded ``generate``: by length, each batch's
    rows x (its longest prompt + ``max_tokens``) within ``budget`` tokens (a lone longer prompt still
    gets a batch of its own)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * (lengths[i] + max_tokens) <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def hf_complete(model, tokenizer, device, batch_tokens: int = 1 << 18) -> Complete:
    """``Complete`` through transformers' padded ``generate`` (a GPU): greedy rows and each
    (temperature, top_p) group apart, prompts of similar length together in batches of at most
    ``batch_tokens`` padded tokens (a long document must not pad a whole wave to its length)."""
    import torch

    from training.hf_data import _eos_ids, hf_generate

    eos = _eos_ids(model, tokenizer)

    def complete(prompts: list[list[int]], max_tokens: int, draws: list[Draw]) -> list[list[int]]:
        out: list[list[int] | None] = [None] * len(prompts)
        groups: dict[tuple | None, list[int]] = {}
        for i, d in enumerate(draws):
            groups.setdefault(None if d is None else d[:2], []).append(i)
        for key, idx in groups.items():
            share = None if key is None else SampledShare(1.0, key[0], key[1])
            for batch in length_batches([len(prompts[i]) for i in idx], max_tokens, batch_tokens):
                rows = [idx[b] for b in batch]
                if key is not None:
                    torch.manual_seed(draws[rows[0]][2])
                for i, a in zip(rows, hf_generate(model, [prompts[i] for i in rows], eos, max_tokens, share, device)):
                    out[i] = a
        return out

    return complete


def generate_magpie(complete: Complete, encoder, words: list[str], out_dir: Path, deadline: float,
                    wave: int = 192, seed: int = 0, share: SampledShare = SampledShare(),
                    max_tokens: int = 160, max_waves: int | None = None) -> int:
    """Waves of ``wave`` conversations until ``deadline`` or ``max_waves`` waves (a wave that starts finishes; requests and
    answers at most ``max_tokens``, requests at most 96), each saved
    as ``responses/magpie-NNNNN.jsonl``; a re-run continues after the last saved wave. Returns the
    number of answers on disk."""
    from training.prompt_mix import stdlib_paragraphs

    resp_dir = out_dir / "responses"
    resp_dir.mkdir(parents=True, exist_ok=True)
    paras = stdlib_paragraphs()
    t0, ntok = time.time(), 0
    n = len(list(resp_dir.glob("magpie-*.jsonl")))
    last, done = 0.0, 0
    while time.time() + 0.5 * last < deadline and (max_waves is None or done < max_waves):
        t = time.time()
        rng = random.Random(f"magpie-{seed}-{n}")
        rows = run_wave(complete, encoder, draw_openers(rng, wave, words, paras, n * wave), seed, share, max_tokens,
                        request_tokens=min(96, max_tokens))
        feats = [r.pop(FEATURES, None) for r in rows]
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        _atomic_write(resp_dir / f"magpie-{n:05d}.jsonl", lambda p: p.write_text(text, encoding="utf-8"))
        if rows and all(f is not None for f in feats):  # after the answers, as training/data.py writes them
            _save_features(out_dir / "features" / f"magpie-{n:05d}.pt", feats,
                           [len(r["prompt_ids"]) for r in rows])
        n, last, done = n + 1, time.time() - t, done + 1
        ntok += sum(len(r["output_ids"]) for r in rows)
        log.info("magpie: wave %d, %d answers (%d second turns), %d answer tokens so far at %.0f tok/s",
                 n, len(rows), sum(r["turn"] > 1 for r in rows), ntok, ntok / (time.time() - t0))
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in resp_dir.glob("magpie-*.jsonl"))
