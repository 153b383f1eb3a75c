"""Self-distillation data for the EAGLE head, in two cached stages under one directory.

1. ``generate_responses``: the target answers the prompt mix through the engine at high batch
   (greedy, and a ``SampledShare`` sampled), streaming finished answers into ``responses/shard-*.jsonl``
   and, from the hidden states the generating forwards computed (``return_hidden_states``), their
   features into ``features/shard-*.pt``: no second pass over them (``recorded_features``).
   Re-running skips prompts already answered, so a crash loses at most one shard.
   ``write_offline_shards`` adds offline conversations (training/offline_text.py) as
   ``responses/text-*.jsonl`` in the same format, without generating anything.
2. ``extract_features``: one teacher-forced target forward per conversation gives the features
   f_t (final-normed hidden states, the head's input and regression target) and the target's
   greedy next token at every position; saved per response shard as ``features/*.pt``
   (the target's answers first, then offline text, until its deadline), for the shards that have
   none: offline text, answers of the hf backend or of a crashed run.
"""
from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("specray.eagle.data")


@dataclass(slots=True)
class Example:
    """One conversation: token ids, the target's features and greedy predictions at each position."""

    tokens: torch.Tensor  # [n] int64
    features: torch.Tensor  # [n, H] fp16: f_t, final-normed hidden state of position t
    target_next: torch.Tensor  # [n] int64: the target's argmax after position t
    num_prompt: int  # tokens before the answer (the loss covers the answer only)
    source: str  # "gen" (the target's own answer) or "text" (offline)


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _done_indices(resp_dir: Path) -> set[int]:
    done = set()
    for f in sorted(resp_dir.glob("shard-*.jsonl")):
        done.update(json.loads(line)["index"] for line in f.read_text().splitlines() if line)
    return done


@dataclass(frozen=True, slots=True)
class SampledShare:
    """Which of the recipe's answers are sampled rather than greedy, and how: ``frac`` of the
    prompts (chosen per prompt index and seed), at ``temperature`` / ``top_p``."""

    frac: float = 0.25
    temperature: float = 0.7
    top_p: float = 0.95

    def __post_init__(self):
        if not 0.0 <= self.frac <= 1.0:
            raise ValueError(f"sampled share {self.frac}: must be within [0, 1]")
        if self.temperature <= 0:
            raise ValueError(f"sampling temperature {self.temperature}: must be > 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling top_p {self.top_p}: must be within (0, 1]")

    def is_sampled(self, index: int, seed: int) -> bool:
        return random.Random(seed * 1_000_003 + index).random() < self.frac


SAMPLED = SampledShare()  # the recipe's default: a quarter of the answers sampled at T=0.7, top-p 0.95
GREEDY = SampledShare(frac=0.0)


def _params_for(index: int, seed: int, max_tokens: int, share: SampledShare = SAMPLED, record: bool = False):
    from actors.sampling_params import SamplingParams

    if share.is_sampled(index, seed):
        return SamplingParams(max_tokens=max_tokens, temperature=share.temperature, top_p=share.top_p, seed=index,
                              return_hidden_states=record)
    return SamplingParams(max_tokens=max_tokens, return_hidden_states=record)


def recorded_features(model, prompt_ids: list[int], output_ids: list[int], hidden: torch.Tensor,
                      device: torch.device, greedy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One answer's example from the hidden states its generation computed (hidden [n - 1, H] of the
    n = prompt + output tokens, every position but the last, as the engine returns them): (tokens
    [n - 1] int32, features [n - 1, H] fp16, target_next [n - 1] int32). The last token has no
    row, so the example ends before it; the row before predicts it, which is the loss's last
    position either way. target_next is the target's argmax at the positions that predict answer
    tokens (the only ones training reads) and -1 over the rest of the prompt: a ``greedy`` answer's
    own tokens (each was its row's argmax), a sampled one's from the logits of its rows."""
    n, npr = len(prompt_ids) + len(output_ids), len(prompt_ids)
    if hidden.shape[0] != n - 1:
        raise ValueError(f"hidden states of {hidden.shape[0]} positions for a conversation of {n} tokens")
    nxt = torch.full((n - 1,), -1, dtype=torch.int32)
    if greedy:
        nxt[npr - 1:] = torch.tensor(output_ids, dtype=torch.int32)
    else:
        with torch.inference_mode():
            nxt[npr - 1:] = model.compute_logits(hidden[npr - 1:].to(device)).argmax(-1).cpu().to(torch.int32)
    tokens = torch.tensor((prompt_ids + output_ids)[:n - 1], dtype=torch.int32)
    return tokens, hidden.to(torch.float16), nxt


def _save_features(path: Path, examples: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                   num_prompt: list[int]) -> None:
    """A features shard: (tokens, features, target_next) per conversation and its prompt length."""
    payload = {"tokens": [e[0] for e in examples], "features": [e[1] for e in examples],
               "target_next": [e[2] for e in examples], "num_prompt_tokens": num_prompt}
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda p: torch.save(payload, p))


def generate_responses(engine, prompts: list, out_dir: Path, deadline: float, concurrency: int = 48,
                       shard_size: int = 32, max_tokens: int = 160, share: SampledShare = SAMPLED,
                       seed: int = 0, record: bool = True) -> int:
    """Answer ``prompts`` (chat messages) until done or ``time.time() > deadline``; returns the
    number of answers on disk. Keeps ``concurrency`` requests in flight (one continuous batch).
    ``record``: each shard's features from the generating forwards too (``recorded_features``;
    the features stage then has nothing left to do for these answers)."""
    resp_dir = out_dir / "responses"
    resp_dir.mkdir(parents=True, exist_ok=True)
    done = _done_indices(resp_dir)
    todo = [i for i in range(len(prompts)) if i not in done]
    shard_no = len(list(resp_dir.glob("shard-*.jsonl")))
    buf: list[dict] = []
    feats: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    ids: dict[str, int] = {}
    t0, ntok = time.time(), 0

    def flush() -> None:
        nonlocal shard_no, buf, feats
        if buf:
            text = "".join(json.dumps(r) + "\n" for r in buf)
            name = f"shard-{shard_no:05d}"
            _atomic_write(resp_dir / f"{name}.jsonl", lambda p: p.write_text(text))
            if record:  # after the answers: a crash in between leaves them to the features stage
                _save_features(out_dir / "features" / f"{name}.pt", feats, [len(r["prompt_ids"]) for r in buf])
            shard_no, buf, feats = shard_no + 1, [], []

    nxt = 0
    while (nxt < len(todo) or ids) and time.time() < deadline:
        while nxt < len(todo) and len(ids) < concurrency:
            i = todo[nxt]
            params = _params_for(i, seed, max_tokens, share, record)
            seq = engine.add_request(f"eagle-{i}", prompts[i], params, chat=True)
            ids[seq.request_id] = i
            nxt += 1
        for out in engine.step():
            if out.finished:
                i = ids.pop(out.request_id)
                if out.finish_reason not in ("stop", "length"):  # a failed request: no answer to learn from
                    log.warning("responses: prompt %d ended with %s (%s); left out", i, out.finish_reason, out.error)
                    continue
                prompt_ids = engine.prompts.encode(prompts[i], chat=True)
                buf.append({"index": i, "prompt_ids": prompt_ids, "output_ids": list(out.token_ids)})
                if record:
                    feats.append(recorded_features(engine.loaded.model, prompt_ids, buf[-1]["output_ids"],
                                                   out.hidden_states, engine.device, not share.is_sampled(i, seed)))
                ntok += out.num_output_tokens
                if len(buf) >= shard_size:
                    flush()
                    log.info("responses: %d/%d answered, %d new tokens at %.0f tok/s",
                             len(done) + nxt - len(ids), len(prompts), ntok, ntok / (time.time() - t0))
    for rid in list(ids):  # out of time: drop what is still in flight
        engine.abort(rid)
    flush()
    return len(_done_indices(resp_dir))


def token_batches(convs: list[list[int]], batch_tokens: int) -> list[list[int]]:
    """Indices of conversations packed into forwards of at most ``batch_tokens`` tokens."""
    batches, cur, n = [], [], 0
    for i, ids in enumerate(convs):
        if cur and n + len(ids) > batch_tokens:
            batches.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += len(ids)
    return batches + ([cur] if cur else [])


@torch.inference_mode()
def packed_hidden(model, convs: list[list[int]], device: torch.device, block_size: int = 16) -> torch.Tensor:
    """The final hidden states [sum of lengths, H] of the conversations laid end to end, each from its
    first token, in one forward over a KV cache made for them."""
    from actors.verifier import SeqChunk, build_forward_batch

    blocks = [-(-len(c) // block_size) for c in convs]
    kv = model.allocate_kv_cache(sum(blocks), block_size, device)
    chunks, first = [], 0
    for ids, nb in zip(convs, blocks):
        table = list(range(first, first + nb))
        slots = [table[p // block_size] * block_size + p % block_size for p in range(len(ids))]
        chunks.append(SeqChunk(list(ids), list(range(len(ids))), slots, len(ids), table, None))
        first += nb
    return model(build_forward_batch(chunks, block_size, device), kv)


@torch.inference_mode()
def target_features(model, convs: list[list[int]], device: torch.device, block_size: int = 16
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(features [n, H] fp16, greedy next token [n] int64) of each conversation, in one forward."""
    hidden = packed_hidden(model, convs, device, block_size)  # [N, H]
    nxt = torch.cat([model.compute_logits(h).argmax(-1) for h in hidden.split(256)])
    return per_conversation(hidden, nxt, convs)


def per_conversation(hidden: torch.Tensor, nxt: torch.Tensor, convs: list[list[int]]
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """hidden [N, H] and nxt [N] of the conversations ``convs`` laid end to end -> per conversation
    (features fp16 on the CPU, greedy next tokens on the CPU)."""
    out, start = [], 0
    for ids in convs:
        end = start + len(ids)
        out.append((hidden[start:end].to(torch.float16).cpu(), nxt[start:end].cpu()))
        start = end
    return out


def write_offline_shards(tokenizer, convs: list[list[dict]], out_dir: Path, shard_size: int = 64,
                         max_answer_tokens: int = 384) -> int:
    """Offline (user, assistant) conversations as response shards ``text-*.jsonl`` (once)."""
    from cluster.prompts import PromptEncoder

    resp_dir = out_dir / "responses"
    resp_dir.mkdir(parents=True, exist_ok=True)
    if any(resp_dir.glob("text-*.jsonl")):
        return len(list(resp_dir.glob("text-*.jsonl")))
    enc, eos = PromptEncoder(tokenizer), tokenizer.eos_token_id
    for n, start in enumerate(range(0, len(convs), shard_size)):
        rows = []
        for i, (user, answer) in enumerate(convs[start: start + shard_size], start=start):
            out = tokenizer.encode(answer["content"], add_special_tokens=False)[:max_answer_tokens] + [eos]
            rows.append({"index": i, "prompt_ids": enc.encode([user], chat=True), "output_ids": out})
        text = "".join(json.dumps(r) + "\n" for r in rows)
        _atomic_write(resp_dir / f"text-{n:05d}.jsonl", lambda p: p.write_text(text))
    return -(-len(convs) // shard_size)


def extract_features(model, out_dir: Path, device: torch.device, deadline: float = float("inf"),
                     batch_tokens: int = 2048, features_fn=None) -> int:
    """Features for every response shard that has none yet, until ``deadline``; returns the number
    of feature shards. ``features_fn(model, convs, device)`` is ``target_features`` unless given
    (training/hf_data.py passes transformers' forward)."""
    features_fn = features_fn or target_features
    feat_dir = out_dir / "features"
    feat_dir.mkdir(parents=True, exist_ok=True)
    t0, ntok = time.time(), 0
    while True:  # re-list every time: answers still being generated come first ("shard-" < "text-")
        todo = [s for s in sorted((out_dir / "responses").glob("*.jsonl"))
                if not (feat_dir / (s.stem + ".pt")).exists()]
        if not todo:
            break
        shard, target = todo[0], feat_dir / (todo[0].stem + ".pt")
        if time.time() > deadline:
            log.info("features: out of time, %d shards left out", len(todo))
            break
        rows = [json.loads(line) for line in shard.read_text().splitlines() if line]
        convs = [r["prompt_ids"] + r["output_ids"] for r in rows]
        tokens, feats, nexts = [], [], []
        for batch in token_batches(convs, batch_tokens):
            for i, (f, nx) in zip(batch, features_fn(model, [convs[i] for i in batch], device)):
                tokens.append(torch.tensor(convs[i], dtype=torch.int32))
                feats.append(f)
                nexts.append(nx.to(torch.int32))
        ntok += sum(len(c) for c in convs)
        _save_features(target, list(zip(tokens, feats, nexts)), [len(r["prompt_ids"]) for r in rows])
        log.info("features: %s (%d tokens so far, %.0f tok/s)", target.name, ntok, ntok / (time.time() - t0))
    return len(list(feat_dir.glob("*.pt")))


def load_examples(out_dir: Path) -> list[Example]:
    """Every conversation with features, in shard order."""
    out = []
    for f in sorted((out_dir / "features").glob("*.pt")):
        d = torch.load(f)
        source = "text" if f.name.startswith("text-") else "gen"
        for t, x, nx, npr in zip(d["tokens"], d["features"], d["target_next"], d["num_prompt_tokens"]):
            out.append(Example(t.long(), x, nx.long(), int(npr), source))
    return out
