"""What every proposer is: one interface, batched across sequences, one token tree per request.

``Proposer`` declares every capability the engine's drafting uses, with defaults, so nothing is
duck-typed: whether it reads the target's features (``needs_hidden`` / ``observe``), what kind of
draft it would make now (``draft_source``; the adaptive policy keeps estimates per kind), how many
nodes per depth it drafts (``nodes_per_depth``) and how many distinct first draws it makes for an
unseeded sampled request (``sampled_siblings``), whether it can draft while the target verifies
(``propose_async``), and the per-sequence clean-up (``release``, ``flush``, ``shutdown``).
Proposers are built from a ``ProposerContext`` (cluster/proposers.py), never from the engine.

The proposers of this package: n-gram lookup (ngram.py), layer skip and a draft model
(model_draft.py), the EAGLE head (eagle.py, dynamic trees in dynamic_tree.py), merged and
lookup-first proposers (combined.py), and drafter workers in other processes (worker.py, remote.py).
A proposer that fails raises; the engine then decodes that step without speculation.
"""
from __future__ import annotations

import math

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from actors.sampling_params import SamplingParams
from actors.tree import TokenTree


@dataclass(frozen=True, slots=True)
class ProposerContext:
    """What building a proposer may use of the target side: its name, its runner (a ``Verifier`` or a
    TP shard group with the same interface: layer skip and the EAGLE head use its weights, a draft
    model sizes its own cache from it), its tokenizer, device, dtype, KV block size, attention
    backend and CUDA-graph choice (a draft model runs the target's: actors.model.attention_backends)."""

    model: str
    verifier: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    block_size: int
    attention_backend: str = "auto"
    enforce_eager: bool = False  # no CUDA graphs for a draft model's runner either


@dataclass(slots=True)
class DraftRequest:
    seq_id: int
    token_ids: list[int]  # prompt + output; the last one is the root of the tree
    expansion: list[int]  # branching per depth; a chain of K is [1] * K
    max_nodes: int  # draft-node slots reserved for this step
    params: SamplingParams
    generator: torch.Generator | None
    block_table: list[int]  # target block table, covering positions up to len(token_ids)-1+max_nodes
    # deepest draft the request's max_tokens and the context leave room for; None: len(expansion)
    max_depth: int | None = None
    # a dynamic tree keeps only nodes whose draft path probability reaches this (0: every node
    # within max_nodes): what a verified row must be expected to yield to pay for itself
    min_node_prob: float = 0.0

    @property
    def min_score(self) -> float:
        """``min_node_prob`` as a path log-probability floor (-inf: none)."""
        return math.log(self.min_node_prob) if self.min_node_prob > 0 else -math.inf

    @property
    def root_position(self) -> int:
        return len(self.token_ids) - 1

    @property
    def depth_limit(self) -> int:
        """How deep a draft may go: ``max_depth``, or the expansion's depth where none was given."""
        return len(self.expansion) if self.max_depth is None else self.max_depth

    @staticmethod
    def make_dummy(token_ids: list[int], k: int = 3) -> "DraftRequest":
        return DraftRequest(0, list(token_ids), [1] * k, k, SamplingParams(), None, [])


class Proposer(ABC):
    name: str = "proposer"
    needs_hidden: bool = False  # True: the engine hands observe() the target's features every step
    supports_async: bool = False  # True: propose_async drafts while the driver verifies (other processes)
    # seconds the last ``propose`` spent feeding the proposer the positions committed since it last
    # drafted (a feature-reading head's catch-up); the adaptive policy must not charge a long backlog
    # (a prompt, or steps that did not draft) to every later draft (cluster/drafting.py)
    catch_up_s: float = 0.0
    catch_up_entries: int = 0  # the positions that catch-up fed (a sequence drafting every step: <= K + 1)

    @abstractmethod
    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        """One tree per request, rooted at the request's last token, at most ``max_nodes`` drafts."""

    def propose_async(self, reqs: list[DraftRequest]):
        """A pending draft (``.result()`` -> trees, ``.compute_s``) for proposers with ``supports_async``."""
        raise NotImplementedError(f"proposer {self.name!r} drafts in the driver's process; it has no propose_async")

    def observe(self, seq_id: int, start: int, features: torch.Tensor) -> None:
        """features [n, H]: the target's final-normed hidden states of positions start .. start+n-1
        of ``seq_id``, just committed (only called when ``needs_hidden``)."""

    def release(self, seq_id: int) -> None:
        """The sequence finished, was aborted or preempted: drop any per-sequence state."""

    def flush(self) -> None:
        """The engine is idle: send any release still held back (remote proposers batch them)."""

    def shutdown(self) -> None:
        """The engine stops: end whatever processes this proposer started."""

    def stats(self) -> dict:
        """Health figures for the replica's stats endpoint (remote proposers: live workers, restarts)."""
        return {}

    def draft_source(self, token_ids: list[int], seq_id: int | None = None,
                     reference: tuple[int, ...] = ()) -> str | None:
        """What kind of draft this proposer would make after ``token_ids`` (None: no draft at all).
        The adaptive policy keeps acceptance estimates per kind: n-gram lookup after a 4-token
        match is right far more often than after a 1-token one. ``seq_id``: the sequence these are
        the tokens of (a proposer may keep what it learnt of them until ``release``); ``reference``:
        the request's prediction token ids (``SamplingParams.prediction_ids``)."""
        return self.name

    def nodes_per_depth(self, source: str | None) -> int:
        """Draft nodes per depth of what this proposer drafts from ``source`` (a dynamic tree of
        width w: w; a chain: 1): what the engine reserves and the adaptive policy pays for."""
        return 1

    def sampled_siblings(self, source: str | None) -> int:
        """Distinct draws this proposer makes at the first depth of an unseeded sampled request's
        chain from ``source`` (1: a plain chain). Multi-step speculative sampling tries them in
        turn, so the first position is accepted more often for one more verified node each."""
        return 1
