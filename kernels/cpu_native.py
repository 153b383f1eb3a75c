"""The CPU kernels in C++ (``kernels/csrc``): the products, attention over the paged KV cache and the
fused small ops of a decoder layer, built on first use with this machine's compiler for its own
instruction set and registered as torch ops (``torch.ops.specray_cpu``).

Why: the eager CPU forward spent ~70 dispatcher ops per layer (about 2,100 per decode step of the
default model) and oneDNN's products streamed the weights at ~16 GB/s for one row where the memory
does ~27 GB/s (``python -m benchmarks.cpu_linear``, ``benchmarks.roofline``). Here a layer is nine
ops: two norms, four products, RoPE fused with the KV write, attention, SiLU-and-multiply.

Every kernel computes a row from that row's operands alone, in one fixed order (``csrc/vec16.h``):
the bits of a token's logits do not depend on how many rows share a product, nor on whether the
token is a plain decode step, a prefill row or a token-tree node (attention lists a query's visible
keys in position order and never touches masked ones). Greedy speculative decoding is then lossless
bit for bit, not only empirically.

Products over a GGUF model's quantized blocks multiply the activations in 16-bit fixed point by
default (``csrc/linear_fixed.cpp``; ``SPECRAY_CPU_ACTIVATIONS=int8`` for 8-bit fixed point, faster
verification with other logits; ``float32`` for fp32 and the fp32 model's bits): the same for every
row, so the above holds in each mode.

The references the tests hold the kernels to: ``F.linear``; ``kernels.triton_fused``'s
``rmsnorm_residual_ref``, ``silu_and_mul_ref``, ``rope_write_kv_ref``; ``kernels.triton_attention``'s
``paged_attention_ref``.

Build: ``kernels/cpu_build.py`` compiles them with this machine's compiler, once per source, flag and
CPU change; ``python -m kernels.cpu_native`` builds ahead (``make`` does). ``SPECRAY_CPU_KERNELS=0``
turns the kernels off; without a compiler ``load()`` returns False and ``unavailable_reason()`` says
why, and the model keeps the oneDNN products and the torch attention.
"""
from __future__ import annotations

import contextlib
import logging
import os
import platform
import threading

import torch

from kernels.cpu_build import build, build_root

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict = {"ok": None, "why": None, "name": None}


def load() -> bool:
    """Whether the kernels are loaded; builds them on the first call (thread-safe, once per process)."""
    if _state["ok"] is not None:
        return _state["ok"]
    with _lock:
        if _state["ok"] is None:
            _state["ok"], _state["why"] = _try_load()
            if not _state["ok"]:
                log.warning("specray CPU kernels unavailable (%s): oneDNN products and torch attention instead",
                            _state["why"])
    return _state["ok"]


def _require_loaded() -> None:
    """Load the kernels, or raise the error every caller that needs them gives."""
    if not load():
        raise RuntimeError(f"the specray CPU kernels cannot be used: {unavailable_reason()}")


def _try_load() -> tuple[bool, str | None]:
    if os.environ.get("SPECRAY_CPU_KERNELS", "1") == "0":
        return False, "turned off by SPECRAY_CPU_KERNELS=0"
    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        return False, f"no build for {platform.machine()}"
    activations = activations_mode()  # a bad value is the caller's error, not a reason to fall back
    try:
        _state["name"] = build()
        _bind()
        _set_activations(activations)
    except Exception as e:  # no compiler, no ninja, a compile error: the caller falls back
        return False, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else e!r}"
    return True, None


ACTIVATIONS = {"int16": 16, "int8": 8, "float32": 32}  # SPECRAY_CPU_ACTIVATIONS: what products over GGUF blocks multiply


def _activations_named(mode: str, what: str) -> str:
    if mode not in ACTIVATIONS:
        raise ValueError(f"{what}{mode!r} is not one of {', '.join(ACTIVATIONS)}")
    return mode


def activations_mode() -> str:
    """``SPECRAY_CPU_ACTIVATIONS``: ``int16`` (default: csrc/linear_fixed.cpp), ``int8`` (the same in 8
    bits: ~20% cheaper verification, logits further from the fp32 model's) or ``float32`` (its bits)."""
    return _activations_named(os.environ.get("SPECRAY_CPU_ACTIVATIONS", "int16"), "SPECRAY_CPU_ACTIVATIONS=")


def _set_activations(mode: str) -> None:
    torch.ops.specray_cpu.set_product_activations(ACTIVATIONS[mode])


def set_activations(mode: str) -> str:
    """What this process's products over GGUF blocks multiply from now on (``int16``, ``int8`` or ``float32``);
    returns the mode before. Tests and A/B benchmarks switch; a server keeps its environment's."""
    _activations_named(mode, "activations ")
    _require_loaded()
    before = activations_in_effect()
    _set_activations(mode)
    return before


def activations_in_effect() -> str:
    """What this process's products over GGUF blocks multiply now (the kernels loaded)."""
    return {v: k for k, v in ACTIVATIONS.items()}[int(torch.ops.specray_cpu.product_activations())]


def use_activations(mode: str, device) -> None:
    """An engine's ``cpu_activations`` in the process that runs its target (process-wide, like
    SPECRAY_CPU_ACTIVATIONS, and it stays after the engine): ``auto`` keeps what the process has;
    another mode needs a CPU device and the built kernels (a clear error naming the value else)."""
    if mode == "auto":
        return
    _activations_named(mode, "cpu_activations=")
    if torch.device(device).type != "cpu":
        raise ValueError(f"cpu_activations={mode!r} picks what the native CPU kernels multiply; this target runs "
                         f"on {device}: leave it 'auto'")
    if not load():
        raise ValueError(f"cpu_activations={mode!r} needs the native CPU kernels, which cannot be used here: "
                         f"{unavailable_reason()}")
    set_activations(mode)


@contextlib.contextmanager
def activations(mode: str):
    """``set_activations(mode)`` for the ``with`` block, the mode before restored after it."""
    before = set_activations(mode)
    try:
        yield
    finally:
        set_activations(before)


def set_attention_segment(keys: int) -> int:
    """The visible keys per segment of this process's attention arithmetic from now on (``csrc/attention.cpp``:
    512 by default; 0: each row's keys as one segment, the arithmetic before segments); returns the
    value before. Rows of more keys than a segment get other bits after a change: tests and A/B
    benchmarks switch it, never a process while it serves."""
    _require_loaded()
    before = int(_attention_segment())
    _set_attention_segment(int(keys))
    return before


# the phases of a decoder_layers call that phase_timing tells apart (csrc/kernels.h's Phase order)
PHASES = ("norms", "qkv", "rope + kv write", "attention", "o", "gate_up", "silu * up", "down")


@contextlib.contextmanager
def phase_timing():
    """Inside the block every ``decoder_layers`` call (the target's forward, and the EAGLE head's
    drafting steps, which run one) sums the calling thread's wall time per phase (``PHASES``; norms
    include their residual adds and the final norm). Yields ``read()``: seconds per phase since the
    last read (or the block's start), as a dict, then counted from zero again."""
    _require_loaded()

    def read() -> dict[str, float]:
        return dict(zip(PHASES, _phase_times().tolist()))

    before = bool(_set_phase_timing(True))
    read()
    try:
        yield read
    finally:
        _set_phase_timing(before)


@contextlib.contextmanager
def attention_segment(keys: int):
    """``set_attention_segment(keys)`` for the ``with`` block, the value before restored after it."""
    before = set_attention_segment(keys)
    try:
        yield
    finally:
        set_attention_segment(before)


def unavailable_reason() -> str | None:
    """Why ``load()`` returned False (None when the kernels are loaded or not yet tried)."""
    return _state["why"]


def _bind() -> None:
    """Module-level handles on the ops' default overloads (an attribute lookup less per call)."""
    ops = torch.ops.specray_cpu
    for name in _OPS:
        globals()[f"_{name}"] = getattr(ops, name).default


_OPS = ("pack_linear", "linear", "rmsnorm", "rmsnorm_residual", "silu_and_mul", "rope_write_kv", "paged_attention",
        "decoder_layers", "has_avx512", "argmax_rows", "set_product_activations", "product_activations",
        "top_logprobs", "head_step", "set_attention_segment", "attention_segment", "copy_kv_slots",
        "set_phase_timing", "phase_times", "sample_logits", "softmax_at", "sample_residual_logits")


def _first_call(name: str):
    """The op's stand-in until the kernels are loaded: loads them (or says why it cannot), then calls."""
    def call(*args, **kwargs):
        _require_loaded()
        return globals()[f"_{name}"](*args, **kwargs)
    return call


for _name in _OPS:
    globals()[f"_{_name}"] = _first_call(_name)


def has_avx512() -> bool:
    """Whether the build uses AVX-512 (else 16-lane arrays the compiler vectorises as it can)."""
    return load() and bool(_has_avx512())


# ---------------------------------------------------------------- the kernels (call load() first)

def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] fp32 -> packed [ceil(N / 16), K, 16]: tile t holds columns 16t.., zero past N."""
    return _pack_linear(weight)


def linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (rows contiguous) @ W^T + bias -> [M, n] over ``pack_linear(W)``."""
    return _linear(x, packed, n, bias)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [N, H] -> x * rsqrt(mean(x^2) + eps) * weight [N, H]."""
    return _rmsnorm(x, weight, eps)


def rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """x, residual [N, H] -> (rmsnorm(x + residual) [N, H], x now holding x + residual)."""
    return _rmsnorm_residual(x, residual, weight, eps), x


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [N, 2I] (gate | up) -> silu(gate) * up [N, I]."""
    return _silu_and_mul(x)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, V] fp32 (rows contiguous) -> int64 [N]: ``x.argmax(-1)``'s answer (the first maximum, the
    first NaN where a row has one) in two vector passes per row (torch's CPU argmax: ~35 us a row of
    49,152 logits on the 2-core Xeon VM)."""
    return _argmax_rows(x)


def top_logprobs(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, V] fp32 (rows contiguous) -> (values [N, k], indices [N, k] int64): ``torch.log_softmax(x,
    -1).topk(k)`` (best first; equal values in index order) in three vector passes a row."""
    return _top_logprobs(x, k)


def sample_logits(x: torch.Tensor, temperature: float, u: float) -> int:
    """One token drawn from softmax(x / temperature), x a contiguous [V] fp32 row, by inverting its CDF
    at the uniform draw u in [0, 1): the first token whose cumulative mass exceeds u times the total
    (a token without mass is never drawn), in two passes over the row and no buffer made. -1 where the
    row has a NaN or +inf logit or no mass at all (the torch path decides those)."""
    return _sample_logits(x, temperature, u)


def softmax_at(x: torch.Tensor, temperature: float, token: int) -> float:
    """softmax(x / temperature)[token] of a contiguous [V] fp32 row, in two passes over the row and no
    buffer made; -1.0 where the row has a NaN or +inf logit or no mass."""
    return _softmax_at(x, temperature, token)


_NO_IDS = torch.empty(0, dtype=torch.int64)
_NO_Q = torch.empty(0, dtype=torch.float32)


def sample_residual_logits(x: torch.Tensor, temperature: float, u: float, token: int,
                           ids: torch.Tensor | None = None, q: torch.Tensor | None = None) -> int:
    """One token drawn from norm(max(0, p - q)) where p = softmax(x / temperature) of a contiguous [V]
    fp32 row and q the proposal a rejected draft came from: mass q [S] fp32 on the token ids [S] int64,
    or (both None) a delta at ``token``; by inverting the residual's CDF at the uniform draw u, with
    no vocabulary-sized buffer made. -1 as ``sample_logits``; -2 where float error leaves the
    residual no mass (draw from p then, as ``actors.spec_verify`` does)."""
    return _sample_residual_logits(x, temperature, u, token, _NO_IDS if ids is None else ids,
                                   _NO_Q if q is None else q)


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, h: int, kvh: int) -> torch.Tensor:
    """qkv [N, (h + 2 kvh) d]; cos/sin N rows of d/2; slot_mapping [N] int64; caches [blocks, bs, kvh, d]
    -> rotated q [N, h, d], after writing rotated k and v at the slots."""
    return _rope_write_kv(qkv, cos, sin, slot_mapping, k_cache, v_cache, h, kvh)


def copy_kv_slots(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], src: torch.Tensor,
                  dst: torch.Tensor) -> None:
    """``actors.model.attention.copy_kv_slots`` in one op: the K/V rows of slots src [M] (int64) copied to
    slots dst [M] in every layer's caches (contiguous [blocks, bs, kvh, d], fp32 or bf16), every source
    read before any destination is written (two torch ops per cache instead: 120 for the default model)."""
    _copy_kv_slots(k_caches, v_caches, src, dst)


_NO_BIAS = torch.empty(0)  # decoder_layers' stand-in for an absent bias


def bias_arg(bias: torch.Tensor | None) -> torch.Tensor:
    """A product's bias as decoder_layers takes it (an empty tensor for None); no dispatcher op."""
    return _NO_BIAS if bias is None else bias


_CAUSAL = torch.empty(0, 0, dtype=torch.bool)  # a sequence without a window mask


def windows_arg(windows: list[torch.Tensor | None] | None) -> list[torch.Tensor]:
    """Per-sequence window masks ([q_b, w_b] bool; None = causal) as the kernels take them (an empty
    tensor for None); no dispatcher op."""
    return [] if not windows else [_CAUSAL if w is None else w for w in windows]  # []: every sequence causal


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                    kv_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                    windows: list[torch.Tensor | None] | None = None) -> torch.Tensor:
    """q [N, h, d]; caches [blocks, bs, kvh, d]; query_start_loc [B+1], kv_lens [B], block_tables [B, max_blocks]
    (int64) -> [N, h, d]. windows: per sequence a [q_b, w_b] bool mask over its last w_b key positions
    (a token tree's ancestor mask), or None = causal over its new tokens; None = all causal."""
    return _paged_attention(q, k_cache, v_cache, query_start_loc, kv_lens, block_tables, scale, windows_arg(windows))


def decoder_layers(x: torch.Tensor, weights: list[torch.Tensor], k_caches: list[torch.Tensor],
                   v_caches: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                   query_start_loc: torch.Tensor, kv_lens: torch.Tensor, block_tables: torch.Tensor,
                   windows: list[torch.Tensor | None] | None, h: int, kvh: int, eps: float, scale: float,
                   final_norm: torch.Tensor) -> torch.Tensor:
    """Embeddings x [N, H] through every decoder layer and the final norm -> hidden [N, H], writing each
    layer's K/V: the kernels above in the layer-by-layer forward's order (the same bits), in one op.
    weights: 10 per layer (csrc/layers.cpp: norms, packed matrices, biases or empty tensors)."""
    return _decoder_layers(x, weights, k_caches, v_caches, cos, sin, slot_mapping, query_start_loc, kv_lens,
                           block_tables, windows_arg(windows), h, kvh, eps, scale, final_norm)


def head_step(tokens: torch.Tensor, feats: torch.Tensor, embed: torch.Tensor, fc: torch.Tensor,
              fc_bias: torch.Tensor | None, weights: list[torch.Tensor], k_cache: torch.Tensor, v_cache: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor, query_start_loc: torch.Tensor,
              kv_lens: torch.Tensor, block_tables: torch.Tensor, windows: list[torch.Tensor | None] | None, h: int,
              kvh: int, eps: float, scale: float, out_norm: torch.Tensor, lm: torch.Tensor, vocab: torch.Tensor,
              score_rows: torch.Tensor, top_k: int) -> tuple[torch.Tensor, ...]:
    """The EAGLE head's drafting step (csrc/eagle.cpp): tokens [N] int64 and feats [N, H] -> entries
    ``fc(embed[tokens] | feats)`` through ``decoder_layers`` (one layer; writes its K/V) and
    ``out_norm``; then for score_rows [R] int64: (their features [R, H], logits over the draft
    vocabulary [R, Vd] from the packed LM rows ``lm``, top_k target ids [R, k] (``vocab``'s entries)
    and their log-probabilities [R, k], as ``top_logprobs``)."""
    return _head_step(tokens, feats, embed, fc, bias_arg(fc_bias), weights, k_cache, v_cache, cos, sin, slot_mapping,
                      query_start_loc, kv_lens, block_tables, windows_arg(windows), h, kvh, eps, scale, out_norm, lm,
                      vocab, score_rows, top_k)


def main() -> int:
    """``python -m kernels.cpu_native``: build (or find) the kernels and say so; never fails the caller
    (the engine falls back without them), but says why they are missing."""
    if load():
        print(f"specray CPU kernels ready: {_state['name']} in {build_root()} (AVX-512: "
              f"{'yes' if has_avx512() else 'no'})")
    else:
        print(f"specray CPU kernels unavailable: {unavailable_reason()}; the CPU forward falls back to oneDNN "
              "products and torch attention (install g++ to get them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
