"""The recipe's data stages through transformers' padded batches (``--backend hf``), for a GPU.

Our engine schedules and attends per sequence, so on CUDA it is bound by kernel launches (measured
2026-11-25 on an H100: 23 tok/s at concurrency 1 and ~850 tok/s at 512, slower than the 2-core
CPU). transformers' ``generate`` and forward run a whole padded batch in the same few hundred
launches per step, so the training data comes thousands of answers at a time. Both stages write
the formats of training/data.py (``responses/shard-*.jsonl``, ``features/*.pt``), so the train
stage cannot tell the backends apart; prompts are encoded with the engine's own chat template.
"""
from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import torch

from training.data import SAMPLED, SampledShare, _atomic_write, _done_indices, extract_features, per_conversation

log = logging.getLogger("specray.eagle.hf_data")


def load_hf_model(model_dir: Path, device: torch.device, dtype: torch.dtype):
    """transformers' causal LM from an HF directory (the engine's cached GGUF conversion)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()


def _eos_ids(model, tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return sorted(i for i in ids if isinstance(i, int))


def _answer(row: list[int], eos: list[int]) -> list[int]:
    """Generated ids of one row up to and including its first EOS (the engine keeps the EOS too)."""
    for n, tok in enumerate(row):
        if tok in eos:
            return row[: n + 1]
    return row


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], eos: list[int], max_tokens: int, sampled: SampledShare | None,
                device: torch.device) -> list[list[int]]:
    """Answers to token-id ``prompts`` in one left-padded ``generate`` call: greedy (``sampled``
    None), or sampled at the share's temperature / top-p (training/data.py)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), eos[0], dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):], mask[b, width - len(p):] = torch.tensor(p), 1
    extra = (dict(do_sample=True, temperature=sampled.temperature, top_p=sampled.top_p, top_k=0) if sampled
             else dict(do_sample=False))
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_tokens,
                         eos_token_id=eos, pad_token_id=eos[0], **extra)
    return [_answer(row, eos) for row in out[:, width:].tolist()]


def hf_generate_responses(model, encoder, prompts: list, out_dir: Path, deadline: float, device: torch.device,
                          batch: int = 1024, max_tokens: int = 160, seed: int = 0,
                          share: SampledShare = SAMPLED) -> int:
    """Answer chat ``prompts`` in batches of ``batch`` until done or out of time; each batch becomes
    one shard. A batch holds prompts of similar length (little padding) and the batches run in a
    seeded random order, so a run cut short by its deadline still covers every length (in length
    order, a 2026-11-25 GPU run kept only the 1,024 shortest prompts). Returns the number of answers on disk."""
    resp_dir = out_dir / "responses"
    resp_dir.mkdir(parents=True, exist_ok=True)
    done = _done_indices(resp_dir)
    encoded = {i: encoder.encode(prompts[i], chat=True) for i in range(len(prompts)) if i not in done}
    todo = sorted(encoded, key=lambda i: len(encoded[i]))
    chunks = [todo[s: s + batch] for s in range(0, len(todo), batch)]
    random.Random(seed).shuffle(chunks)
    eos = _eos_ids(model, encoder.tokenizer)
    shard_no, t0, ntok, last = len(list(resp_dir.glob("shard-*.jsonl"))), time.time(), 0, 0.0
    for n, chunk in enumerate(chunks):
        if time.time() + last > deadline:  # the next batch would not finish in time
            break
        t = time.time()
        rows = []
        is_sampled = {i: share.is_sampled(i, seed) for i in chunk}  # the engine recipe's mix
        for sampled in (False, True):
            part = [i for i in chunk if is_sampled[i] == sampled]
            if part:
                torch.manual_seed(seed * 1_000_003 + 2 * chunk[0] + sampled)
                answers = hf_generate(model, [encoded[i] for i in part], eos, max_tokens, share if sampled else None,
                                      device)
                rows += [{"index": i, "prompt_ids": encoded[i], "output_ids": a} for i, a in zip(part, answers)]
        text = "".join(json.dumps(r) + "\n" for r in rows)
        _atomic_write(resp_dir / f"shard-{shard_no:05d}.jsonl", lambda p: p.write_text(text))
        shard_no, last = shard_no + 1, time.time() - t
        ntok += sum(len(r["output_ids"]) for r in rows)
        log.info("responses (hf): %d/%d answered, %d new tokens at %.0f tok/s",
                 len(done) + sum(map(len, chunks[: n + 1])), len(prompts), ntok, ntok / (time.time() - t0))
    return len(_done_indices(resp_dir))


@torch.inference_mode()
def hf_target_features(model, convs: list[list[int]], device: torch.device, logit_rows: int = 16384
                       ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``training.data.target_features`` through transformers: (final-normed hidden states
    [n, H] fp16, greedy next token [n] int64) per conversation, from one right-padded forward."""
    width = max(len(c) for c in convs)
    ids = torch.zeros(len(convs), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for b, c in enumerate(convs):
        ids[b, : len(c)], mask[b, : len(c)] = torch.tensor(c), 1
    mask = mask.to(device)
    hidden = model.model(input_ids=ids.to(device), attention_mask=mask).last_hidden_state  # [B, L, H]
    flat = hidden[mask.bool()]  # [N, H] real tokens, conversation by conversation
    nxt = torch.cat([model.lm_head(h).argmax(-1) for h in flat.split(logit_rows)])
    return per_conversation(flat, nxt, convs)


def hf_extract_features(model, out_dir: Path, device: torch.device, deadline: float = float("inf"),
                        batch_tokens: int = 32768) -> int:
    """Stage 2 with transformers' forward; returns the number of feature shards."""
    return extract_features(model, out_dir, device, deadline, batch_tokens, features_fn=hf_target_features)
