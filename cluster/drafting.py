"""Drafting for one engine: ``DraftPlanner`` owns the proposer and the adaptive policy.

Per step, in the engine's order:
- ``begin_step``, then ``budgets(running)``: draft-node slots the scheduler reserves per decoding
  sequence (the policy may reserve none, e.g. while prefill is pending); ``max_depth_for`` caps a
  sequence's depth by its traffic class (cluster/traffic.py) and turns speculation off while the
  fallback guard (cluster/spec_guard.py) is tripped or wants a plain step to measure;
- ``propose(scheduled)``: the draft requests (each sequence's expansion, cut to the depth the
  policy chooses), the proposer's trees, only well-formed ones kept; a failing proposer means this
  step decodes without speculation (``requests``/``accept``/``failed`` are the same steps one at a
  time, for the overlapped step in cluster/overlap.py);
- after verification: ``record`` each sequence's accepted length, ``observe_features`` hands a
  feature-reading proposer (EAGLE) what was committed, ``learn`` feeds the policy's cost tables,
  ``measure`` sums up what the step's decoding sequences produced (metrics, the guard);
- ``release`` when a sequence finishes, is aborted or preempted; ``on_idle`` when nothing runs.
A request under a grammar (structured output) whose next tokens the grammar forces (a JSON schema's
next key, the rest of an enum value) drafts those instead: a chain the target accepts unless it
splits the same text into other tokens, verified like any draft, so lossless; engines without a
proposer draft them too (jump-forward decoding). They are left out of what the adaptive policy learns.
The draft source of a sequence (the proposer's kind of draft now: lookup after an n-token match,
the head, ...) is looked up once per step, so scheduling, depth choice and learning agree.
"""
from __future__ import annotations

import logging
from time import perf_counter

import torch

from actors.hidden_states import committed_features
from actors.proposers.base import DraftRequest, Proposer
from actors.scheduler import ScheduledSeq
from actors.sequence import Sequence
from actors.spec_policy import DecodeSlot, SpecPolicy
from actors.tree import TokenTree, expansion_num_nodes
from actors.verifier import SeqChunk
from cluster.config import SpeculativeConfig
from cluster.spec_guard import SpecGuard, StepYield
from cluster.traffic import match

log = logging.getLogger("specray.engine")

FORCED_MAX = 8  # grammar-forced tokens drafted at most in one step (each is a verified row)


def steady_draft_s(draft_s: float, catch_up_s: float, depth: int, steady: bool = False) -> float:
    """What a draft of ``depth`` rounds that took ``draft_s`` seconds, ``catch_up_s`` of them feeding the
    proposer the positions committed since it last drafted, costs a sequence that drafts every step.
    ``steady``: the catch-up fed only what one step commits (the root and the accepted drafts):
    a sequence drafting every step pays it every step (an EAGLE head's catch-up is the forward that
    scores the first depth), so it is charged in full. Otherwise the catch-up is counted as at most
    one round: a longer one (the prompt, or a backlog from steps that did not draft) is paid once,
    not by every later draft. Charged in full it made the EAGLE head look ~4x dearer per round than
    it is (a 32-step backlog at each exploration), so the policy stopped drafting with it and
    measured it again only with such backlogs; capped at a round always, a depth-1 draft, all
    catch-up, looked free (0.3 ms charged for ~1 ms at T=1.0 on the CPU)."""
    if steady:
        return draft_s
    catch_up = min(max(catch_up_s, 0.0), draft_s)
    rounds = draft_s - catch_up
    return rounds + min(catch_up, rounds / max(depth, 1))


class DraftPlanner:
    def __init__(self, spec: SpeculativeConfig, proposer: Proposer | None, policy: SpecPolicy | None,
                 scheduler, max_model_len: int):
        """proposer None: no speculation; policy None: fixed K / tree (no adaptive depth);
        scheduler: the engine's BatchScheduler (block tables of the scheduled sequences)."""
        self.spec, self.proposer, self.policy = spec, proposer, policy
        self.scheduler, self.max_model_len = scheduler, max_model_len
        self.sources: dict[tuple[int, int], str | None] = {}  # (seq_id, num_tokens) -> draft source
        self.hold = False  # this step, the policy's sequences draft nothing (a prefill is pending)
        self.num_failures = 0
        self.guard = SpecGuard(spec.fallback_guard) if proposer is not None else None
        self.plain_step = False  # this step, no sequence drafts unless it fixed its own K (the guard)
        self.caps: dict[int, int | None] = {}  # seq_id -> depth cap this step (None: as configured)
        self.forced: dict[int, list[int]] = {}  # seq_id -> tokens its grammar forces next (this step)

    @property
    def max_depth(self) -> int:
        """Draft positions per step at most (0 without a proposer): what the metrics count per position."""
        return len(self.spec.expansion) if self.proposer is not None else 0

    @property
    def needs_hidden(self) -> bool:
        return self.proposer is not None and self.proposer.needs_hidden

    # ---- before scheduling --------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before scheduling: a new step's draft sources; with a policy, its step count and whether
        the policy's sequences hold their drafts this step (``drafts_would_shrink_prefill``)."""
        self.sources, self.caps, self.forced = {}, {}, {}
        guard = self.guard
        self.plain_step = guard is not None and (not guard.allows_speculation() or guard.take_probe())
        if self.policy is None:
            return
        self.policy.begin_step()
        self.hold = self.drafts_would_shrink_prefill()

    def drafts_would_shrink_prefill(self) -> bool:
        """Prefill before drafts: when the step's token budget cannot hold the waiting prompts and
        every decoding sequence's full draft, the policy's sequences draft nothing this step (their
        reserved tokens would otherwise be taken from prefill chunks, before the policy could weigh them)."""
        return self.scheduler.drafts_would_shrink_prefill(1 + expansion_num_nodes(self.spec.expansion))

    def budgets(self, running: list[Sequence]) -> dict[int, int]:
        """seq_id -> draft-node slots to reserve, for the decoding sequences among ``running``."""
        decoding = [s for s in running if s.num_uncomputed == 1]
        self.forced = {s.seq_id: f for s in decoding if (f := self._forced(s))}
        if self.proposer is None:
            return {sid: len(f) for sid, f in self.forced.items()}
        self.caps = {s.seq_id: self.max_depth_for(s, len(running)) for s in decoding}
        return {s.seq_id: len(self.forced[s.seq_id]) if s.seq_id in self.forced else self._budget(s)
                for s in decoding}

    def _forced(self, seq: Sequence) -> list[int]:
        """The tokens ``seq``'s grammar forces next, as many as its draft may hold; none for a request
        that turned speculation off (spec_tokens 0)."""
        if seq.grammar is None or seq.params.spec_tokens == 0:
            return []
        room = min(self._depth_room(seq), FORCED_MAX)
        return seq.grammar.forced()[:room] if room > 0 else []

    def max_depth_for(self, seq: Sequence, num_running: int) -> int | None:
        """The cap on ``seq``'s draft depth this step with ``num_running`` sequences running: 0 while
        the guard holds speculation off, else its traffic class's (None: as configured). A request
        that fixed its own K keeps it."""
        if seq.params.spec_tokens is not None:
            return None
        if self.plain_step:
            return 0
        cls = match(self.spec.traffic_classes, seq.params.max_tokens, seq.params.temperature, num_running)
        return None if cls is None else cls.max_depth

    def _cap(self, seq: Sequence) -> int | None:
        if seq.seq_id not in self.caps:
            self.caps[seq.seq_id] = self.max_depth_for(seq, len(self.scheduler.running))
        return self.caps[seq.seq_id]

    def _budget(self, seq: Sequence) -> int:
        if self._cap(seq) == 0:
            return 0
        free = self.policy is not None and seq.params.spec_tokens is None
        if free and (self.hold or not self.policy.reserve(seq.seq_id, self.source(seq))):
            return 0
        return self._draft_nodes(seq, self._expansion_for(seq, None))

    # ---- drafting -----------------------------------------------------------------------------
    def propose(self, scheduled: list[ScheduledSeq]) -> tuple[dict[int, TokenTree], float | None]:
        """seq_id -> tree for the sequences that draft this step, and the seconds the proposer took
        (None when it drafted nothing)."""
        t0 = perf_counter()
        reqs = self.requests(scheduled)
        trees = {}
        if reqs:
            try:
                trees = self.accept(reqs, self.proposer.propose(reqs))
            except Exception as e:
                self.failed(e)
        draft_s = perf_counter() - t0 if trees else None
        return {**trees, **self.forced_trees(scheduled)}, draft_s

    def forced_trees(self, scheduled: list[ScheduledSeq]) -> dict[int, TokenTree]:
        """seq_id -> a chain of the tokens its grammar forces, for the scheduled decoding sequences that
        have them (within the slots the scheduler granted)."""
        out = {}
        for s in scheduled:
            tokens = self.forced.get(s.seq.seq_id)
            if tokens and s.is_decode and s.num_spec:
                out[s.seq.seq_id] = TokenTree.chain(s.seq.token_ids[-1], tokens[:s.num_spec])
        return out

    def requests(self, scheduled: list[ScheduledSeq]) -> list[DraftRequest]:
        """What to ask the proposer for: decoding sequences with a speculation budget, at the depth
        the adaptive policy chooses (if any)."""
        cands = [(s, self._expansion_for(s.seq, s.num_spec)) for s in scheduled
                 if s.is_decode and s.num_spec and s.seq.seq_id not in self.forced]
        cands = [(s, exp) for s, exp in cands if exp]
        floor = 0.0
        if self.policy is not None and cands:
            cands = self._adapt_depths(scheduled, cands)
            floor = self.policy.node_floor(self._base_tokens(scheduled), len(scheduled))
        return [DraftRequest(s.seq.seq_id, s.seq.token_ids, self._with_siblings(s.seq, exp, s.num_spec),
                             min(s.num_spec, self._draft_nodes(s.seq, exp)),
                             s.seq.params, s.seq.generator, self.scheduler.block_tables[s.seq.seq_id],
                             self._depth_room(s.seq), floor)
                for s, exp in cands]

    @staticmethod
    def accept(reqs: list[DraftRequest], trees: list[TokenTree]) -> dict[int, TokenTree]:
        """seq_id -> tree, keeping only well-formed trees (right root, within the reserved slots)."""
        if len(trees) != len(reqs):
            raise ValueError(f"proposer returned {len(trees)} trees for {len(reqs)} draft requests")
        return {r.seq_id: t for r, t in zip(reqs, trees) if t.tokens[0] == r.token_ids[-1] and t.size - 1 <= r.max_nodes}

    def failed(self, e: Exception) -> None:
        """Speculation failure degrades to plain decoding for the step; counted and logged once."""
        self.num_failures += 1
        log.warning("proposer %s failed (%s); decoding this step without speculation",
                    self.proposer.name, e, exc_info=self.num_failures == 1)

    # ---- after verification -------------------------------------------------------------------
    def drafted_sources(self, part: list[ScheduledSeq], trees: dict[int, TokenTree]) -> set:
        """The draft sources of ``part``'s drafted sequences (read before their tokens are appended)."""
        if self.policy is None:
            return set()
        return {self.source(s.seq) for s in part if s.seq.seq_id in trees and s.seq.seq_id not in self.forced}

    def record(self, seq: Sequence, tree: TokenTree, num_accepted: int) -> None:
        """Verification kept ``num_accepted`` of ``tree``'s drafts (call before appending the tokens)."""
        if seq.seq_id in self.forced:
            seq.spec.num_forced_tokens += num_accepted
            return
        if self.policy is not None and tree.size > 1:
            self.policy.record(seq.seq_id, tree.max_depth, num_accepted, self.source(seq))

    def learn(self, part: list[ScheduledSeq], chunks: list[SeqChunk], trees: dict[int, TokenTree],
              draft_s: float | None, verify_s: float, drafted: set) -> None:
        """The policy's cost tables: a decode-only forward's seconds by its token count (a forward that
        is mostly one prefill chunk is cheaper per token than the same tokens spread over many
        sequences, and would make drafts look free), and the proposer's draft round's seconds (over
        its own trees, not the grammar's forced chains)."""
        if self.policy is None:
            return
        drafts = [t for sid, t in trees.items() if sid not in self.forced]
        num_trees, max_depth = len(drafts), max((t.max_depth for t in drafts), default=0)
        if all(s.is_decode for s in part):
            self.policy.observe_verify(sum(len(c.token_ids) for c in chunks), verify_s, len(chunks))
        if num_trees and draft_s is not None:
            steady = self.proposer.catch_up_entries <= num_trees * (self.max_depth + 1)
            self.policy.observe_draft(num_trees, max_depth,
                                      steady_draft_s(draft_s, self.proposer.catch_up_s, max_depth, steady), drafted)

    def observe_features(self, part: list[ScheduledSeq], chunks: list[SeqChunk], trees: dict[int, TokenTree],
                         computed: dict[int, int], hidden: torch.Tensor) -> None:
        """Hand the proposer the features of the positions each sequence committed this step.

        computed: seq_id -> num_computed before the step; hidden: [N, H] final-normed hidden states
        of the step's tokens, in ``chunks`` order. A prefill chunk commits all its rows; a decode step
        commits the root and the accepted path, found by walking the tree along the committed tokens
        (equal-token siblings share a path, so their features are equal)."""
        for seq, n0, feats in committed_features(part, chunks, trees, computed, hidden):
            self.proposer.observe(seq.seq_id, n0, feats)

    def measure(self, part: list[ScheduledSeq], trees: dict[int, TokenTree], computed: dict[int, int],
                seconds: float) -> StepYield:
        """What ``part``'s decoding sequences produced this step (call after commit; computed:
        seq_id -> num_computed before the step; seconds: drafting + forward + verification), as
        the guard accounts it (``plain_equiv_s`` set where it has a baseline)."""
        y = StepYield(decode_only=all(s.is_decode for s in part), seconds=seconds)
        for s in part:
            if not s.is_decode:
                continue
            tree = trees.get(s.seq.seq_id)
            if tree is not None and tree.size > 1:
                y.drafted_seqs += 1
                y.drafted_tokens += s.seq.num_computed - computed[s.seq.seq_id]
                y.chosen = y.chosen or s.seq.params.spec_tokens is None
            else:
                y.plain_seqs += 1
        return self.guard.observe(y) if self.guard is not None else y

    def release(self, seq: Sequence) -> None:
        if self.proposer is not None:
            self.proposer.release(seq.seq_id)
        if self.policy is not None:
            self.policy.release(seq.seq_id)

    def on_idle(self) -> None:
        """Nothing left to run: let a remote proposer send the releases it holds back."""
        if self.proposer is not None:
            self.proposer.flush()

    # ---- shapes of a sequence's draft ---------------------------------------------------------
    def source(self, seq: Sequence) -> str | None:
        """The proposer's kind of draft for ``seq`` now (its estimates are kept per kind), once per
        step and sequence: scheduling and depth choice see the same tokens."""
        key = (seq.seq_id, seq.num_tokens)
        if key not in self.sources:
            try:
                self.sources[key] = self.proposer.draft_source(seq.token_ids, seq.seq_id, seq.params.prediction_ids)
            except Exception:  # a failing proposer is handled (plain decoding) where it proposes
                self.sources[key] = ""
        return self.sources[key]

    def _expansion_for(self, seq: Sequence, max_nodes: int | None) -> list[int]:
        k = seq.params.spec_tokens
        exp = [1] * k if k is not None else self.spec.expansion[: self._cap(seq)]
        exp = exp[: self._depth_room(seq)]
        while max_nodes is not None and exp and expansion_num_nodes(exp) > max_nodes:
            exp = exp[:-1]
        return exp

    def _depth_room(self, seq: Sequence) -> int:
        """Draft positions ``seq``'s max_tokens and the context leave room for (the bonus token
        needs one more)."""
        return max(0, min(seq.remaining_tokens, self.max_model_len - seq.num_tokens) - 1)

    def _draft_nodes(self, seq: Sequence, exp: list[int]) -> int:
        """Draft nodes that ``seq``'s draft of expansion ``exp`` verifies at most."""
        siblings = self._siblings(seq, exp)
        if siblings > 1:
            return len(exp) + siblings - 1
        return self.spec.draft_nodes(expansion_num_nodes(exp), self._nodes_per_depth(seq, exp))

    def _siblings(self, seq: Sequence, exp: list[int]) -> int:
        """Distinct draws at the first depth of ``seq``'s chain ``exp``: the proposer's sampled
        siblings for unseeded sampled requests (which draft chains, not dynamic trees), else 1;
        as many as the request's full chain leaves room for within the tree_nodes cap, at any depth."""
        spec = self.spec
        if seq.params.deterministic or not exp or any(w != 1 for w in exp) or spec.tree_width == 1:
            return 1
        siblings = self.proposer.sampled_siblings(self.source(seq))
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
        if not exp or any(w != 1 for w in exp) or self.spec.tree_width == 1:
            return 1
        if not seq.params.deterministic:
            return 1
        return self.proposer.nodes_per_depth(self.source(seq))

    def _base_tokens(self, scheduled: list[ScheduledSeq]) -> int:
        """Tokens the step's forward carries besides the proposer's drafts: roots, prefill chunks and
        the grammars' forced chains."""
        forced = sum(min(len(self.forced.get(s.seq.seq_id, ())), s.num_spec) for s in scheduled if s.is_decode)
        return sum(s.num_query for s in scheduled) + forced

    def _adapt_depths(self, scheduled, cands):
        """Cut each expansion to the depth the policy chooses; requests that fixed their K keep it."""
        slots = [DecodeSlot(s.seq.seq_id, len(exp), fixed=s.seq.params.spec_tokens is not None,
                            source=self.source(s.seq), width=self._nodes_per_depth(s.seq, exp),
                            node_cap=self._draft_nodes(s.seq, exp), siblings=self._siblings(s.seq, exp))
                 for s, exp in cands]
        depths = self.policy.choose(slots, base_tokens=self._base_tokens(scheduled),
                                    base_yield=sum(1 for s in scheduled if s.is_decode), num_seqs=len(scheduled))
        return [(s, exp[:d]) for (s, exp), d in zip(cands, depths) if d > 0]
