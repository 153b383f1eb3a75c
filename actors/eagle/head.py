"""The EAGLE head: one Llama decoder layer that predicts the target's next feature from its current
feature and the next token, and a reduced-vocabulary LM head on top.

Entry t of a sequence is ``fc(concat(embed(x_{t+1}), f_t))`` at RoPE position t, where f_t is the
target's final-normed hidden state at position t. The layer (attending over entries 0..t) and a
final RMSNorm give f̂_{t+1}; its logits over the draft vocabulary are ``f̂ @ lm_head[draft_vocab].T``,
so the draft token is the target's likely token at t+2. A draft step feeds (drafted token, f̂) back in.

Why a reduced vocabulary: the target's 576 x 49,152 LM head is 21% of its weights; the most frequent
few thousand tokens cover ~90% of what it emits, at a tenth of the cost. The target's embedding and
LM head are borrowed at ``attach`` (never saved): the file holds fc, the layer, the norm and the
vocabulary ids (a few MB in fp16).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from actors.model.attention import write_kv
from actors.model.layers import RotaryEmbedding, apply_rotary
from kernels import cpu_native
from kernels.cpu_linear import linear, reordered, store_as

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEFAULT_HEADS = {"smollm2-135m": WEIGHTS_DIR / "smollm2-135m.safetensors"}  # model alias -> committed head


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    target_vocab_size: int
    draft_vocab_size: int
    rope_scaling: dict | None = None
    target: str = ""  # what it was trained for (shown in mismatch errors)

    @staticmethod
    def for_target(model_config, draft_vocab_size: int, target: str = "") -> "HeadConfig":
        c = model_config
        return HeadConfig(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                          c.rms_norm_eps, c.rope_theta, c.max_position_embeddings, c.vocab_size,
                          min(draft_vocab_size, c.vocab_size), c.rope_scaling, target)


@dataclass(frozen=True)
class NativeWeights:
    """The packed tensors the native drafting step reads (kernels/csrc/eagle.cpp)."""

    fc: torch.Tensor  # fc's matrix, packed
    layer: list  # the decoder layer's 10 tensors (EagleHead.layer_weights)
    lm: torch.Tensor  # the LM head rows of the draft vocabulary, packed


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, w.shape, w, eps)


def _silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [..., 2I] (gate | up) -> [..., I]
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)``, through the CPU few-row products when drafting (training batches keep F.linear)."""
    return linear(x, layer.weight, layer.bias)


class EagleHead(nn.Module):
    rope_write_kv = None  # the target's fused RoPE + KV write (kernels.triton_fused), when it runs one
    # (x, weight, eps) -> RMSNorm(x) and [N, 2I] -> silu(gate) * up: the native CPU kernels when drafting
    # beside a target that runs them (build_eagle_proposer); training keeps these autograd-able ones
    norm = staticmethod(_rms)
    act = staticmethod(_silu_and_mul)
    native_layer = False  # drafting steps run as one native op (proposers/head_kv.native_head_step)

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.input_norm = nn.Parameter(torch.ones(h))
        self.qkv = nn.Linear(h, (cfg.num_heads + 2 * cfg.num_kv_heads) * d, bias=False)
        self.o = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.out_norm = nn.Parameter(torch.ones(h))
        self.register_buffer("draft_vocab", torch.arange(cfg.draft_vocab_size, dtype=torch.int64))
        self.rotary = RotaryEmbedding(d, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.embed: torch.Tensor | None = None  # [V, H] the target's input embedding (borrowed)
        self.lm_rows: torch.Tensor | None = None  # [Vd, H] the target's LM head rows of draft_vocab
        self.target_lm_head: torch.Tensor | None = None  # [V, H] the target's whole LM head (borrowed)
        self._native: NativeWeights | None = None  # native_weights(), once looked up

    # ---- wiring to a target --------------------------------------------------------------
    def attach(self, target, target_name: str = "the target") -> "EagleHead":
        """Borrow the target's embedding and LM head rows (a LlamaForCausalLM, TP size 1)."""
        check_compatible(self.cfg, target.config, self.cfg.target or "this head", target_name)
        self.embed = target.embed_tokens.weight.detach()
        self.target_lm_head = target.lm_head.weight.detach()
        self.lm_rows = self.target_lm_head[self.draft_vocab].to(self.fc.weight.dtype).contiguous()
        self._native = None
        return self

    def store_matrices(self, dtype: torch.dtype | str) -> bool:
        """Products read the head's matrices (and its LM head rows, once attached) packed in ``dtype``
        (``kernels.cpu_linear.store_as``: bf16 halves the bytes per draft step, "Q8_0" cuts them 3.8x);
        False where the products cannot (no native CPU kernels, or not an fp32 head)."""
        mats = [self.fc.weight, self.qkv.weight, self.o.weight, self.gate_up.weight, self.down.weight]
        mats += [self.lm_rows] if self.lm_rows is not None else []
        self._native = None
        return all([store_as(w, dtype) for w in mats])

    def native_weights(self) -> NativeWeights:
        """The packed matrices of a drafting head (attached, fp32, matrices stored once by
        ``store_matrices``), looked up once: a per-step lookup of its 13 tensors costs ~25 us."""
        if self._native is None:
            self._native = NativeWeights(reordered(self.fc.weight), self.layer_weights(), reordered(self.lm_rows))
        return self._native

    def layer_weights(self) -> list[torch.Tensor]:
        """The decoder layer's tensors in ``kernels/csrc/layers.cpp``'s order, matrices packed as its
        products read them (``kernels.cpu_linear.reordered``), an empty tensor for an absent bias."""
        bias = cpu_native.bias_arg
        return [self.input_norm, reordered(self.qkv.weight), bias(self.qkv.bias), reordered(self.o.weight),
                bias(self.o.bias), self.post_norm, reordered(self.gate_up.weight), bias(self.gate_up.bias),
                reordered(self.down.weight), bias(self.down.bias)]

    def init_from_target(self, target) -> None:
        """Warm start: the layer from the target's last decoder layer, the output norm from its final
        norm, and fc passing the feature through un-normed (f / final norm weight), so the head
        starts as 'one more target layer' whose output is close to its input feature."""
        last, h = target.layers[-1], self.cfg.hidden_size
        w = target.norm.weight.detach().float()
        with torch.no_grad():
            self.input_norm.copy_(last.input_layernorm.weight)
            self.qkv.weight.copy_(last.self_attn.qkv_proj.weight)
            self.o.weight.copy_(last.self_attn.o_proj.weight)
            self.post_norm.copy_(last.post_attention_layernorm.weight)
            self.gate_up.weight.copy_(last.mlp.gate_up_proj.weight)
            self.down.weight.copy_(last.mlp.down_proj.weight)
            self.out_norm.copy_(target.norm.weight)
            self.fc.weight.mul_(0.1)
            self.fc.weight[:, h:].add_(torch.diag(1.0 / w.clamp(min=1e-2)))
            self.fc.bias.zero_()

    # ---- the block -----------------------------------------------------------------------
    def entry(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """tokens [...] int64 (x_{t+1}), feats [..., H] (f_t or a predicted f̂) -> residual input [..., H]."""
        emb = F.embedding(tokens, self.embed).to(feats.dtype)
        return _linear(self.fc, torch.cat((emb, feats), dim=-1))

    def qkv_rope(self, h: torch.Tensor, positions: torch.Tensor):
        """h [N, H], positions [N] -> q [N, nh, d], k [N, nkv, d], v [N, nkv, d] (RoPE applied)."""
        c = self.cfg
        n, nh, nkv, d = h.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
        qkv, cos, sin = self._qkv_tables(h, positions)
        qk = apply_rotary(qkv[:, : (nh + nkv) * d].view(n, nh + nkv, d), cos, sin)
        q, k = qk.split((nh, nkv), dim=1)
        return q, k, qkv[:, (nh + nkv) * d:].reshape(n, nkv, d)

    def qkv_rope_write(self, h: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """h [N, H], positions [N], slots [N] -> q [N, nh, d]; the rotated k and v are written at
        ``slots`` of k_cache/v_cache [blocks, bs, nkv, d] (with the fused kernel a slot < 0 writes nothing)."""
        if self.rope_write_kv is None:
            q, k, v = self.qkv_rope(h, positions)
            write_kv(k_cache, v_cache, k, v, slots)
            return q
        qkv, cos, sin = self._qkv_tables(h, positions)
        return self.rope_write_kv(qkv, cos, sin, slots, k_cache, v_cache, self.cfg.num_heads, self.cfg.num_kv_heads)

    def _qkv_tables(self, h: torch.Tensor, positions: torch.Tensor):
        """h [N, H], positions [N] -> qkv [N, (nh + 2 nkv) d] and RoPE cos, sin [N, 1, d / 2] in h's dtype."""
        qkv = _linear(self.qkv, self.norm(h, self.input_norm, self.cfg.rms_norm_eps))
        cos, sin = self.rotary.cos_sin(positions)
        return qkv, cos.to(h.dtype), sin.to(h.dtype)

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """h [N, H] residual input, attn [N, nh * d] -> predicted next feature f̂ [N, H]."""
        eps = self.cfg.rms_norm_eps
        h = h + _linear(self.o, attn)
        h = h + _linear(self.down, self.act(_linear(self.gate_up, self.norm(h, self.post_norm, eps))))
        return self.norm(h, self.out_norm, eps)

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [..., H] -> logits over the draft vocabulary [..., Vd]."""
        return linear(feats.to(self.lm_rows.dtype), self.lm_rows)

    @torch.no_grad()
    def target_logsumexp(self, feats: torch.Tensor, temperature: float, rows: int = 512) -> torch.Tensor:
        """feats [..., H] -> [...]: log of the target's softmax normaliser over its whole vocabulary
        at ``temperature`` (chunks of ``rows`` positions: a [rows, V] block at a time)."""
        flat = feats.reshape(-1, feats.shape[-1])
        w = self.target_lm_head
        out = [torch.logsumexp(linear(c.to(w.dtype), w).float() / temperature, dim=-1) for c in flat.split(rows)]
        return torch.cat(out).view(feats.shape[:-1]) if out else flat.new_zeros(feats.shape[:-1])

    # ---- files ---------------------------------------------------------------------------
    def save(self, path: str | Path, info: dict | None = None) -> None:
        from safetensors.torch import save_file

        state = {k: v.detach().to(torch.float16).contiguous() for k, v in self.named_parameters()}
        state["draft_vocab"] = self.draft_vocab.to(torch.int32).contiguous()
        meta = {"format": "specray-eagle-head", "config": json.dumps(asdict(self.cfg)),
                "info": json.dumps(info or {})}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(path), metadata=meta)


def load_head(path: str | Path, dtype: torch.dtype = torch.float32) -> EagleHead:
    """Read a head file written by ``EagleHead.save``; clear errors for a missing or foreign file."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"EAGLE head {str(path)!r} does not exist; train one with "
                         f"`python -m training.train --out DIR` and pass --draft eagle:DIR/head.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != "specray-eagle-head":
            raise ValueError(f"{str(path)!r} is not an EAGLE head file (no specray-eagle-head metadata)")
        cfg = HeadConfig(**json.loads(meta["config"]))
        state = {k: f.get_tensor(k) for k in f.keys()}
    head = EagleHead(cfg)
    head.load_state_dict({k: v.long() if k == "draft_vocab" else v.to(dtype) for k, v in state.items()})
    return head.to(dtype).eval().requires_grad_(False)


def check_compatible(cfg: HeadConfig, model_config, head_name: str, target_name: str) -> None:
    """The head must match the target's hidden size, vocabulary and attention shape."""
    c = model_config
    theirs = (c.hidden_size, c.vocab_size, c.head_dim)
    ours = (cfg.hidden_size, cfg.target_vocab_size, cfg.head_dim)
    if ours != theirs:
        raise ValueError(f"EAGLE head {head_name} was trained for a target with hidden size {cfg.hidden_size}, "
                         f"vocabulary {cfg.target_vocab_size} and head_dim {cfg.head_dim}, but {target_name} has "
                         f"hidden size {c.hidden_size}, vocabulary {c.vocab_size} and head_dim {c.head_dim}; "
                         f"train a head for it with `python -m training.train --model ... --out DIR`")
