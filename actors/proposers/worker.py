"""DrafterWorker: a proposer in its own process (a Ray actor), fed small per-step metadata.

The class works in-process too (tests, one-process engines); ``drafter_actor_class()`` gives its
Ray actor form, which pins torch to ``spec.num_threads`` threads. The worker builds its proposer
from a small picklable ``DrafterSpec``: ``ngram`` (prompt lookup) or ``draft`` (a separate
same-tokenizer model with its own paged KV cache, loaded inside the worker). ``layerskip`` shares
the target's weights and KV cache, so it stays beside the verifier and is refused here.

Wire protocol (everything pickles; no torch.Generator crosses the wire):

- ``DraftCall``: one request for one step. The worker keeps each sequence's token history, so a
  call carries only the tokens appended since the last call it answered (``offset`` + ``tail``).
  If the worker lacks the history (a fresh replacement, or a call lost to a timeout), it returns a
  root-only tree and lists the sequence in ``DraftReply.resend``; the driver then sends the whole
  history next step.
- Sampling requests: a torch.Generator does not pickle. The driver draws ``seed`` from the
  request's own generator (so ``SamplingParams.seed`` still reproduces the request) and the worker
  samples its draft tokens with a generator seeded from it, returning in ``draft_probs`` the very q
  each token was drawn from; verification on the driver uses those q, so it stays lossless. The
  driver sends each worker its own seed, so two workers running the same draft model still make
  independent draws.
- ``released``: sequences that finished / were aborted / preempted, dropped before the step's calls.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field

import torch

from actors.gc_pauses import freeze_loaded
from actors.proposers.base import DraftRequest, Proposer
from actors.proposers.ngram import NgramProposer
from actors.sampling_params import SamplingParams
from actors.tree import TokenTree

DRAFTER_METHODS = ("ngram", "draft")
_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    """What one drafter worker runs. Small and picklable: the worker builds the proposer itself."""

    method: str  # "ngram" | "draft"
    draft_model: str | None = None  # local HF dir / .gguf / alias, for method "draft"
    ngram_min: int = 1
    ngram_max: int = 4
    num_blocks: int = 256  # draft-model KV cache: blocks of block_size tokens
    block_size: int = 16
    dtype: str = "float32"
    num_threads: int = 1  # torch threads inside the actor
    device: str = "cpu"  # "cuda" puts the draft model on the actor's GPU (give the actor num_gpus)

    def __post_init__(self) -> None:
        if self.method == "layerskip":
            raise ValueError("drafter method 'layerskip' shares the target's weights and KV cache; it runs "
                             "beside the verifier, not in a drafter worker (use 'ngram' or 'draft')")
        if self.method not in DRAFTER_METHODS:
            raise ValueError(f"drafter method {self.method!r} is not one of {DRAFTER_METHODS}")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("drafter method 'draft' needs draft_model (a local model path or alias)")
        if self.dtype not in _DTYPES:
            raise ValueError(f"drafter dtype {self.dtype!r} is not one of {_DTYPES}")
        for name in ("num_blocks", "block_size", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"drafter {name}={getattr(self, name)} must be >= 1")

    def describe(self) -> str:
        if self.method == "draft":
            return f"draft({self.draft_model})"
        return f"ngram({self.ngram_min}-{self.ngram_max})"


@dataclass(slots=True)
class DraftCall:
    """One request of one step, as sent to a worker."""

    seq_id: int
    offset: int  # tokens of this sequence the driver believes the worker already holds
    tail: list[int]  # token_ids[offset:]; the last one is the tree's root
    expansion: list[int]
    max_nodes: int
    params: SamplingParams
    seed: int | None = None  # sampling requests: seeds the worker's draft generator


@dataclass(slots=True)
class DraftReply:
    trees: list[TokenTree]  # one per call, in call order
    resend: list[int] = field(default_factory=list)  # seq_ids whose history the worker lacked
    compute_s: float = 0.0  # time spent inside the worker (the rest of a call's latency is transport)


def build_worker_proposer(spec: DrafterSpec) -> Proposer:
    """The proposer a worker runs. A draft model that fails to load raises ValueError naming it."""
    if spec.method == "ngram":
        return NgramProposer(spec.ngram_min, spec.ngram_max)
    from actors.model.loader import load_model
    from actors.proposers.model_draft import DraftModelProposer
    from actors.verifier import Verifier

    dtype, device = getattr(torch, spec.dtype), torch.device(spec.device)
    try:
        draft = load_model(spec.draft_model, dtype=dtype, device=device)
    except Exception as e:
        raise ValueError(f"drafter {spec.describe()}: cannot load draft model {spec.draft_model!r}: "
                         f"{type(e).__name__}: {e}") from e
    runner = Verifier(draft.model, spec.num_blocks, spec.block_size, device, dtype)
    return DraftModelProposer(runner)


class DrafterWorker:
    """Runs one proposer on batches of DraftCalls; keeps each sequence's token history."""

    def __init__(self, spec: DrafterSpec):
        self.spec = spec
        self.device = torch.device(spec.device)
        self.proposer = build_worker_proposer(spec)
        self.history: dict[int, list[int]] = {}
        self.num_calls = 0

    def propose(self, calls: list[DraftCall], released: list[int] | None = None) -> DraftReply:
        """released: seq_ids to drop first (batched release). Returns one tree per call."""
        t0 = time.perf_counter()
        if released:
            self.release(released)
        self.num_calls += 1
        reqs, idx, resend = [], [], []
        trees: list[TokenTree | None] = [None] * len(calls)
        for i, c in enumerate(calls):
            tokens = self._update_history(c)
            if tokens is None:
                resend.append(c.seq_id)
                trees[i] = TokenTree.root(c.tail[-1])
                continue
            gen = None if c.params.greedy else torch.Generator(self.device).manual_seed(int(c.seed or 0))
            reqs.append(DraftRequest(c.seq_id, tokens, list(c.expansion), c.max_nodes, c.params, gen, []))
            idx.append(i)
        if reqs:
            for i, tree in zip(idx, self.proposer.propose(reqs), strict=True):
                trees[i] = tree if self.device.type == "cpu" else _to_cpu(tree)
        return DraftReply(trees, resend, time.perf_counter() - t0)

    def _update_history(self, c: DraftCall) -> list[int] | None:
        """Append the call's tail to the held history; None when the worker lacks the prefix."""
        if not c.tail:
            raise ValueError(f"draft call for seq {c.seq_id} has no tokens (offset {c.offset}); "
                             "the tail must include at least the root token")
        held = self.history.get(c.seq_id)
        if held is None:
            if c.offset != 0:
                return None
            held = self.history[c.seq_id] = []
        if c.offset > len(held):
            self.release([c.seq_id])
            return None
        del held[c.offset:]  # a call the driver never saw answered may have appended already
        held.extend(c.tail)
        return held

    def release(self, seq_ids: list[int]) -> None:
        for s in seq_ids:
            self.history.pop(s, None)
            self.proposer.release(s)

    def ping(self) -> dict:
        alloc = getattr(self.proposer, "allocator", None)  # the draft model's own KV blocks
        return {"pid": os.getpid(), "drafter": self.spec.describe(), "num_calls": self.num_calls,
                "num_sequences": len(self.history), "threads": torch.get_num_threads(),
                "free_blocks": None if alloc is None else alloc.num_free_blocks,
                "gc_frozen_objects": gc.get_freeze_count()}  # actors/gc_pauses.py


def _to_cpu(tree: TokenTree) -> TokenTree:
    """Draft distributions travel to the driver as CPU tensors (it may have no GPU)."""
    tree.draft_probs = [None if q is None else q.cpu() for q in tree.draft_probs]
    return tree


class _DrafterActor(DrafterWorker):
    """Actor form: owns ``spec.num_threads`` torch threads in its own process."""

    def __init__(self, spec: DrafterSpec):
        torch.set_num_threads(spec.num_threads)
        super().__init__(spec)
        freeze_loaded()  # its own process for the deployment's lifetime (actors/gc_pauses.py)


_ACTOR_CLASS = None


def drafter_actor_class():
    """The Ray actor class of DrafterWorker (ray is imported only when this is first called)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        _ACTOR_CLASS = ray.remote(max_restarts=0, max_task_retries=0)(_DrafterActor)
    return _ACTOR_CLASS
