"""In-process backend of the sweep: ``LLMEngine``s over one loaded target.

The target (and each draft model) is loaded once per bench run and shared by every engine, and so
is the target's KV cache (engines run one after another). Each run starts on a fresh engine (a few
milliseconds: the weights, the KV cache and the session's proposer are reused) so that its prefix
cache is empty: no run profits from prompts that the warm-up or an earlier run cached. Chain
length K is a per-request ``spec_tokens``, so one engine configuration serves a whole group.
Per-request times are the engine's own (``RequestOutput.ttft_s``/``e2e_s``, measured from when the
request was added, which with ``concurrency`` in flight is when a closed-loop client would send it).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.prompt_set import BenchPrompt
from benchmarks.results import RequestRecord, Run, Variant
from benchmarks.sweep import RunOnce, request_seed


WARMUP_BATCH_TOKENS = 32  # per request of a warm-up batch


def engine_config(model: str, method: str, variants: tuple[Variant, ...], options: dict):
    """An engine configuration able to serve every variant of the group (options: EngineConfig fields)."""
    from cluster.config import EngineConfig, SpeculativeConfig

    tree = next((v.tree for v in variants if v.tree), None)
    max_k = max((v.spec_tokens or 0 for v in variants), default=0)
    spec = SpeculativeConfig.from_draft_arg(method, max_k, tree, adaptive=any(v.adaptive for v in variants),
                                            tree_width=variants[0].tree_width, tree_nodes=variants[0].tree_nodes)
    return EngineConfig(model=model, speculative=spec, **{k: v for k, v in options.items() if v is not None})


class EngineBackend:
    def __init__(self, model: str, max_tokens: int | None, seed: int | None = 0, warmup: int = 1,
                 engine_options: dict | None = None, warmup_batch: bool = False):
        """seed: of the first prompt's sampling (None: sampled requests get no seed); engine_options:
        EngineConfig fields every engine gets (num_threads, kv_cache_gb, dtype, device);
        warmup_batch: before each measured run, one unmeasured batch at the run's concurrency (the
        warm-up prompt, ``WARMUP_BATCH_TOKENS`` each): kernels that batch's shapes need are compiled
        and the adaptive policy has measured costs at that load, as a server in steady state has.
        Without it a run of a few seconds (a GPU's) also times that learning and compiling."""
        from actors.model.loader import load_model
        from cluster.runtime import resolve_device_dtype

        self.model, self.max_tokens, self.seed, self.warmup = model, max_tokens, seed, warmup
        self.warmup_batch = warmup_batch
        self.engine_options = {k: v for k, v in (engine_options or {}).items() if v is not None}
        self.device, self.dtype = resolve_device_dtype(self.engine_options.get("device", "auto"),
                                                       self.engine_options.get("dtype", "auto"))
        self.loaded = load_model(model, dtype=self.dtype, device=self.device)
        self._drafts: dict[str, object] = {}
        self._verifier = None  # the target's KV cache, reused by every engine

    def config(self, method: str, variants: tuple[Variant, ...]):
        return engine_config(self.model, method, variants, self.engine_options)

    def engine(self, cfg, proposer=None, spec_policy=None):
        from cluster.engine import LLMEngine

        spec = cfg.speculative
        draft = self._draft(spec.draft_model) if spec.method == "draft" and proposer is None else None
        engine = LLMEngine(cfg, loaded=self.loaded, draft_loaded=draft, verifier=self._verifier, proposer=proposer,
                           spec_policy=spec_policy)
        self._verifier = engine.verifier
        return engine

    def _draft(self, spec: str):
        from actors.model.loader import load_model

        if spec not in self._drafts:
            self._drafts[spec] = load_model(spec, dtype=self.dtype, device=self.device)
        return self._drafts[spec]

    @contextmanager
    def session(self, method: str, variants: tuple[Variant, ...], warmup_prompt: BenchPrompt) -> Iterator[RunOnce]:
        from actors.sampling_params import SamplingParams

        cfg = self.config(method, variants)
        first = self.engine(cfg)
        for _ in range(self.warmup):
            first.generate([warmup_prompt.prompt], SamplingParams(max_tokens=8), chat=True)
        # neither holds request state between runs (released on finish); the adaptive policy keeps
        # what it measured (costs per forward size, acceptance), as a server's engine does
        proposer, policy = first.proposer, first.spec_policy
        yield lambda v, prompts, c, t: self._run(self.engine(cfg, proposer, policy), method, v, prompts, c, t,
                                                 warmup_prompt)

    def _run(self, engine, method: str, variant: Variant, prompts: list[BenchPrompt], concurrency: int,
             temperature: float, warmup_prompt: BenchPrompt | None = None) -> Run:
        from actors.sampling_params import SamplingParams

        if self.warmup_batch and warmup_prompt is not None:
            n = min(concurrency, len(prompts))
            warm = SamplingParams(max_tokens=WARMUP_BATCH_TOKENS, temperature=temperature, ignore_eos=True,
                                  spec_tokens=None if variant.adaptive else variant.spec_tokens)
            engine.generate([warmup_prompt.prompt] * n, warm, chat=True, concurrency=n)

        params = [SamplingParams(max_tokens=p.budget(self.max_tokens), temperature=temperature,
                                 seed=request_seed(self.seed, i, temperature),
                                 spec_tokens=None if variant.adaptive else variant.spec_tokens)
                  for i, p in enumerate(prompts)]
        start = time.perf_counter()
        outs = engine.generate([p.prompt for p in prompts], params, chat=True, concurrency=concurrency)
        wall = time.perf_counter() - start
        records = [RequestRecord(p.category, o.num_output_tokens, o.e2e_s or 0.0, o.ttft_s, o.num_drafts,
                                 o.num_draft_tokens, o.num_accepted_tokens, list(o.accepted_per_pos),
                                 o.error if o.finish_reason == "error" else None)
                   for p, o in zip(prompts, outs)]
        return Run(method, variant, temperature, concurrency, wall, records)
