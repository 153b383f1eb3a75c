"""Engines for the KV benchmarks (benchmarks/multiturn.py, benchmarks/preemption_bench.py): one loaded
model, an engine per configuration with KV pools of its own, each warmed up on an unrelated prompt;
and the greedy sampling they run."""
from __future__ import annotations

import random

from benchmarks.multiturn_workload import document_ids


class EngineFactory:
    """Engines over one loaded model (loaded once; each engine gets its own KV pools)."""

    def __init__(self, model: str, loaded, device: str = "auto", draft: str = "none", threads: int | None = None,
                 block_size: int = 16):
        self.model, self.loaded, self.device, self.draft = model, loaded, device, draft
        self.threads, self.block_size = threads, block_size

    def make(self, num_kv_blocks: int, max_num_seqs: int, kv_offload: dict | None = None):
        from cluster.config import EngineConfig, SpeculativeConfig
        from cluster.engine import LLMEngine

        spec = SpeculativeConfig.from_draft_arg(self.draft, 5, None, adaptive=True)
        cfg = EngineConfig(model=self.model, device=self.device, speculative=spec, max_num_seqs=max_num_seqs,
                           block_size=self.block_size, num_kv_blocks=num_kv_blocks, num_threads=self.threads,
                           kv_offload=kv_offload or {})
        engine = LLMEngine(cfg, loaded=self.loaded)
        warm = document_ids(engine.tokenizer, random.Random("warmup"), min(600, engine.max_model_len // 2), 0)
        engine.generate([warm[::-1]], greedy_params(4))  # reversed: no prefix in common with the workload
        return engine


def greedy_params(max_tokens: int, ignore_eos: bool = False):
    from actors.sampling_params import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)


# ---- 1. multi-turn ------------------------------------------------------------------------------
