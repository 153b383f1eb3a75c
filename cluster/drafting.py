"""What the engine asks its proposer for each step: the speculation budget the scheduler reserves
per sequence, the draft source of a sequence (the adaptive policy's estimates are kept per
source), the depth the policy chooses, and the well-formed trees it accepts back.

A mixin of ``LLMEngine`` (cluster/engine.py): it reads the engine's config, scheduler, proposer
and policy; the overlapped step (cluster/overlap.py) uses the same methods per micro-batch.
"""
from __future__ import annotations

import logging

from actors.drafter import DraftRequest
from actors.scheduler import ScheduledSeq
from actors.sequence import Sequence
from actors.spec_policy import DecodeSlot
from actors.tree import TokenTree, expansion_num_nodes

log = logging.getLogger("specray.engine")


class DraftPlanning:
    def _drafts_would_shrink_prefill(self) -> bool:
        """Prefill before drafts: when the step's token budget cannot hold the waiting prompts
        and every decoding sequence's full draft, the policy's sequences draft nothing this step
        (their reserved tokens would otherwise be taken from prefill chunks, before the policy
        could weigh them)."""
        return self.scheduler.drafts_would_shrink_prefill(1 + expansion_num_nodes(self.config.speculative.expansion))

    def _spec_budget(self, seq: Sequence) -> int:
        policy = self.spec_policy
        free = policy is not None and seq.params.spec_tokens is None
        if free and (self._hold_drafts or not policy.reserve(seq.seq_id, self._draft_source(seq))):
            return 0
        exp = self._expansion_for(seq, None)
        return self._draft_nodes(seq, exp)

    def _draft_nodes(self, seq: Sequence, exp: list[int]) -> int:
        """Draft nodes that ``seq``'s draft of expansion ``exp`` verifies at most."""
        siblings = self._siblings(seq, exp)
        if siblings > 1:
            return len(exp) + siblings - 1
        return self.config.speculative.draft_nodes(expansion_num_nodes(exp), self._nodes_per_depth(seq, exp))

    def _siblings(self, seq: Sequence, exp: list[int]) -> int:
        """Distinct draws at the first depth of ``seq``'s chain ``exp``: the proposer's sampled
        siblings for unseeded sampled requests (which draft chains, not dynamic trees), else 1;
        as many as the request's full chain leaves room for within the tree_nodes cap, at any depth."""
        spec = self.config.speculative
        if seq.params.deterministic or not exp or any(w != 1 for w in exp) or spec.tree_width == 1:
            return 1
        siblings = self.proposer.sampled_siblings(self._draft_source(seq))
        if spec.tree_nodes is not None:
            k = seq.params.spec_tokens if seq.params.spec_tokens is not None else len(spec.expansion)
            siblings = min(siblings, spec.tree_nodes - k + 1)
        return max(1, siblings)

    def _with_siblings(self, seq: Sequence, exp: list[int], slots: int) -> list[int]:
        """The chain ``exp`` with its first depth widened to ``seq``'s siblings, within ``slots`` nodes."""
        siblings = min(self._siblings(seq, exp), slots - len(exp) + 1)
        return [siblings, *exp[1:]] if siblings > 1 else exp

    def _nodes_per_depth(self, seq: Sequence, exp: list[int]) -> int:
        """Draft nodes per depth of ``seq``'s draft now: a dynamic tree's width, or 1 (chains and
        fixed trees; unseeded sampling, which needs draws from q, drafts chains, see _siblings)."""
        if not exp or any(w != 1 for w in exp) or self.config.speculative.tree_width == 1:
            return 1
        if not seq.params.deterministic:
            return 1
        return self.proposer.nodes_per_depth(self._draft_source(seq))

    def _draft_source(self, seq: Sequence) -> str | None:
        """The proposer's kind of draft for ``seq`` now (its estimates are kept per kind), once per
        step and sequence: scheduling and depth choice see the same tokens."""
        key = (seq.seq_id, seq.num_tokens)
        if key not in self._sources:
            classify = getattr(self.proposer, "draft_source", None)
            try:
                self._sources[key] = "" if classify is None else classify(seq.token_ids)
            except Exception:  # a failing proposer is handled (plain decoding) where it proposes
                self._sources[key] = ""
        return self._sources[key]

    def _expansion_for(self, seq: Sequence, max_nodes: int | None) -> list[int]:
        if self.proposer is None:
            return []
        k = seq.params.spec_tokens
        exp = [1] * k if k is not None else self.config.speculative.expansion
        exp = exp[: max(0, min(seq.remaining_tokens, self.max_model_len - seq.num_tokens) - 1)]
        while max_nodes is not None and exp and expansion_num_nodes(exp) > max_nodes:
            exp = exp[:-1]
        return exp

    def draft_requests(self, scheduled: list[ScheduledSeq]) -> list[DraftRequest]:
        """What to ask the proposer for: decoding sequences with a speculation budget, at the depth
        the adaptive policy chooses (if any)."""
        cands = [(s, self._expansion_for(s.seq, s.num_spec)) for s in scheduled if s.is_decode and s.num_spec]
        cands = [(s, exp) for s, exp in cands if exp]
        if self.spec_policy is not None and cands:
            cands = self._adapt_depths(scheduled, cands)
        return [DraftRequest(s.seq.seq_id, s.seq.token_ids, self._with_siblings(s.seq, exp, s.num_spec),
                             min(s.num_spec, self._draft_nodes(s.seq, exp)),
                             s.seq.params, s.seq.generator, self.scheduler.block_tables[s.seq.seq_id])
                for s, exp in cands]

    @staticmethod
    def accept_trees(reqs: list[DraftRequest], trees: list[TokenTree]) -> dict[int, TokenTree]:
        """seq_id -> tree, keeping only well-formed trees (right root, within the reserved slots)."""
        if len(trees) != len(reqs):
            raise ValueError(f"proposer returned {len(trees)} trees for {len(reqs)} draft requests")
        return {r.seq_id: t for r, t in zip(reqs, trees) if t.tokens[0] == r.token_ids[-1] and t.size - 1 <= r.max_nodes}

    def proposer_failed(self, e: Exception) -> None:
        """Speculation failure degrades to plain decoding for the step; counted and logged once."""
        self.num_proposer_failures += 1
        log.warning("proposer %s failed (%s); decoding this step without speculation",
                    getattr(self.proposer, "name", "?"), e, exc_info=self.num_proposer_failures == 1)

    def _propose(self, scheduled: list[ScheduledSeq]) -> dict[int, TokenTree]:
        reqs = self.draft_requests(scheduled)
        if not reqs:
            return {}
        try:
            return self.accept_trees(reqs, self.proposer.propose(reqs))
        except Exception as e:
            self.proposer_failed(e)
            return {}

    def _adapt_depths(self, scheduled, cands):
        """Cut each expansion to the depth the policy chooses; requests that fixed their K keep it."""
        slots = [DecodeSlot(s.seq.seq_id, len(exp), fixed=s.seq.params.spec_tokens is not None,
                            source=self._draft_source(s.seq), width=self._nodes_per_depth(s.seq, exp),
                            node_cap=self._draft_nodes(s.seq, exp), siblings=self._siblings(s.seq, exp))
                 for s, exp in cands]
        depths = self.spec_policy.choose(slots, base_tokens=sum(s.num_query for s in scheduled),
                                         base_yield=sum(1 for s in scheduled if s.is_decode), num_seqs=len(scheduled))
        return [(s, exp[:d]) for (s, exp), d in zip(cands, depths) if d > 0]
