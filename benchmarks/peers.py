"""Peer baselines (``--peers``): transformers' own ``generate`` on the same prompts, the same
output budgets and the same weights (loaded from the converted HF directory), greedy, on the
engine's device and dtype (fp32 on CPU, bf16 on CUDA), batch 1 unless said otherwise:

- plain greedy decoding, the counterpart of specray's ``none``;
- prompt lookup (``prompt_lookup_num_tokens=K``), the counterpart of ``ngram`` at the same K;
- assisted generation with the same draft model (``assistant_model=``, K constant drafts per
  step), the counterpart of a draft-model method;
- self-speculation with the target's first N layers (``assistant_early_exit=N``, K constant
  drafts per step), the counterpart of ``layerskip:N``; other methods have no transformers
  equivalent (an EAGLE head is not a model transformers can assist with);
- on CUDA only (``compiled_peers``; on CPU each is a row saying it was skipped): plain greedy
  with a static KV cache and the decode step compiled (``torch.compile`` mode reduce-overhead:
  CUDA graphs), which is transformers' fast path, batch 1 and in batches of up to 64 prompts
  (the counterpart of specray's ``none`` at concurrency 64). Compilation and CUDA-graph
  recording happen in an untimed warm-up with the timed calls' shapes.

Each peer is reported with the ratio specray/peer of whole-set tokens/s, specray measured at
concurrency 1 and temperature 0 (what the peer does).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from benchmarks.options import is_draft_model
from benchmarks.prompt_set import BenchPrompt
from benchmarks.results import BASELINE


@dataclass(slots=True)
class PeerResult:
    peer: str
    counterpart: str  # the specray method it is compared with
    spec_tokens: int | None
    output_tokens: int | None = None
    wall_s: float | None = None
    tokens_per_s: float | None = None
    specray_tokens_per_s: float | None = None
    ratio: float | None = None  # specray / peer
    note: str | None = None
    batch: int = 1  # prompts per generate call; compared with specray at concurrency = batch


    def to_dict(self) -> dict:
        return asdict(self)


def _hf_model(spec: str, device: torch.device = torch.device("cpu")):
    """The transformers model of ``spec`` in the engine's dtype for ``device`` (fp32 on CPU, bf16 else)."""
    from transformers import AutoModelForCausalLM

    from actors.model.loader import resolve_model_dir

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    return AutoModelForCausalLM.from_pretrained(str(resolve_model_dir(spec)), dtype=dtype).to(device).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_generate(model, encoded: list[list[int]], budgets: list[int], eos: int | None, **kw) -> tuple[int, float]:
    """Output tokens and wall time of the whole set, one prompt at a time (after one warm-up)."""
    gen = dict(do_sample=False, pad_token_id=eos, **kw)
    device = model.device
    with torch.inference_mode():
        model.generate(torch.tensor([encoded[0]], device=device), max_new_tokens=4, **gen)
        _sync(device)
        ntok, start = 0, time.perf_counter()
        for ids, budget in zip(encoded, budgets):
            x = torch.tensor([ids], device=device)
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=budget, **gen)
            ntok += out.shape[1] - len(ids)
        _sync(device)
    return ntok, time.perf_counter() - start


def run_peers(model: str, prompts: list[BenchPrompt], max_tokens: int | None, methods: list[str],
              spec_tokens: list[int], threads: int | None = None,
              device: str | torch.device = "cpu") -> list[PeerResult]:
    """Prompts are encoded with the target's tokenizer exactly as the engine encodes them; torch
    runs with the engine's thread count (``threads``, default all cores) so the comparison is fair."""
    import os

    device = torch.device(device)
    if device.type == "cpu":
        torch.set_num_threads(threads or os.cpu_count() or 1)
    tokenizer, encoded, budgets = encode_prompts(model, prompts, max_tokens)
    target = _hf_model(model, device)
    run = lambda **kw: _timed_generate(target, encoded, budgets, tokenizer.eos_token_id, **kw)  # noqa: E731
    results = [_result("transformers.generate", BASELINE, None, *run())]
    for k in spec_tokens:
        results.append(_result("transformers.prompt_lookup", "ngram", k, *run(prompt_lookup_num_tokens=k)))
    for m in methods:
        if m == BASELINE or m == "ngram":
            continue
        if m.startswith("layerskip:"):
            results += _early_exit_peers(target, run, m, spec_tokens)
            continue
        if not is_draft_model(m):
            results.append(PeerResult("transformers.assisted", m, None,
                                      note=f"skipped: {m!r} is not a draft model, assisted generation needs one"))
            continue
        assistant = _hf_model(m, device)
        for k in spec_tokens:
            _constant_drafts(assistant.generation_config, k)
            results.append(_result("transformers.assisted", m, k, *run(assistant_model=assistant)))
    return results


ACCELERATE_PEER = "transformers.accelerate_offload"


def offload_device_map(num_layers: int, offloaded: int, device: torch.device | str) -> dict[str, int | str]:
    """A transformers ``device_map`` with the last ``offloaded`` decoder layers on "cpu" (accelerate
    keeps their weights in host memory and moves them to the execution device every forward: its CPU
    offload) and everything else on ``device`` (the layers specray offloads are the last ones too)."""
    device = torch.device(device)
    main = "cpu" if device.type == "cpu" else (device.index or 0)
    layers = {f"model.layers.{i}": "cpu" if i >= num_layers - offloaded else main for i in range(num_layers)}
    return {"model.embed_tokens": main, "model.rotary_emb": main, **layers, "model.norm": main, "lm_head": main}


def accelerate_offload_peer(model: str, prompts: list[BenchPrompt], max_tokens: int | None, offloaded: int,
                            device: str | torch.device) -> PeerResult:
    """transformers ``generate`` (greedy, batch 1) with the last ``offloaded`` decoder layers offloaded
    by accelerate (``device_map``): the peer of specray's weight offload on the same prompts. CUDA
    only (on CPU every layer already lives where it runs), and only with ``accelerate`` installed."""
    import importlib.util

    from transformers import AutoConfig, AutoModelForCausalLM

    from actors.model.loader import resolve_model_dir

    device = torch.device(device)
    if device.type != "cuda":
        return PeerResult(ACCELERATE_PEER, BASELINE, None, note=f"skipped on {device.type}: CPU offload moves "
                          "weights from host memory to a GPU (needs CUDA)")
    if importlib.util.find_spec("accelerate") is None:
        return PeerResult(ACCELERATE_PEER, BASELINE, None, note="skipped: accelerate is not installed (transformers "
                          "needs it for a device_map)")
    tokenizer, encoded, budgets = encode_prompts(model, prompts, max_tokens)
    path = str(resolve_model_dir(model))
    num_layers = AutoConfig.from_pretrained(path).num_hidden_layers
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                  device_map=offload_device_map(num_layers, offloaded, device)).eval()
    result = _result(ACCELERATE_PEER, BASELINE, None, *_timed_generate(target, encoded, budgets,
                                                                        tokenizer.eos_token_id))
    result.note = f"{offloaded} of {num_layers} decoder layers on cpu (device_map), moved to {device} every forward"
    return result


def encode_prompts(model: str, prompts: list[BenchPrompt], max_tokens: int | None):
    """(tokenizer, token ids of each prompt as the engine encodes it (chat template), output budgets)."""
    from actors.model.loader import load_tokenizer, resolve_model_dir
    from cluster.prompts import PromptEncoder

    tokenizer = load_tokenizer(resolve_model_dir(model))
    enc = PromptEncoder(tokenizer)
    return tokenizer, [enc.encode(p.prompt, chat=True) for p in prompts], [p.budget(max_tokens) for p in prompts]


def _constant_drafts(config, k: int) -> dict:
    """K drafts every step, as specray's fixed-K runs (transformers' default schedule adapts K).
    Returns the settings it replaced."""
    new = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    old = {key: getattr(config, key, None) for key in new}
    for key, value in new.items():
        setattr(config, key, value)
    return old


def _early_exit_peers(target, run, method: str, spec_tokens: list[int]) -> list[PeerResult]:
    """transformers' self-speculation from the target's first N layers: the same draft as
    specray's ``layerskip:N``."""
    n = int(method.partition(":")[2])
    config, saved, out = target.generation_config, None, []
    try:
        for k in spec_tokens:
            before = _constant_drafts(config, k)
            saved = before if saved is None else saved
            out.append(_result("transformers.early_exit", method, k, *run(assistant_early_exit=n)))
    finally:
        for key, value in (saved or {}).items():
            setattr(config, key, value)
    return out


def _result(peer: str, counterpart: str, k: int | None, ntok: int, wall: float) -> PeerResult:
    return PeerResult(peer, counterpart, k, ntok, wall, ntok / wall if wall > 0 else None)


def attach_ratios(peers: list[PeerResult], rows: list[dict]) -> None:
    """specray/peer: the counterpart's tokens/s at concurrency = the peer's batch (1 for most),
    temperature 0, same K."""
    ours = {(r["method"], r["spec_tokens"], r["concurrency"]): r["tokens_per_s"] for r in rows  # fixed K only:
            if r["temperature"] == 0 and r["tree"] is None  # an adaptive row has
            and r.get("tree_width", 1) == 1
            and not str(r.get("spec", "")).startswith("auto")}  # spec_tokens = its cap, not a K
    for p in peers:
        if p.tokens_per_s is None:
            continue
        p.specray_tokens_per_s = ours.get((p.counterpart, p.spec_tokens, p.batch))
        if p.specray_tokens_per_s is None:
            p.note = f"no specray run to compare: measure concurrency {p.batch} at temperature 0"
        else:
            p.ratio = p.specray_tokens_per_s / p.tokens_per_s
