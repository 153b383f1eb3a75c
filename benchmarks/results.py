"""What one benchmark run records (per request) and the figures it summarizes to.

A run is one method x speculation shape x temperature x concurrency over the whole prompt set.
Both the in-process engine and the HTTP client fill the same ``RequestRecord``, so every figure is
computed by the same code whichever way the requests were served.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.metrics_math import (acceptance_rate, add_positions, decode_tokens_per_s, mean_accepted_length,
                                     per_position_acceptance, percentile, speedup, tpot_s)

BASELINE = "none"


@dataclass(slots=True)
class RequestRecord:
    category: str
    output_tokens: int
    e2e_s: float
    ttft_s: float | None  # None: no token came back
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Variant:
    """How much is speculated: a chain of ``spec_tokens`` drafts, a token ``tree`` (expansion
    config), or neither (the baseline, or the server's own policy)."""

    spec_tokens: int | None = None
    tree: str | None = None
    adaptive: bool = False  # the engine's adaptive policy picks each depth, up to spec_tokens
    tree_width: int | None = 1  # > 1: the EAGLE head grows dynamic trees of this width (K depths); None: the engine's default
    tree_nodes: int | None = None  # those trees' cap on draft nodes (None: width x K, or the engine's default)

    @property
    def label(self) -> str:
        if self.tree:
            return f"tree {self.tree}"
        width = f" w{self.tree_width}" if (self.tree_width or 1) > 1 else ""
        width += f" n{self.tree_nodes}" if self.tree_nodes is not None else ""
        if self.adaptive:
            return f"auto K<={self.spec_tokens}{width}"
        return "-" if self.spec_tokens is None else f"K={self.spec_tokens}{width}"


@dataclass(slots=True)
class Run:
    method: str
    variant: Variant
    temperature: float
    concurrency: int
    wall_s: float
    records: list[RequestRecord]


def summarize(records: list[RequestRecord], wall_s: float | None = None) -> dict:
    """Latency percentiles, tokens/s and speculation figures of a group of requests.

    ``tokens_per_s`` (only with ``wall_s``): output tokens of the whole run / its wall time, the
    throughput figure. ``request_tokens_per_s``: output tokens / summed E2E latency, the per-request
    decode speed, which is what a category inside a mixed batch can be compared on.
    ``decode_tokens_per_s``: tokens after the first / time after the first token, summed over
    requests: what speculation speeds up (prefill, in TTFT, is the same work with or without it)."""
    ok = [r for r in records if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok]
    tpot = [t for r in ok if r.ttft_s is not None
            for t in [tpot_s(r.e2e_s, r.ttft_s, r.output_tokens)] if t is not None]
    drafts = sum(r.num_drafts for r in ok)
    accepted = sum(r.num_accepted_tokens for r in ok)
    per_pos: list[int] = []
    for r in ok:
        per_pos = add_positions(per_pos, r.accepted_per_pos)
    out = {
        "num_requests": len(records), "num_errors": len(records) - len(ok), "output_tokens": tokens,
        "request_tokens_per_s": tokens / sum(e2e) if sum(e2e) > 0 else None,
        "decode_tokens_per_s": decode_tokens_per_s([(r.e2e_s, r.ttft_s, r.output_tokens) for r in ok
                                                    if r.ttft_s is not None]),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
        "tpot_p50_s": percentile(tpot, 50), "tpot_p95_s": percentile(tpot, 95),
        "e2e_p50_s": percentile(e2e, 50), "e2e_p95_s": percentile(e2e, 95),
        "acceptance_rate": acceptance_rate(accepted, sum(r.num_draft_tokens for r in ok)),
        "mean_accepted_length": mean_accepted_length(accepted, drafts),
        "per_position_acceptance": per_position_acceptance(per_pos, drafts),
    }
    if wall_s is not None:
        out = {"wall_s": wall_s, "tokens_per_s": tokens / wall_s if wall_s > 0 else None, **out}
    return out


def run_row(run: Run) -> dict:
    """One JSON row: the run's key, its overall figures and the same figures per category."""
    cats: dict[str, list[RequestRecord]] = {}
    for r in run.records:
        cats.setdefault(r.category, []).append(r)
    return {"method": run.method, "spec": run.variant.label, "spec_tokens": run.variant.spec_tokens,
            "tree": run.variant.tree, "tree_width": run.variant.tree_width,
            "tree_nodes": run.variant.tree_nodes, "temperature": run.temperature, "concurrency": run.concurrency,
            **summarize(run.records, run.wall_s), "speedup": None, "decode_speedup": None,
            "categories": {c: {**summarize(rs), "speedup": None} for c, rs in sorted(cats.items())}}


def add_speedups(rows: list[dict]) -> None:
    """Speedup vs the no-speculation baseline of the same run at the same concurrency and
    temperature: whole-run tokens/s overall, per-request tokens/s per category; ``decode_speedup``:
    the same for the decode phase alone (``decode_tokens_per_s``)."""
    base = {(r["concurrency"], r["temperature"]): r for r in rows if r["method"] == BASELINE}
    for r in rows:
        b = base.get((r["concurrency"], r["temperature"]))
        if b is None:
            continue
        r["speedup"] = speedup(r["tokens_per_s"], b["tokens_per_s"])
        r["decode_speedup"] = speedup(r.get("decode_tokens_per_s"), b.get("decode_tokens_per_s"))
        for cat, figs in r["categories"].items():
            bc = b["categories"].get(cat)
            figs["speedup"] = speedup(figs["request_tokens_per_s"], bc and bc["request_tokens_per_s"])
