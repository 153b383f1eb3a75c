"""transformers' fast path on CUDA as a peer: greedy ``generate`` with a static KV cache, whose
decode step transformers compiles itself (``cache_implementation="static"`` with a
``compile_config``: ``torch.compile`` mode reduce-overhead, i.e. CUDA graphs; the documented way in
transformers 5, which compiles only the decode step, not the prefill).

Two peers, both the counterpart of specray's ``none``: batch 1 (compared at concurrency 1) and
the prompts in batches of up to ``batch`` left-padded prompts (compared at concurrency ``batch``).
Every call uses one static cache length (the longest prompt + the largest budget), so the decode
step compiles once per batch size, in an untimed warm-up call with the timed calls' shapes. A
graph break under ``fullgraph=True`` falls back to ``fullgraph=False`` (said in the note); any
other failure becomes a row with a note, never an exception. On CPU both are skipped with a note
(compiling on CPU is neither what a GPU user runs nor quick enough for a test).
"""
from __future__ import annotations

import time

import torch

from benchmarks.peers import PeerResult, _hf_model, _sync, encode_prompts
from benchmarks.prompt_set import BenchPrompt
from benchmarks.results import BASELINE

PEER = "transformers.static_compiled"
DEFAULT_BATCH = 64
WARMUP_TOKENS = 16  # decode steps of the warm-up call: compiles and records the CUDA graph


def compiled_peers(model: str, prompts: list[BenchPrompt], max_tokens: int | None,
                   device: str | torch.device, batches: tuple[int, ...] = (1, DEFAULT_BATCH)) -> list[PeerResult]:
    """One peer per batch size in ``batches`` over the same prompts."""
    device = torch.device(device)
    if device.type != "cuda":
        return [PeerResult(PEER, BASELINE, None, batch=b, note=f"skipped on {device.type}: needs CUDA "
                           "(static cache + torch.compile reduce-overhead = CUDA graphs)") for b in batches]
    tokenizer, encoded, budgets = encode_prompts(model, prompts, max_tokens)
    target = _hf_model(model, device)
    eos = _eos_ids(target, tokenizer)
    cache_len = max(len(ids) for ids in encoded) + max(budgets) + 8  # one static cache shape for every call
    return [_guarded(target, encoded, budgets, eos, b, cache_len) for b in batches]


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [] if ids is None else [ids])
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


def _guarded(model, encoded, budgets, eos: set[int], batch: int, cache_len: int) -> PeerResult:
    note = None
    for fullgraph in (True, False):
        try:
            ntok, wall = static_generate(model, encoded, budgets, eos, batch, cache_len, fullgraph)
            return PeerResult(PEER, BASELINE, None, ntok, wall, ntok / wall if wall > 0 else None, note=note,
                              batch=batch)
        except Exception as e:  # noqa: BLE001  a peer that fails is a row saying why, not a lost bench
            first_line = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            if not fullgraph:
                return PeerResult(PEER, BASELINE, None, batch=batch, note=f"failed: {note or ''} {first_line}".strip())
            note = f"fullgraph=True failed ({type(e).__name__}: {first_line}); measured with fullgraph=False"
    raise AssertionError("unreachable")


def static_generate(model, encoded: list[list[int]], budgets: list[int], eos: set[int], batch: int,
                    cache_len: int, fullgraph: bool = True) -> tuple[int, float]:
    """Output tokens and wall time of the whole set in batches of ``batch`` prompts (after an
    untimed warm-up call on the first batch)."""
    from transformers import CompileConfig

    device = model.device
    pad = min(eos) if eos else 0
    gen = dict(do_sample=False, pad_token_id=pad, cache_implementation="static", max_cache_len=cache_len,
               compile_config=CompileConfig(fullgraph=fullgraph, mode="reduce-overhead"))
    groups = [list(range(i, min(i + batch, len(encoded)))) for i in range(0, len(encoded), batch)]
    x, mask = left_padded([encoded[i] for i in groups[0]], pad, device)
    model.generate(x, attention_mask=mask, max_new_tokens=WARMUP_TOKENS, **gen)
    _sync(device)
    ntok, start = 0, time.perf_counter()
    for g in groups:
        x, mask = left_padded([encoded[i] for i in g], pad, device)
        out = model.generate(x, attention_mask=mask, max_new_tokens=max(budgets[i] for i in g), **gen)
        ntok += count_new_tokens(out[:, x.shape[1]:].tolist(), [budgets[i] for i in g], eos)
    _sync(device)
    return ntok, time.perf_counter() - start


def left_padded(rows: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] ids left-padded with ``pad`` and their attention mask (1 = real token)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def count_new_tokens(generated: list[list[int]], budgets: list[int], eos: set[int]) -> int:
    """Tokens each row really produced: up to and including its first EOS (what follows is padding
    of a finished row), at most its own budget (a batch runs to its largest)."""
    total = 0
    for row, budget in zip(generated, budgets):
        n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        total += min(n, budget)
    return total
