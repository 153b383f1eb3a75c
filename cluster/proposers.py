"""From a SpeculativeConfig to a proposer (pure wiring, no state of its own).

Everything a proposer may use of the target comes in a ``ProposerContext`` (its name, runner,
tokenizer, device, dtype, block size), never the engine: the in-process engine, a Ray replica and
tests build the same context.
"""
from __future__ import annotations

from collections.abc import Sequence

from actors.model.attention_backends import set_attention_backend
from actors.proposers.base import Proposer, ProposerContext
from actors.proposers.combined import FallbackProposer
from actors.proposers.model_draft import DraftModelProposer, LayerSkipProposer
from actors.proposers.ngram import NgramProposer
from actors.proposers.remote import RemoteProposer
from actors.proposers.worker import DrafterSpec
from actors.verifier import Verifier
from cluster.config import SpeculativeConfig
from cluster.tokenizer_check import check_draft_tokenizer, check_tokenizers_compatible


# --draft default drafts by lookup where a suffix of this many tokens recurs, by the head elsewhere.
# 24 bench500 prompts, c=1, adaptive (benchmarks/ARCHIVE.md): 2 -> 28.03 tok/s, 1 -> 28.10 (equal within
# noise); 2 leaves the head the positions where a single repeated token predicts little
LOOKUP_FIRST_MIN_MATCH = 2
# ... and, where it fills the head's node budget (lookup_width > 1), matches suffixes of up to this many
# tokens: the longest match is the likeliest to go on for ten tokens (width 1: ngram_max, as before)
LOOKUP_FILL_MAX_MATCH = 16


def build_proposer(spec: SpeculativeConfig, ctx: ProposerContext, draft_loaded=None) -> Proposer:
    """The in-process proposer of ``spec`` for the target described by ``ctx``; draft_loaded: a
    LoadedModel to reuse as the draft model (tests load once)."""
    proposer = _build_method(spec, ctx, draft_loaded)
    if spec.lookup_first and spec.method != "ngram":
        width = min(spec.lookup_width, spec.tree_width)  # within what the head reserves
        n_max = max(spec.ngram_max, LOOKUP_FILL_MAX_MATCH if width > 1 else LOOKUP_FIRST_MIN_MATCH)
        lookup = NgramProposer(max(spec.ngram_min, LOOKUP_FIRST_MIN_MATCH), n_max, width=width)
        return FallbackProposer(lookup, proposer)
    return proposer


def _build_method(spec: SpeculativeConfig, ctx: ProposerContext, draft_loaded=None) -> Proposer:
    if spec.method == "ngram":
        return NgramProposer(spec.ngram_min, spec.ngram_max)
    if spec.method == "layerskip":
        return LayerSkipProposer(ctx.verifier, spec.layerskip_layers)
    if spec.method == "draft":
        from actors.model.loader import load_model

        draft = draft_loaded or load_model(spec.draft_model, dtype=ctx.dtype, device=ctx.device)
        check_tokenizers_compatible(ctx.tokenizer, draft.tokenizer, ctx.model, spec.draft_model)
        set_attention_backend(draft.model, ctx.attention_backend, ctx.device)
        runner = Verifier(draft.model, ctx.verifier.num_blocks, ctx.block_size, ctx.device, ctx.dtype,
                          enforce_eager=ctx.enforce_eager)
        return DraftModelProposer(runner)
    if spec.method == "eagle":
        from actors.eagle.head import DEFAULT_HEADS
        from actors.proposers.eagle import build_eagle_proposer

        committed = DEFAULT_HEADS.get(ctx.model)
        if spec.eagle_head is None and committed is not None and not committed.exists():
            raise ValueError(f"--draft default: the EAGLE head for {ctx.model!r} is not trained and "
                             f"committed yet ({committed} is missing); use --draft ngram, or train one with "
                             f"`python -m training.train --out DIR` and pass --draft eagle:DIR/head.safetensors")
        return build_eagle_proposer(spec.eagle_head, ctx.model, ctx.verifier, spec.tree_width, spec.sampled_siblings)
    raise ValueError(f"speculative method {spec.method!r} has no proposer")


def build_remote_proposer(spec: SpeculativeConfig, ctx: ProposerContext, methods: Sequence[str] | None = None,
                          draft_tokenizer=None, **options) -> RemoteProposer:
    """From a SpeculativeConfig to drafter workers for the target of ``ctx`` (its tokenizer, KV block
    count, block size, dtype and device are reused). methods: one worker each, e.g. ["ngram", "draft"];
    default [spec.method]. The draft's tokenizer is checked against the target's here, on the driver,
    before any worker starts (draft_tokenizer overrides the one read from the draft's directory).
    options: RemoteProposer's (timeout_s, actor_options, ...)."""
    methods = list(methods or [spec.method])
    if "draft" in methods:
        check_draft_tokenizer(ctx.tokenizer, ctx.model, spec.draft_model, draft_tokenizer)
    dtype = str(ctx.dtype).removeprefix("torch.")
    specs = [DrafterSpec(m, spec.draft_model if m == "draft" else None, spec.ngram_min, spec.ngram_max,
                         ctx.verifier.num_blocks, ctx.block_size, dtype, device=str(ctx.device))
             for m in methods]
    return RemoteProposer(specs, **options)
