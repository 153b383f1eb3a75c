"""Attention backends: which attention (and fused small ops) a Llama-family model runs.

- ``torch``: ``actors.model.attention.paged_attention`` (pure torch; the reference and the CPU path);
- ``triton``: ``kernels.triton_attention.paged_attention``, one launch per layer reading the paged
  KV cache in place, fed from the ``ForwardBatch`` by ``triton_paged_attention`` below; with fused
  ops (on CUDA by default) also the Triton RMSNorm + residual and SiLU-and-multiply kernels and
  RoPE fused with the KV-cache write (``kernels.triton_fused``);
- ``native``: the C++ CPU kernels of ``kernels.cpu_native`` (fp32 models on CPU): attention reading
  the paged KV cache in place, RMSNorm (+ residual), SiLU-and-multiply and RoPE fused with the KV
  write, each one op per layer, with rows whose bits never depend on what shares the call;
- ``auto``: triton on CUDA; on CPU native for fp32 models when the kernels build, torch otherwise.

``set_attention_backend(model, name)`` sets the hooks on the model's modules (LlamaAttention's
``attend`` and ``rope_write_kv``, RMSNorm's ``fused_add_norm`` and ``fused_norm``, SwiGLUMLP's
``fused_act``); the
engine calls it once per model it runs. The Triton modules are imported only when chosen, so
``TRITON_INTERPRET=1`` (Triton on CPU, tests) may be set any time before the first triton model.
"""
from __future__ import annotations

import operator

import torch
from torch import nn

from actors.model.attention import paged_attention
from actors.model.batch import ForwardBatch
from actors.model.layers import RMSNorm, SwiGLUMLP
from actors.model.llama import LlamaAttention, LlamaForCausalLM, cos_sin_rows
from kernels import cpu_linear, cpu_native

BACKENDS = ("auto", "torch", "triton", "native")
CACHE_KEY = "triton_attention"
NATIVE_KEY = "native_attention"


def resolve_backend(name: str, device: torch.device | str, dtype: torch.dtype = torch.float32) -> str:
    """'auto' | 'torch' | 'triton' | 'native' -> the backend a model of ``dtype`` on ``device`` runs
    ('auto': triton on CUDA; native on CPU for fp32 when the C++ kernels load, else torch)."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    cpu = torch.device(device).type == "cpu"
    if name == "auto":
        if not cpu:
            return "triton" if torch.device(device).type == "cuda" else "torch"
        return "native" if dtype is torch.float32 and cpu_native.load() else "torch"
    if name == "native":
        if not cpu or dtype is not torch.float32:
            raise ValueError(f"attention backend 'native' runs float32 models on CPU (this one is {dtype} on "
                             f"{device}): use 'auto'")
        if not cpu_native.load():
            raise ValueError(f"attention backend 'native': the CPU kernels cannot be built here "
                             f"({cpu_native.unavailable_reason()}); use 'auto' or 'torch'")
    return name


def backend_runs(attend, dtype: torch.dtype) -> bool:
    """Whether a model of ``dtype`` can share a model's attention ``attend`` (and its fused RoPE + KV
    write): the native CPU kernels are float32 only (a bf16 EAGLE head keeps the torch attention)."""
    return attend is not native_paged_attention or dtype is torch.float32


def uses_native(model: nn.Module) -> bool:
    """Whether ``model`` runs the native CPU kernels (set_attention_backend(..., 'native'))."""
    attn = next((m for m in model.modules() if isinstance(m, LlamaAttention)), None)
    return attn is not None and attn.attend is native_paged_attention


def native_meta(batch: ForwardBatch) -> tuple:
    """(query_start_loc, kv_lens, block_tables, window masks) of the batch for the native kernels, made
    once per forward in ``batch.cache``."""
    meta = batch.cache.get(NATIVE_KEY)
    if meta is None:
        meta = batch.cache[NATIVE_KEY] = (_dense(batch.query_start_loc), _dense(batch.kv_lens),
                                          _dense(batch.block_tables), cpu_native.windows_arg(batch.window_masks))
    return meta


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t.contiguous()`` without its dispatcher call when ``t`` already is (a built batch's tensors are;
    a lone token's doubled batch holds broadcast views)."""
    return t if t.is_contiguous() else t.contiguous()


def native_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                           scale: float) -> torch.Tensor:
    """``paged_attention``'s contract on the C++ CPU kernel: q [N, h, d] -> [N, h, d]."""
    qsl, kv_lens, tables, windows = native_meta(batch)
    return cpu_native.paged_attention(q, k_cache, v_cache, qsl, kv_lens, tables, scale, windows)


def _layer_params(layers) -> list[tuple[bool, torch.Tensor]]:
    """(is a matrix to pack, tensor) in csrc/layers.cpp's order, 10 per layer."""
    out, bias = [], cpu_native.bias_arg
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        out += [(False, layer.input_layernorm.weight), (True, attn.qkv_proj.weight), (False, bias(attn.qkv_proj.bias)),
                (True, attn.o_proj.weight), (False, bias(attn.o_proj.bias)),
                (False, layer.post_attention_layernorm.weight), (True, mlp.gate_up_proj.weight),
                (False, bias(mlp.gate_up_proj.bias)), (True, mlp.down_proj.weight), (False, bias(mlp.down_proj.bias))]
    return out


_VERSION = operator.attrgetter("_version")


class NativeLayerArgs:
    """The tensors ``cpu_native.decoder_layers`` takes besides the batch, looked up once per model (a
    module attribute lookup per tensor per step cost ~0.8 ms of a 22 ms decode step): the 300 weight
    arguments with each matrix's packed copy, kept while no matrix changed in place (its
    ``_version``) and no packed copy was made or rebound (``cpu_linear.packing_generation``), where
    fetching each copy per step cost ~0.07 ms of a 4 ms one; and the caches' K and V lists, kept while
    the same (k, v) pairs are passed."""

    def __init__(self, layers):
        self.params = _layer_params(layers)
        # the matrices whose in-place changes show in their _version (inference tensors keep none)
        self.matrices = [t for is_matrix, t in self.params if is_matrix and not t.is_inference()]
        self.hooks = [layer._forward_pre_hooks for layer in layers]  # the dicts hooks are registered in
        self.key: tuple | None = None
        self.weights: list[torch.Tensor] = []
        self.kv_ids: list[int] = []
        self.kv: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])

    def hooked(self) -> bool:
        """Whether a layer carries a forward pre-hook (weight offload streams layers in from them)."""
        return any(self.hooks)

    def packed_weights(self) -> list[torch.Tensor]:
        versions = list(map(_VERSION, self.matrices))
        if self.key != (cpu_linear.packing_generation(), versions):
            packed = cpu_linear.reordered  # the packed copy of a matrix, made again if the matrix changed
            self.weights = [packed(t) if is_matrix else t for is_matrix, t in self.params]
            self.key = (cpu_linear.packing_generation(), versions)
        return self.weights

    def caches(self, kv_caches: list) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ids = [id(kv) for kv in kv_caches]
        if ids != self.kv_ids:
            self.kv = [kv[0] for kv in kv_caches], [kv[1] for kv in kv_caches]
            self.kv_ids = ids
        return self.kv


def native_decoder_layers(model: LlamaForCausalLM, x: torch.Tensor, rope, batch: ForwardBatch,
                          kv_caches: list) -> torch.Tensor | None:
    """Every decoder layer and the final norm as one native op (``cpu_native.decoder_layers``: the same
    kernels and bits as the layer-by-layer forward, without ~10 Python calls per layer): x [N, H]
    embeddings -> hidden [N, H]. None (the caller runs the layers one by one) with tensor parallelism,
    layers that carry hooks (weight offload streams layers in from them) or products not native."""
    layers = model.layers
    args = vars(model).get("_native_args")
    if args is None:
        args = model._native_args = NativeLayerArgs(layers)
    if model.tp.size != 1 or not cpu_linear.native() or args.hooked():
        return None
    k_caches, v_caches = args.caches(kv_caches[:len(layers)])
    qsl, kv_lens, tables, windows = native_meta(batch)
    cos, sin = cos_sin_rows(rope)
    first = layers[0].self_attn
    return cpu_native.decoder_layers(x, args.packed_weights(), k_caches, v_caches, cos, sin, batch.slot_mapping, qsl,
                                     kv_lens, tables, windows, first.num_heads, first.num_kv_heads,
                                     layers[0].input_layernorm.eps, first.scale, model.norm.weight)


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                           scale: float) -> torch.Tensor:
    """``paged_attention``'s contract on the Triton kernel: q [N, h, d] -> [N, h, d]. The tree masks and
    the split-K choice are made once per forward (from shapes only: no device sync) and kept in
    ``batch.cache`` for every layer."""
    from kernels import triton_attention as ta

    meta = batch.cache.get(CACHE_KEY)
    if meta is None:
        meta = batch.cache[CACHE_KEY] = triton_meta(q, k_cache, batch)
    tree, segments, (qsl, kv_lens, tables) = meta
    return ta.paged_attention(q, k_cache, v_cache, qsl, kv_lens, tables, scale, tree=tree, num_segments=segments)


def triton_meta(q: torch.Tensor, k_cache: torch.Tensor, batch: ForwardBatch) -> tuple:
    """What the Triton kernel needs of ``batch`` besides q and the caches, from shapes only (no
    device sync): (packed tree masks or None, split-K segments, (query_start_loc, kv_lens,
    block_tables) contiguous)."""
    from kernels import triton_attention as ta

    tree = ta.pack_tree_masks(batch.window_masks or [None] * batch.num_seqs, q.device)
    max_context = batch.block_tables.shape[1] * batch.block_size  # an upper bound of every kv_len
    segments = ta.choose_num_segments(q.shape[0], batch.num_seqs, k_cache.shape[-2], max_context)
    # the kernel indexes its metadata densely: a lone token's doubled batch (ForwardBatch.doubled,
    # on CPU) holds broadcast views of one row
    return tree, segments, (batch.query_start_loc.contiguous(), batch.kv_lens.contiguous(),
                            batch.block_tables.contiguous())


def set_attention_backend(model: nn.Module, name: str = "auto", device: torch.device | str | None = None,
                          fused_ops: bool | None = None) -> str:
    """Point ``model``'s attention at backend ``name`` ('auto' resolved for ``device``, default the
    model's parameters' device) and return the resolved name. fused_ops: also the fused Triton small
    ops (RMSNorm + residual, SiLU-and-multiply, RoPE + KV write); None = with triton on CUDA only."""
    if device is None:
        device = next(model.parameters()).device
    backend = resolve_backend(name, device, next(model.parameters()).dtype)
    use_triton = backend == "triton"
    fused = use_triton and (torch.device(device).type == "cuda" if fused_ops is None else fused_ops)
    attend, norm, act, rope, plain_norm = paged_attention, None, None, None, None
    if use_triton:
        from kernels.triton_attention import INTERPRETED

        if torch.device(device).type != "cuda" and not INTERPRETED:
            raise ValueError(f"attention backend 'triton' needs a CUDA device (the model is on {device}); on CPU "
                             "it runs only interpreted, for tests (TRITON_INTERPRET=1): use 'auto' or 'torch'")
        attend = triton_paged_attention
    if fused:
        from kernels import triton_fused

        norm, act, rope = triton_fused.rmsnorm_residual, triton_fused.silu_and_mul, triton_fused.rope_write_kv
    if backend == "native":
        attend, norm, act = native_paged_attention, cpu_native.rmsnorm_residual, cpu_native.silu_and_mul
        rope, plain_norm = cpu_native.rope_write_kv, cpu_native.rmsnorm
    for m in model.modules():
        if isinstance(m, LlamaForCausalLM):
            m.fused_layers = native_decoder_layers if backend == "native" else None
            vars(m).pop("_native_args", None)  # looked up again on the next forward
        elif isinstance(m, RMSNorm):
            m.fused_add_norm, m.fused_norm = norm, plain_norm
        elif isinstance(m, SwiGLUMLP):
            m.fused_act = act
        elif isinstance(m, LlamaAttention):
            m.attend, m.rope_write_kv = attend, rope
    return backend
