"""Adaptive speculation: how many draft tokens each sequence gets this step (K = 0: plain decoding).

Speculation pays when the tokens it is expected to add outweigh what it costs. Per step the engine
asks ``SpecPolicy.choose`` for the draft depth of every decoding sequence, maximising expected
tokens per second of the whole batch:

    goodput(k) = sum_s E_s(k_s) / (t_verify(N_base + sum_s k_s) + t_draft(max_s k_s, #drafting))

- ``E_s(k) = 1 + sum_{j<=k} prod_{i<=j} r_s,i`` with ``r_s,i`` the estimated probability that
  draft position i is accepted given positions < i were (``AcceptanceEstimator``: engine-wide
  counts per position as the prior, each sequence's own counts on top). Estimates are kept per
  draft source (``Proposer.draft_source``: n-gram lookup after a 4-token match, after a 2-token
  one, the EAGLE head, ...): one blended rate would draft too little where lookup matches and
  too much where only a weak model drafts. A source of None drafts nothing: depth 0; a source
  never verified yet drafts its full depth once, which measures it.
- ``t_verify(N)``: measured seconds of decode-only target forwards (+ verification) of N tokens,
  ``t_draft``: measured seconds of one draft round for B sequences, per draft source where a step
  drafts from one (``actors.cost_table.CostTable``: EWMAs per size, interpolated, extrapolated
  with the last measured slope).
- For a fixed depth cap D the draft cost is fixed and verify cost is about linear in the extra
  tokens, so the best k_s take every position whose marginal gain prod r exceeds goodput x
  (marginal verify seconds per token): a fractional (Dinkelbach) iteration, a few rounds over a
  [B, K] array. Caps D = 0..K are compared, D = 0 being plain decoding.

Estimates only move when sequences draft, so every ``explore_every`` steps one sequence (round
robin) drafts past the depth chosen: one position more, which measures the position the choice
turns on, and on every ``full_explore_every``-th such step its full depth, which keeps the deeper
forwards and positions measured. Acceptance and costs stay measured at a bounded price: a full
exploration where drafts do not pay cost ~2.5% of the time at T=1.0 on the CPU (a 10-node step
at 15-17 ms for 2 tokens every 32 steps of ~5.8 ms), one position more a fraction of that.
Everything here is plain arithmetic on floats: no torch, no engine state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from actors.cost_table import CostTable, size_bucket


# ---- pure math -----------------------------------------------------------------------------
def expected_tokens(rates: list[float] | np.ndarray, k: int) -> float:
    """Expected tokens from one verification step with a depth-k chain: the bonus token plus each
    draft position reached. rates[i]: P(position i+1 accepted | positions <= i accepted)."""
    return 1.0 + float(np.cumprod(np.asarray(rates[:k], dtype=np.float64)).sum()) if k > 0 else 1.0


def draft_node_counts(depths, widths, extra_nodes, caps):
    """Draft nodes verified for a draft of ``depths`` (int or array) at ``widths`` nodes per depth,
    plus ``extra_nodes`` added once by any draft of depth >= 1 (sibling draws at the first depth),
    within ``caps`` (a dynamic tree's cap on its nodes). Broadcasts like numpy."""
    depths = np.asarray(depths)
    return np.minimum(depths * widths + (depths > 0) * extra_nodes, caps)


def choose_depths(gains: np.ndarray, max_depths: np.ndarray, base_tokens: int, verify_s, draft_round_s,
                  base_yield: float | None = None, iterations: int = 6,
                  min_gain: float = 0.0, widths: np.ndarray | None = None,
                  node_caps: np.ndarray | None = None,
                  extra_nodes: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Depth per sequence maximising expected tokens per second of one step.

    gains: [B, K] marginal expected tokens of position j for sequence b (cumulative products of
    acceptance rates; non-increasing along j); max_depths: [B] per-sequence limits (<= K);
    base_tokens: tokens the forward carries anyway (roots + prefill chunks); base_yield: tokens the
    step yields without drafts (one per decoding sequence, also those not offered here; default B);
    verify_s(n) -> seconds for a forward of n tokens; draft_round_s(b) -> seconds of one draft
    round over b sequences; min_gain: drafts must beat plain decoding's goodput by this fraction
    (estimates are noisy: a predicted 1% gain is as likely a loss); widths: [B] draft nodes per
    depth (a dynamic tree verifies ``width`` tokens per depth; default 1); node_caps: [B] at most
    this many draft nodes per sequence whatever the depth (a dynamic tree's cap; default none);
    extra_nodes: [B] nodes any draft of depth >= 1 adds once (sibling draws at the first depth;
    default 0). Returns (depths [B] int, goodput in tokens/s)."""
    B, K = gains.shape
    w = np.ones(B, dtype=np.int64) if widths is None else np.asarray(widths, dtype=np.int64)
    caps = np.full(B, np.iinfo(np.int64).max, dtype=np.int64) if node_caps is None else np.asarray(node_caps, np.int64)
    # nodes[b, d]: draft nodes verified for sequence b at depth d (0..K)
    once = np.zeros(B, dtype=np.int64) if extra_nodes is None else np.asarray(extra_nodes, dtype=np.int64)
    nodes = draft_node_counts(np.arange(K + 1)[None, :], w[:, None], once[:, None], caps[:, None])  # [B, K+1]
    y0 = float(B if base_yield is None else base_yield)
    cols = np.arange(1, K + 1)[None, :]
    allowed = cols <= max_depths[:, None]  # [B, K]
    plain_rate = y0 / max(verify_s(base_tokens), 1e-9)
    best_depths, best_rate = np.zeros(B, dtype=np.int64), plain_rate * (1 + min_gain)
    if B == 1:  # one sequence (low load, every step): each depth's goodput, exactly, without iterating
        m, n1, round_s = int(max_depths[0]), nodes[0].tolist(), draft_round_s(1) if max_depths[0] > 0 else 0.0
        return _one_sequence(gains[0, :m].tolist(), lambda d: verify_s(base_tokens + n1[d]) + d * round_s, y0,
                             best_rate, plain_rate)
    for cap in range(1, int(max_depths.max(initial=0)) + 1):
        mask = allowed & (cols <= cap)
        reach = np.concatenate([np.ones((B, 1), dtype=bool), mask], axis=1)  # depths 0..K allowed [B, K+1]
        cum = np.concatenate([np.zeros((B, 1)), np.cumsum(gains * mask, axis=1)], axis=1)  # tokens by depth
        take = mask.copy()
        rate = 0.0
        for _ in range(iterations):  # Dinkelbach: each depth maximises its gain less what it costs at this rate
            depths = take.sum(axis=1)
            n_draft = int((depths > 0).sum())
            if n_draft == 0:
                break
            extra = int(nodes[np.arange(B), depths].sum())
            t = verify_s(base_tokens + extra) + int(depths.max()) * draft_round_s(n_draft)
            new_rate = (y0 + float((gains * take).sum())) / max(t, 1e-9)
            if abs(new_rate - rate) < 1e-9 * max(new_rate, 1.0):
                break
            rate = new_rate
            marginal_s = (verify_s(base_tokens + extra + 1) - verify_s(base_tokens + extra))  # per token
            # first maximum: a tie goes to the shallower depth (a gain must beat its cost)
            best = np.where(reach, cum - rate * marginal_s * nodes, -np.inf).argmax(axis=1)
            take = cols <= best[:, None]  # a depth-j draft includes 1..j-1
        depths = take.sum(axis=1)
        if depths.any():
            t = verify_s(base_tokens + int(nodes[np.arange(B), depths].sum())) + int(depths.max()) * draft_round_s(int((depths > 0).sum()))
            rate = (y0 + float((gains * take).sum())) / max(t, 1e-9)
            if rate > best_rate * (1 + 1e-6):
                best_depths, best_rate = depths.astype(np.int64), rate
    return best_depths, best_rate if best_depths.any() else plain_rate


def _one_sequence(gains: list[float], step_s, y0: float, bar: float, plain_rate: float) -> tuple[np.ndarray, float]:
    """choose_depths for B = 1: the shallowest depth d whose goodput (y0 + gains[:d]) / step_s(d)
    beats ``bar`` and every shallower depth's."""
    best, best_rate, tokens = 0, bar, y0
    for d, gain in enumerate(gains, start=1):
        tokens += gain
        rate = tokens / max(step_s(d), 1e-9)
        if rate > best_rate * (1 + 1e-6):
            best, best_rate = d, rate
    return np.array([best], dtype=np.int64), best_rate if best else plain_rate


# ---- estimates -----------------------------------------------------------------------------
@dataclass
class _PosCounts:
    offered: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def record(self, depth: int, num_accepted: int, decay: float = 1.0) -> None:
        """A depth-``depth`` draft of which the first ``num_accepted`` positions were accepted."""
        reached = min(num_accepted + 1, depth)
        while len(self.offered) < depth:
            self.offered.append(0.0)
            self.accepted.append(0.0)
        if decay != 1.0:
            self.offered = [x * decay for x in self.offered]
            self.accepted = [x * decay for x in self.accepted]
        for i in range(reached):
            self.offered[i] += 1.0
        for i in range(num_accepted):
            self.accepted[i] += 1.0


class AcceptanceEstimator:
    """Conditional acceptance rate per draft position: engine-wide (decayed so it follows the
    traffic) as a prior worth ``prior_weight`` observations, plus each sequence's own counts."""

    def __init__(self, max_depth: int, prior_rate: float = 0.5, prior_weight: float = 4.0,
                 global_decay: float = 0.999):
        self.max_depth = max_depth
        self.prior_rate = prior_rate
        self.prior_weight = prior_weight
        self.global_decay = global_decay
        self.glob = _PosCounts()
        self.per_seq: dict[int, _PosCounts] = {}

    def record(self, seq_id: int, depth: int, num_accepted: int) -> None:
        if depth <= 0:
            return
        if not 0 <= num_accepted <= depth:
            raise ValueError(f"num_accepted={num_accepted} outside 0..depth={depth}")
        self.glob.record(depth, num_accepted, self.global_decay)
        self.per_seq.setdefault(seq_id, _PosCounts()).record(depth, num_accepted)

    def global_rates(self) -> list[float]:
        out = []
        for i in range(self.max_depth):
            off = self.glob.offered[i] if i < len(self.glob.offered) else 0.0
            acc = self.glob.accepted[i] if i < len(self.glob.accepted) else 0.0
            prev = out[-1] if out else self.prior_rate
            out.append((acc + self.prior_weight * prev) / (off + self.prior_weight))
        return out

    def rates(self, seq_id: int, prior: list[float] | None = None) -> list[float]:
        prior = prior if prior is not None else self.global_rates()
        own = self.per_seq.get(seq_id)
        if own is None:
            return list(prior)
        out = []
        for i in range(self.max_depth):
            off = own.offered[i] if i < len(own.offered) else 0.0
            acc = own.accepted[i] if i < len(own.accepted) else 0.0
            out.append((acc + self.prior_weight * prior[i]) / (off + self.prior_weight))
        return out

    def release(self, seq_id: int) -> None:
        self.per_seq.pop(seq_id, None)


# ---- the policy the engine calls -------------------------------------------------------------
@dataclass(slots=True)
class DecodeSlot:
    seq_id: int
    max_depth: int  # what the configuration, the request and the KV reservation allow
    fixed: bool = False  # the request fixed its K: not optimised
    source: str | None = ""  # the proposer's draft_source for this sequence now (None: no draft)
    width: int = 1  # draft nodes per depth (a dynamic tree's width): what each depth costs to verify
    node_cap: int | None = None  # a dynamic tree's cap on its draft nodes (what the deepest draft verifies)
    siblings: int = 1  # distinct draws at the first depth of a sampled chain (each one more node)

    def nodes_at(self, depth: int) -> int:
        """Draft nodes verified when this slot drafts ``depth`` deep."""
        cap = np.iinfo(np.int64).max if self.node_cap is None else self.node_cap
        return int(draft_node_counts(depth, self.width, self.siblings - 1, cap))


class SpecPolicy:
    def __init__(self, max_depth: int, explore_every: int = 32, prior_rate: float = 0.5, min_gain: float = 0.02,
                 full_explore_every: int = 4):
        self.max_depth = max_depth
        self.min_gain = min_gain  # drafts must be predicted to beat plain decoding by this fraction
        self.explore_every = explore_every
        self.full_explore_every = full_explore_every  # of the exploration steps, 1 in this many goes full depth
        self.prior_rate = prior_rate
        self.acceptance: dict[str, AcceptanceEstimator] = {}  # per draft source
        self.verify_cost = CostTable()  # all decode-only steps
        # per number of sequences in the step: a draft token costs less than another sequence's
        # token (no attention over another context), so tokens alone mix unlike forwards
        self.verify_cost_by_seqs: dict[int, CostTable] = {}
        self.draft_cost = CostTable()  # all draft rounds
        # per draft source, from steps where every drafting sequence used it: lookup costs next to
        # nothing, a draft model or head a forward per round; one blended table over- and under-
        # charges them by turns
        self.draft_cost_by_source: dict[str, CostTable] = {}
        self.num_steps = 0
        self.last_goodput: float | None = None
        self.last_depth: dict[int, dict[str, int]] = {}  # seq_id -> source -> depth last chosen

    def estimator(self, source: str) -> AcceptanceEstimator:
        est = self.acceptance.get(source)
        if est is None:
            est = self.acceptance[source] = AcceptanceEstimator(self.max_depth, prior_rate=self.prior_rate)
        return est

    def begin_step(self) -> None:
        """Once per engine step, before scheduling (exploration counts engine steps)."""
        self.num_steps += 1

    def reserve(self, seq_id: int, source: str | None = "") -> bool:
        """Whether the scheduler should hold draft slots (KV and token budget) for this sequence this
        step, drafting from ``source``: not when nothing would draft, nor for one the policy last
        kept at depth 0 with this source, except on exploration steps. Reserving for every sequence
        would take the batch's token budget from prefills even when speculation is off."""
        if source is None:
            return False
        return self.num_steps % self.explore_every == 0 or self.last_depth.get(seq_id, {}).get(source, 1) > 0

    def verify_model(self, num_seqs: int | None) -> CostTable:
        """The verify-cost table for a step of ``num_seqs`` sequences: the one measured at that
        many (bucketed as sizes are) once it has two sizes to interpolate, else all steps'."""
        table = None if num_seqs is None else self.verify_cost_by_seqs.get(size_bucket(num_seqs))
        return table if table is not None and len(table.buckets) >= 2 else self.verify_cost

    def choose(self, slots: list[DecodeSlot], base_tokens: int, base_yield: int | None = None,
               num_seqs: int | None = None) -> list[int]:
        """Depth per slot this step. base_tokens: tokens in the forward besides draft nodes;
        base_yield: tokens the step yields without drafts (default: one per slot); num_seqs:
        sequences in the forward (default: unknown, all steps' costs)."""
        if not slots:
            return []
        free = [i for i, s in enumerate(slots) if not s.fixed and s.max_depth > 0 and s.source is not None]
        depths = [s.max_depth if s.fixed else 0 for s in slots]
        if not free:
            return depths
        if not self.verify_cost.measured:  # nothing known yet: speculate, which measures
            for i in free:
                depths[i] = slots[i].max_depth
            return self._remember(slots, depths)
        priors = {src: self.estimator(src).global_rates() for src in {slots[i].source for i in free}}
        K = max(slots[i].max_depth for i in free)
        rates = np.array([self.estimator(slots[i].source).rates(slots[i].seq_id, priors[slots[i].source])[:K]
                          for i in free])
        gains = np.cumprod(rates, axis=1)
        fixed_extra = sum(s.nodes_at(d) for d, s in zip(depths, slots))
        chosen, self.last_goodput = choose_depths(
            gains, np.array([slots[i].max_depth for i in free]), base_tokens + fixed_extra,
            self.verify_model(num_seqs), self.draft_model(set(priors)), min_gain=self.min_gain,
            base_yield=len(slots) if base_yield is None else base_yield,
            widths=np.array([slots[i].width for i in free]),
            node_caps=np.array([slots[i].nodes_at(slots[i].max_depth) for i in free]),
            extra_nodes=np.array([slots[i].siblings - 1 for i in free]))
        for i, d in zip(free, chosen.tolist()):
            depths[i] = int(d)
        for i in free:  # a source never verified yet drafts its full depth once: that measures it
            if not self.estimator(slots[i].source).glob.offered:
                depths[i] = slots[i].max_depth
        if self.num_steps % self.explore_every == 0:
            k = self.num_steps // self.explore_every
            i = free[k % len(free)]
            full = k % self.full_explore_every == 0
            depths[i] = slots[i].max_depth if full else min(slots[i].max_depth, depths[i] + 1)
        return self._remember(slots, depths)

    def node_floor(self, base_tokens: int, num_seqs: int | None = None) -> float:
        """The acceptance probability a draft node must be expected to reach to pay for its verified
        row this step: the seconds one more token adds to a forward of ``base_tokens`` (the verify
        table's slope) times the goodput the last ``choose`` expected (tokens/s). A node below it
        adds less to the step's tokens than its row adds to its time. 0 until both are measured;
        at most 0.5 (a noisy table must not starve drafts that are right more often than not)."""
        if self.last_goodput is None or not self.verify_cost.measured:
            return 0.0
        verify_s = self.verify_model(num_seqs)
        marginal_s = verify_s(base_tokens + 1) - verify_s(base_tokens)
        return min(max(marginal_s * self.last_goodput, 0.0), 0.5)

    def _remember(self, slots: list[DecodeSlot], depths: list[int]) -> list[int]:
        for s, d in zip(slots, depths):
            if s.source is not None:
                self.last_depth.setdefault(s.seq_id, {})[s.source] = d
        return depths

    def record(self, seq_id: int, depth: int, num_accepted: int, source: str = "") -> None:
        """The verified draft of ``seq_id`` this step, drafted from ``source``."""
        self.estimator(source).record(seq_id, depth, num_accepted)

    def observe_verify(self, num_tokens: int, seconds: float, num_seqs: int | None = None) -> None:
        self.verify_cost.observe(num_tokens, seconds)
        if num_seqs is not None and num_seqs > 0:
            self.verify_cost_by_seqs.setdefault(size_bucket(num_seqs), CostTable()).observe(num_tokens, seconds)

    def observe_draft(self, num_seqs: int, depth: int, seconds: float, sources: set = frozenset()) -> None:
        """One draft round's seconds; ``sources``: the draft sources of the drafting sequences (a
        source's own table learns only from steps where it drafted alone)."""
        if depth > 0 and num_seqs > 0:
            self.draft_cost.observe(num_seqs, seconds / depth)
            if len(sources) == 1:
                self.draft_cost_by_source.setdefault(next(iter(sources)), CostTable()).observe(num_seqs, seconds / depth)

    def draft_model(self, sources: set) -> CostTable:
        """The draft-cost table for a step drafting from ``sources``: that source's own once measured
        when there is one source, else all rounds'."""
        table = self.draft_cost_by_source.get(next(iter(sources))) if len(sources) == 1 else None
        return table if table is not None and table.measured else self.draft_cost

    def release(self, seq_id: int) -> None:
        for est in self.acceptance.values():
            est.release(seq_id)
        self.last_depth.pop(seq_id, None)
