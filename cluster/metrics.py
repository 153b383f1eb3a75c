"""Prometheus metrics of one engine (aggregated across replicas by ``cluster.metrics_merge``).

``EngineMetrics`` owns its own ``CollectorRegistry`` (never the process-global default one): tests
build many engines in one process, and each Serve replica exports exactly its own engine's series.
The names follow vLLM's (``vllm:`` -> ``specray:``) so dashboards and figures compare:

- speculation counters with vLLM's definitions (``actors.sequence.SpecStats``): drafts (steps that
  carried a draft), draft tokens, accepted tokens, accepted tokens per position (position 0 = the
  first draft token); acceptance rate = accepted / draft tokens, mean accepted length
  = 1 + accepted / drafts;
- per-step histograms: proposer time, and target forward + verification time;
- speculation health that fits trees and adaptive depth (where the per-node acceptance rate is low
  by design while speculation pays), counted per step:
  ``spec_decode_num_decode_steps{drafted}``: decoding sequences per verification step, summed (one
  per sequence and step; drafted="true" when it verified at least one draft token), and
  ``spec_decode_num_decode_tokens{drafted}``: the tokens those produced (accepted drafts + 1 each).
  Tokens per decode step = tokens / steps (1.0 while nothing drafts; drafted="true" alone: tokens
  per speculative step). ``spec_decode_measured_seconds``: seconds of speculative decode steps
  (no prefill chunk, some draft; drafting + forward + verification) that have a plain-decoding
  baseline, ``spec_decode_plain_equivalent_seconds``: what plain decoding would have needed for
  their tokens (cluster/spec_guard.py). Estimated speedup of speculation =
  plain-equivalent seconds / measured seconds over any window (rate() both);
- the fallback guard (cluster/spec_guard.py): ``spec_decode_estimated_speedup``, the speedup of
  its last judged window (absent until one was judged; the mean over replicas when merged),
  ``spec_decode_guard_tripped`` (1 while it holds speculation off; merged: replicas tripped) and
  ``spec_decode_guard_trips`` (times it tripped);
- ``engine_up``: 1 while the engine's step loop runs (cluster/async_engine.py; an engine without a
  loop reports 1); merged: replicas whose engine runs;
- per-request histograms, recorded once when a request finishes: TTFT, TPOT (the request's mean
  time per output token after the first, (e2e - ttft) / (n - 1), for n >= 2 output tokens) and
  E2E latency; finished requests by reason; prompt tokens (at finish) and generation tokens (as
  they are emitted, so tokens/s moves while long requests stream);
- gauges read at scrape time from the scheduler and the KV service (running / waiting requests, KV
  blocks, usage) and the prefix-cache token counters of the KV allocator. ``num_requests_waiting``
  counts every request received and not yet running: the engine's waiting queue plus the line of
  the replica's admission control (``watch_queue``; deployments/admission.py), which
  ``num_requests_queued`` shows alone (0 without one). ``process_resident_memory_bytes``: the
  RSS of the engine's process (the replica; summed over replicas when merged), read at scrape
  time; ``kv.stats()`` is the one interface, so a remote KV service (``cluster.replica.RemoteKV``:
  an actor call) works like the in-process one; if it cannot answer, the KV series are left out of
  that scrape rather than reported as zeros;
- ``prediction_tokens{outcome}``: the tokens of finished requests' predictions (OpenAI's predicted
  outputs) that their answers repeated (``accepted``) or not (``rejected``), as their usage reports;
- ``structured_output_requests{kind}``: finished requests held to a grammar (``response_format``:
  json_object, json_schema, regex, grammar, choice; tool calls a request's tool_choice requires:
  tool_calls), and ``grammar_forced_tokens``: the tokens their
  grammars forced, drafted without a proposer and accepted (actors/structured_output.py);
- HTTP answers by route and status (filled by the ingress middleware);
- ``gc_pause_seconds{generation}`` and ``gc_frozen_objects``: Python's garbage collector in the process
  (actors/gc_pauses.py);
- ``cuda_graph_forwards{model, mode}`` (engines with CUDA graphs only): the target's forwards and
  the EAGLE head's steps replayed from a graph or run eagerly (no captured bucket fits).

The engine calls ``observe_step`` once per step and ``record_output`` once per emitted output;
neither does per-token work.

Aggregation across replicas: ``cluster.metrics_merge``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from actors import gc_pauses
from actors.structured_output import Kind
from cluster.heap import resident_bytes
from cluster.metrics_merge import KV_TOTAL, KV_USAGE, KV_USED, P, SPEEDUP, Snapshot, snapshot

if TYPE_CHECKING:
    from cluster.outputs import RequestOutput
    from cluster.spec_guard import SpecGuard, StepYield

log = logging.getLogger("specray.metrics")

FINISH_REASONS = ("stop", "length", "abort", "error")

_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 10.0)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0)


class EngineMetrics:
    """The metrics of one engine in a registry of its own (``self.registry``)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.num_drafts = Counter(P + "spec_decode_num_drafts", "Verification steps that carried draft tokens",
                                  registry=r)
        self.num_draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.num_accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                           registry=r)
        self.accepted_per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each position (0 = first draft token)",
                                        ["position"], registry=r)
        self.draft_seconds = Histogram(P + "spec_decode_draft_seconds", "Proposer time per step (steps with drafts)",
                                       buckets=_STEP_BUCKETS, registry=r)
        self.verify_seconds = Histogram(P + "spec_decode_verify_seconds",
                                        "Target forward + verification time per step", buckets=_STEP_BUCKETS,
                                        registry=r)
        self.decode_steps = Counter(P + "spec_decode_num_decode_steps",
                                    "Decoding sequences per verification step, summed (drafted: verified a draft)",
                                    ["drafted"], registry=r)
        self.decode_tokens = Counter(P + "spec_decode_num_decode_tokens",
                                     "Tokens those sequence-steps produced (accepted drafts + 1 each)",
                                     ["drafted"], registry=r)
        self.measured_seconds = Counter(P + "spec_decode_measured_seconds",
                                        "Seconds of speculative decode steps with a plain-decoding baseline",
                                        registry=r)
        self.plain_equivalent_seconds = Counter(P + "spec_decode_plain_equivalent_seconds",
                                                "Estimated seconds plain decoding would need for those steps' tokens",
                                                registry=r)
        for drafted in ("true", "false"):
            self.decode_steps.labels(drafted=drafted)
            self.decode_tokens.labels(drafted=drafted)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token per request",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(P + "time_per_output_token_seconds",
                              "Mean time per output token after the first, per request", buckets=_TPOT_BUCKETS,
                              registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to last token per request",
                             buckets=_E2E_BUCKETS, registry=r)
        self.request_success = Counter(P + "request_success", "Finished requests by finish reason",
                                       ["finished_reason"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Output tokens emitted", registry=r)
        self.http_requests = Counter(P + "http_requests", "HTTP answers by route template and status",
                                     ["route", "status"], registry=r)
        self.prediction_tokens = Counter(P + "prediction_tokens",
                                         "Tokens of finished requests' predictions their answers repeated or not",
                                         ["outcome"], registry=r)
        for outcome in ("accepted", "rejected"):
            self.prediction_tokens.labels(outcome=outcome)
        self.structured_requests = Counter(P + "structured_output_requests",
                                           "Finished requests held to a grammar (response_format), by kind",
                                           ["kind"], registry=r)
        for kind in get_args(Kind):
            self.structured_requests.labels(kind=kind)
        self.forced_tokens = Counter(P + "grammar_forced_tokens",
                                     "Tokens structured-output grammars forced, drafted and accepted", registry=r)
        for reason in FINISH_REASONS:
            self.request_success.labels(finished_reason=reason)
        self._state = _EngineStateCollector()
        r.register(self._state)
        gc_pauses.PAUSES.install()

    def watch(self, scheduler, kv, num_positions: int, guard: SpecGuard | None = None) -> None:
        """Read gauges from ``scheduler`` (running / waiting queues), ``kv`` (``stats()``) and the
        fallback ``guard`` (if any) at scrape time; show per-position acceptance for positions
        0..num_positions-1 from the start."""
        self._state.scheduler, self._state.kv, self._state.guard = scheduler, kv, guard
        for i in range(num_positions):
            self.accepted_per_pos.labels(position=str(i))

    def watch_queue(self, num_queued: Callable[[], int]) -> None:
        """``num_requests_queued`` reads ``num_queued()`` at scrape time (requests in the replica's
        admission line, before the engine), and ``num_requests_waiting`` counts them too."""
        self._state.queued = num_queued

    def watch_kv_copies(self, copies: Callable[[], dict[str, tuple[int, float]]]) -> None:
        """``kv_offload_copy_seconds{direction}`` reads ``copies()`` at scrape time: bytes and
        seconds copied between KV tiers per direction (the verifier's ``kv_copy_stats``)."""
        self._state.kv_copies = copies

    def watch_weight_offload(self, stats: Callable[[], dict[str, float]]) -> None:
        """``weight_offload_*`` read ``stats()`` at scrape time (the verifier's WeightOffloader)."""
        self._state.weight_offload = stats

    def watch_graphs(self, **owners) -> None:
        """``cuda_graph_forwards{model, mode}`` reads the GraphRunners (``.graphs``) of ``owners``
        (model label -> the verifier, the proposer; None or no graphs: not shown) at scrape time:
        forwards replayed from a captured graph (mode graph) and those run eagerly (eager: no
        captured bucket fits, e.g. a long prefill chunk). Exported only by an engine that has graphs."""
        runners = {name: getattr(o, "graphs", None) for name, o in owners.items()}
        self._state.graph_runners = {name: g for name, g in runners.items() if g is not None}

    def watch_engine_loop(self, alive: Callable[[], bool]) -> None:
        """``engine_up`` reads ``alive()`` at scrape time (the step loop that runs this engine)."""
        self._state.alive = alive

    # ---- engine hooks -----------------------------------------------------------------------
    def observe_step(self, draft_s: float | None, verify_s: float, step: StepYield | None = None) -> None:
        """One engine step: proposer time (None: nothing was drafted), forward + verification, and
        what its decoding sequences produced."""
        if draft_s is not None:
            self.draft_seconds.observe(draft_s)
        self.verify_seconds.observe(verify_s)
        if step is None:
            return
        for drafted, seqs, tokens in (("true", step.drafted_seqs, step.drafted_tokens),
                                      ("false", step.plain_seqs, step.plain_seqs)):
            if seqs:
                self.decode_steps.labels(drafted=drafted).inc(seqs)
                self.decode_tokens.labels(drafted=drafted).inc(tokens)
        if step.plain_equiv_s is not None:
            self.measured_seconds.inc(step.seconds)
            self.plain_equivalent_seconds.inc(step.plain_equiv_s)

    def record_output(self, out: RequestOutput) -> None:
        """Every output the engine emits, exactly once (a finished request's last one included)."""
        if out.delta_token_ids:
            self.generation_tokens.inc(len(out.delta_token_ids))
        if out.finished:
            self._record_finished(out)

    def _record_finished(self, out: RequestOutput) -> None:
        self.request_success.labels(finished_reason=out.finish_reason or "error").inc()
        self.prompt_tokens.inc(out.num_prompt_tokens)
        if out.num_drafts:
            self.num_drafts.inc(out.num_drafts)
            self.num_draft_tokens.inc(out.num_draft_tokens)
            self.num_accepted_tokens.inc(out.num_accepted_tokens)
            for pos, n in enumerate(out.accepted_per_pos):
                self.accepted_per_pos.labels(position=str(pos)).inc(n)
        if out.ttft_s is not None:
            self.ttft.observe(out.ttft_s)
            if out.e2e_s is not None and out.num_output_tokens > 1:
                self.tpot.observe((out.e2e_s - out.ttft_s) / (out.num_output_tokens - 1))
        if out.e2e_s is not None:
            self.e2e.observe(out.e2e_s)
        if out.structured is not None:
            self.structured_requests.labels(kind=out.structured).inc()
            self.forced_tokens.inc(out.num_forced_tokens)
        if out.num_prediction_tokens:
            self.prediction_tokens.labels(outcome="accepted").inc(out.num_accepted_prediction_tokens)
            self.prediction_tokens.labels(outcome="rejected").inc(
                out.num_prediction_tokens - out.num_accepted_prediction_tokens)

    def record_http(self, route: str, status: int | str) -> None:
        self.http_requests.labels(route=route, status=str(status)).inc()

    def snapshot(self) -> Snapshot:
        return snapshot(self.registry)


class _EngineStateCollector:
    """Gauges and prefix-cache counters computed from live engine state when scraped."""

    def __init__(self) -> None:
        self.scheduler = None
        self.kv = None
        self.guard: SpecGuard | None = None
        self.alive: Callable[[], bool] | None = None
        self.queued: Callable[[], int] | None = None
        self.kv_copies: Callable[[], dict] | None = None
        self.weight_offload: Callable[[], dict] | None = None
        self.graph_runners: dict = {}

    def collect(self) -> Iterable[Metric]:
        s = self.scheduler
        queued = self.queued() if self.queued is not None else 0
        yield GaugeMetricFamily(P + "num_requests_running", "Requests being computed",
                                value=len(s.running) if s is not None else 0)
        yield GaugeMetricFamily(P + "num_requests_waiting",
                                "Requests received and not yet running (admission line and engine queue)",
                                value=queued + (len(s.waiting) if s is not None else 0))
        yield GaugeMetricFamily(P + "num_requests_queued", "Requests in the replica's admission line",
                                value=queued)
        yield GaugeMetricFamily(P + "engine_up", "1 while the engine's step loop runs",
                                value=1.0 if self.alive is None or self.alive() else 0.0)
        preempted = CounterMetricFamily(P + "num_preemptions", "Running requests preempted for KV blocks, by "
                                        "mode (swap: KV to the host tier and back; recompute)", labels=["mode"])
        counts = getattr(s, "preemptions", None) or {}
        for mode in ("swap", "recompute"):
            preempted.add_metric([mode], counts.get(mode, 0))
        yield preempted
        rss = resident_bytes()
        if rss is not None:
            yield GaugeMetricFamily(P + "process_resident_memory_bytes", "Resident memory of the engine's process",
                                    value=rss)
        yield from gc_pauses.metric_families(P)
        yield from self._guard_metrics()
        if self.weight_offload is not None:
            yield from _weight_offload_metrics(self.weight_offload())
        if self.graph_runners:
            forwards = CounterMetricFamily(P + "cuda_graph_forwards", "Forwards replayed from a CUDA graph (graph) "
                                           "or run eagerly (eager), by model (target, draft_head)",
                                           labels=["model", "mode"])
            for name, g in self.graph_runners.items():
                forwards.add_metric([name, "graph"], g.num_replays)
                forwards.add_metric([name, "eager"], g.num_eager + g.num_fallbacks)
            yield forwards
        stats = self._kv_stats()
        if stats is None:
            return
        total, free = stats["num_blocks"], stats["num_free_blocks"]
        yield GaugeMetricFamily(KV_USED, "KV blocks in use", value=total - free)
        yield GaugeMetricFamily(KV_TOTAL, "KV blocks in the cache", value=total)
        yield GaugeMetricFamily(KV_USAGE, "Fraction of KV blocks in use (1 = full)",
                                value=(total - free) / total if total else 0.0)
        yield CounterMetricFamily(P + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                  value=stats["prefix_queries"])
        yield CounterMetricFamily(P + "prefix_cache_hits", "Prompt tokens served from the prefix cache",
                                  value=stats["prefix_hits"])
        if "host_hits" in stats:
            yield from _kv_offload_metrics(stats)
        if self.kv_copies is not None:
            seconds = CounterMetricFamily(P + "kv_offload_copy_seconds",
                                          "Seconds spent copying KV blocks between tiers, by direction",
                                          labels=["direction"])
            for direction, (_, s) in self.kv_copies().items():
                seconds.add_metric([direction], s)
            yield seconds

    def _guard_metrics(self) -> Iterable[Metric]:
        g = self.guard
        yield GaugeMetricFamily(P + "spec_decode_guard_tripped", "1 while the fallback guard holds speculation off",
                                value=1.0 if g is not None and g.tripped else 0.0)
        yield CounterMetricFamily(P + "spec_decode_guard_trips", "Times the fallback guard turned speculation off",
                                  value=g.num_trips if g is not None else 0)
        if g is not None and g.last_speedup is not None:
            yield GaugeMetricFamily(SPEEDUP, "Estimated speedup of speculation over plain decoding, last judged window",
                                    value=g.last_speedup)

    def _kv_stats(self) -> dict | None:
        if self.kv is None:
            return {"num_blocks": 0, "num_free_blocks": 0, "prefix_queries": 0, "prefix_hits": 0}
        try:
            return self.kv.stats()
        except Exception as e:  # a remote KV service that cannot answer: leave its series out
            log.warning("KV stats unavailable for this scrape: %s", e)
            return None


def _weight_offload_metrics(w: dict) -> Iterable[Metric]:
    """Weight offload (issue 27): layers kept in host memory and what streaming them costs."""
    yield GaugeMetricFamily(P + "weight_offload_layers", "Decoder layers whose weights live in host memory",
                            value=w["layers"])
    yield GaugeMetricFamily(P + "weight_offload_host_bytes", "Bytes of offloaded weights held in host memory",
                            value=w["host_bytes"])
    yield CounterMetricFamily(P + "weight_offload_bytes", "Weight bytes copied host to device",
                              value=w["bytes_copied"])
    yield CounterMetricFamily(P + "weight_offload_copy_seconds", "Host seconds spent copying weights (CPU: the "
                              "copies; CUDA: issuing them on the side stream)", value=w["copy_seconds"])


def _kv_offload_metrics(stats: dict) -> Iterable[Metric]:
    """KV tiers (issue 27): hits per tier, blocks held per tier, bytes moved per direction (the disk
    tier's series only with a disk tier: host_to_disk are spills, disk_to_device loads)."""
    tiers = ("host", "disk") if "disk_hits" in stats else ("host",)
    hits = CounterMetricFamily(P + "kv_offload_hits", "Prompt tokens served from the prefix cache, by KV tier",
                               labels=["tier"])
    hits.add_metric(["device"], stats["prefix_hits"] - sum(stats[f"{t}_hits"] for t in tiers))
    blocks = GaugeMetricFamily(P + "kv_offload_blocks", "Prefix-cache blocks held, by KV tier", labels=["tier"])
    blocks.add_metric(["device"], stats["num_cached_blocks"])
    for t in tiers:
        hits.add_metric([t], stats[f"{t}_hits"])
        blocks.add_metric([t], stats[f"{t}_cached_blocks"])
    moved = CounterMetricFamily(P + "kv_offload_bytes", "KV bytes copied between tiers, by direction",
                                labels=["direction"])
    moved.add_metric(["device_to_host"], stats["host_bytes_out"])
    moved.add_metric(["host_to_device"], stats["host_bytes_in"])
    if "disk_hits" in stats:
        moved.add_metric(["host_to_disk"], stats["disk_bytes_out"])
        moved.add_metric(["disk_to_device"], stats["disk_bytes_in"])
    yield from (hits, blocks, moved)
