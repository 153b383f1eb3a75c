"""Llama-family causal LM (Llama, Mistral, Qwen2, SmolLM2) over a paged KV cache, tensor-parallel aware.

``forward`` runs the flattened ``ForwardBatch`` (all sequences, all tree tokens) in one pass and
returns final-normed hidden states; ``compute_logits`` applies the LM head to the rows that need it.
``num_layers=n`` runs only the first n decoder layers (layer-skip self-draft), then the final norm.
Parameters never require grad; wrap calls in ``torch.inference_mode()`` in the engine.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from actors.model.attention import allocate_kv_cache, paged_attention, write_kv
from actors.model.batch import ForwardBatch
from actors.model.config import ModelConfig
from actors.model.layers import (
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    SwiGLUMLP,
    TPContext,
    VocabParallelEmbedding,
)
from actors.model.rope import RotaryEmbedding, apply_rotary_halves
from kernels import cpu_linear

KVCache = tuple[torch.Tensor, torch.Tensor]  # k, v: [num_blocks, block_size, kv_heads_per_rank, head_dim]
Rope = tuple[torch.Tensor, torch.Tensor]  # cos [N, 1, 1, head_dim // 2], signed sin [N, 1, 2, head_dim // 2]

# (our fused parameter, HF name part, shard id)
_STACKED = (
    (".qkv_proj.", ".q_proj.", "q"),
    (".qkv_proj.", ".k_proj.", "k"),
    (".qkv_proj.", ".v_proj.", "v"),
    (".gate_up_proj.", ".gate_proj.", 0),
    (".gate_up_proj.", ".up_proj.", 1),
)


_ROPE_ROWS = "rope_cos_sin_rows"


def cos_sin_rows(rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused RoPE kernels' operands: cos and +sin, N rows of d / 2 with one row stride (the signed
    table's second half; halves_tables' views of one [N, 3, d / 2] lookup share the row stride)."""
    cos, signed_sin = rope
    sin = signed_sin[:, :, 1]
    return (cos, sin) if sin.stride(0) == cos.stride(0) else (cos.contiguous(), sin.contiguous())


class LlamaAttention(nn.Module):
    attend = staticmethod(paged_attention)  # the attention backend (actors.model.attention_backends)
    rope_write_kv = None  # fused RoPE + KV write (qkv, cos, sin, slots, k_cache, v_cache, h, kvh) -> q

    def __init__(self, config: ModelConfig, tp: TPContext, dtype: torch.dtype):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(config, tp, dtype)
        self.o_proj = RowParallelLinear(config.q_size, config.hidden_size, config.o_proj_bias, tp, dtype)
        self.num_heads = self.qkv_proj.heads_per_rank
        self.num_kv_heads = self.qkv_proj.kv_heads_per_rank
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, batch: ForwardBatch) -> torch.Tensor:
        """x [N, H] -> [N, H]; writes this step's K/V at batch.slot_mapping first."""
        n, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [N, (h + 2 kvh) d]
        if self.rope_write_kv is not None:  # one launch: rotate q and k, write k and v
            # made by the first layer, read by every layer; keyed by this forward's tables (a CUDA graph
            # bucket's batch, and its cache, lives on across steps)
            made = batch.cache.get(_ROPE_ROWS)
            if made is None or made[0] is not rope:
                made = batch.cache[_ROPE_ROWS] = (rope, cos_sin_rows(rope))
            q = self.rope_write_kv(qkv, *made[1], batch.slot_mapping, kv_cache[0], kv_cache[1], h, kvh)
            out = self.attend(q, kv_cache[0], kv_cache[1], batch, self.scale)  # [N, h, d]
            return self.o_proj(out.view(n, h * d) if out.is_contiguous() else out.reshape(n, h * d))
        # views by as_strided: one op each, where view + slice/split take 2-4 (qkv [N, (h + 2 kvh) d] is contiguous)
        row = qkv.stride(0)
        halves = qkv.as_strided((n, h + kvh, 2, d // 2), (row, d, d // 2, 1))  # q and k: [N, heads, halves, d / 2]
        qk = apply_rotary_halves(halves, *rope)  # q and k rotated together: new [N, h + kvh, 2, d / 2]
        q = qk.as_strided((n, h, d), (qk.stride(0), d, 1))
        k = qk.as_strided((n, kvh, d), (qk.stride(0), d, 1), qk.storage_offset() + h * d)
        v = qkv.as_strided((n, kvh, d), (row, d, 1), qkv.storage_offset() + (h + kvh) * d)
        write_kv(kv_cache[0], kv_cache[1], k, v, batch.slot_mapping)
        out = self.attend(q, kv_cache[0], kv_cache[1], batch, self.scale)  # [N, h, d]
        return self.o_proj(out.view(n, h * d) if out.is_contiguous() else out.reshape(n, h * d))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPContext, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(config, tp, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, tp, dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope, kv_cache: KVCache,
                batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H], residual [N, H] or None -> (mlp output [N, H], residual [N, H]) (sum is the layer output)."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, kv_cache, batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    # (model, embeddings [N, H], rope, batch, kv_caches) -> final-normed hidden [N, H] from every layer in one
    # call, or None where it does not apply; set by attention_backends (the native CPU kernels)
    fused_layers = None

    def __init__(self, config: ModelConfig, tp: TPContext = TPContext.single(), dtype: torch.dtype | None = None):
        """Parameters are allocated uninitialised on the current default device; fill them with load_weights."""
        super().__init__()
        self.config, self.tp = config, tp
        self.dtype = dtype or torch.float32
        c = config
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size, tp, self.dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(c, tp, self.dtype) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, self.dtype)
        self.rotary = RotaryEmbedding(c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling, self.dtype)
        self.lm_head = ParallelLMHead(c.vocab_size, c.hidden_size, tp, self.dtype)
        if c.tie_word_embeddings:
            self.lm_head.tie(self.embed_tokens)

    # ------------------------------------------------------------------ forward

    def forward(self, batch: ForwardBatch, kv_caches: list[KVCache], num_layers: int | None = None) -> torch.Tensor:
        """One pass over batch.num_tokens tokens -> final-normed hidden [N, H].
        kv_caches: one (k, v) per layer, see ``kv_cache_shape``; only the layers run are written."""
        n = len(self.layers) if num_layers is None else num_layers
        if not 0 <= n <= len(self.layers):
            raise ValueError(f"num_layers={num_layers} is out of range; use 0..{len(self.layers)}")
        if len(kv_caches) < n:
            raise ValueError(f"{len(kv_caches)} KV caches given for {n} layers; allocate one per layer")
        x = self.embed_tokens(batch.input_ids)  # [N, H]
        rope = self.rotary.halves_tables(batch.positions)  # once per forward
        if self.fused_layers is not None and n == len(self.layers):
            out = self.fused_layers(self, x, rope, batch, kv_caches)
            if out is not None:
                return out
        lone = batch.num_tokens == 1 and x.device.type == "cpu" and cpu_linear.lone_row_doubled(x.dtype)
        if lone:  # oneDNN's products: two identical rows: no per-product padding (see ForwardBatch.doubled); rope broadcasts
            batch, x = batch.doubled(), x.expand(2, -1)
        residual = None
        for i in range(n):
            x, residual = self.layers[i](x, residual, rope, kv_caches[i], batch)
        x = self.norm(x) if residual is None else self.norm(x, residual)[0]
        return x[:1] if lone else x

    def compute_logits(self, hidden: torch.Tensor, gather: str = "all") -> torch.Tensor | None:
        """hidden [M, H] (only the rows that need logits) -> logits [M, vocab] float32.
        With tp > 1 and gather='rank0', ranks other than 0 get None."""
        return self.lm_head(hidden, gather)

    # ------------------------------------------------------------------ KV cache helpers

    @property
    def num_kv_heads_per_rank(self) -> int:
        return self.layers[0].self_attn.num_kv_heads

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        return (num_blocks, block_size, self.num_kv_heads_per_rank, self.config.head_dim)

    def allocate_kv_cache(self, num_blocks: int, block_size: int, device: Any = None) -> list[KVCache]:
        device = device if device is not None else self.embed_tokens.weight.device
        return allocate_kv_cache(len(self.layers), num_blocks, block_size, self.num_kv_heads_per_rank,
                                 self.config.head_dim, self.dtype, device)

    # ------------------------------------------------------------------ weights

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        """Load (HF name, full tensor or safetensors slice) pairs; each parameter reads its own shard.
        Raises ValueError for an unknown tensor name or a parameter left unloaded. Returns loaded names."""
        params = dict(self.named_parameters())
        shards: dict[str, set] = {}
        for hf_name, src in weights:
            if "rotary_emb." in hf_name:
                continue
            name = hf_name.removeprefix("model.")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            shard_id = None
            for fused, part, sid in _STACKED:
                if part in name:
                    name, shard_id = name.replace(part, fused), sid
                    break
            param = params.get(name)
            if param is None:
                raise ValueError(f"checkpoint tensor {hf_name!r} matches no parameter of LlamaForCausalLM; "
                                 "is this a Llama-family checkpoint?")
            param.weight_loader(param, src, shard_id)
            shards.setdefault(name, set()).add(shard_id)
        loaded = {n for n, ids in shards.items() if None in ids or ids in ({"q", "k", "v"}, {0, 1})}
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} parameters, e.g. {missing[:3]}; is it complete?")
        return loaded

    def param_bytes(self) -> int:
        """Bytes of this rank's parameters (shared tensors counted once)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())
