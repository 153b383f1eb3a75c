"""From a SpeculativeConfig to a proposer (pure wiring, no state of its own)."""
from __future__ import annotations

from actors.drafter import FallbackProposer, NgramProposer, Proposer
from actors.model_drafter import DraftModelProposer, LayerSkipProposer
from actors.verifier import Verifier
from cluster.config import SpeculativeConfig
from cluster.tokenizer_check import check_tokenizers_compatible


# --draft default drafts by lookup where a suffix of this many tokens recurs, by the head elsewhere.
# 24 bench500 prompts, c=1, adaptive (BENCHMARKS.md): 2 -> 28.03 tok/s, 1 -> 28.10 (equal within
# noise); 2 leaves the head the positions where a single repeated token predicts little
LOOKUP_FIRST_MIN_MATCH = 2


def build_proposer(spec: SpeculativeConfig, engine, draft_loaded=None) -> Proposer:
    """engine: the LLMEngine being built (its verifier, tokenizer and dtype are reused)."""
    proposer = _build_method(spec, engine, draft_loaded)
    if spec.lookup_first and spec.method != "ngram":
        lookup = NgramProposer(max(spec.ngram_min, LOOKUP_FIRST_MIN_MATCH), max(spec.ngram_max, LOOKUP_FIRST_MIN_MATCH))
        return FallbackProposer(lookup, proposer)
    return proposer


def _build_method(spec: SpeculativeConfig, engine, draft_loaded=None) -> Proposer:
    if spec.method == "ngram":
        return NgramProposer(spec.ngram_min, spec.ngram_max)
    if spec.method == "layerskip":
        return LayerSkipProposer(engine.verifier, spec.layerskip_layers)
    if spec.method == "draft":
        from actors.model.loader import load_model

        draft = draft_loaded or load_model(spec.draft_model, dtype=engine.dtype, device=engine.device)
        check_tokenizers_compatible(engine.tokenizer, draft.tokenizer, engine.config.model, spec.draft_model)
        runner = Verifier(draft.model, engine.verifier.num_blocks, engine.config.block_size,
                          engine.device, engine.dtype)
        return DraftModelProposer(runner)
    if spec.method == "eagle":
        from actors.eagle.head import DEFAULT_HEADS
        from actors.eagle.proposer import build_eagle_proposer

        committed = DEFAULT_HEADS.get(engine.config.model)
        if spec.eagle_head is None and committed is not None and not committed.exists():
            raise ValueError(f"--draft default: the EAGLE head for {engine.config.model!r} is not trained and "
                             f"committed yet ({committed} is missing); use --draft ngram, or train one with "
                             f"`python -m training.train --out DIR` and pass --draft eagle:DIR/head.safetensors")
        return build_eagle_proposer(spec.eagle_head, engine.config.model, engine.verifier, spec.tree_width)
    raise ValueError(f"speculative method {spec.method!r} has no proposer")
