"""A short soak (benchmarks/soak.py) and an overload burst (benchmarks/overload.py) against a Serve
application of the default model. Soak: mixed traffic with cancelled streams and bad requests for
~45 s, then no 5xx, no KV block left in use, the greedy check identical every time and the
replica's RSS bounded after the warm-up. Burst: far more requests at once than the replica admits
and queues; every answer a 200 or an OpenAI-shaped 429/503 with Retry-After, all of them counted in
/metrics, no KV block left in use. The full runs are benchmark commands (``python -m
benchmarks.soak``, ``python -m benchmarks.overload``)."""
from __future__ import annotations

import pytest

from benchmarks.overload import _openai_shaped, run as run_overload
from benchmarks.soak import SoakOptions, run_soak, summary
from tests.serve_app import serve_app

pytestmark = [pytest.mark.ray, pytest.mark.model]


@pytest.fixture(scope="module")
def base_url(ray_cluster):
    with serve_app("specray-soak", num_cpus=1, max_ongoing_requests=4, max_queued_requests=4) as url:
        yield url


def test_short_soak_leaks_nothing_and_memory_stays_bounded(base_url):
    opts = SoakOptions(minutes=0.75, concurrency=3, cancel=0.25, bad=0.1, warmup_minutes=0.25, report_every_s=5,
                       greedy_every_s=8, max_tokens=24, seed=1)
    res = run_soak(base_url, opts)
    print(summary(res, opts, base_url))
    assert res.failures(max_rss_growth=0.15) == []
    assert res.statuses[200] >= 20 and res.cancelled >= 1 and sum(res.bad_statuses.values()) >= 1
    assert len(res.greedy) >= 4 and not res.client_errors
    assert res.warm is not None and res.warm.rss > 100 * 2**20


def test_a_burst_beyond_the_queue_is_answered_200_or_openai_shaped_429(base_url):
    results, problems = run_overload(base_url, concurrency=24, rounds=1, max_tokens=8, timeout_s=300)
    answers = results[0].answers
    assert problems == [] and results[0].bad == []
    assert answers["200"] >= 4  # the admitted ones complete
    assert answers["429 OpenAI-shaped"] >= 1  # 24 > 4 running + 4 waiting: the rest are turned away


def test_overload_classifies_what_is_not_openai_shaped():
    ok = b'{"error": {"message": "server is at capacity", "type": "rate_limit_error", "code": null}}'
    assert _openai_shaped(429, ok, {"Retry-After": "1"}) is None
    assert "without Retry-After" in _openai_shaped(429, ok, {})
    proxy = b"Request dropped due to backpressure (num_queued_requests=80, max_queued_requests=80)"
    assert "not an OpenAI error body (text/plain)" in _openai_shaped(503, proxy, {"Content-Type": "text/plain"})
    assert "without message/type" in _openai_shaped(429, b'{"error": {"code": 1}}', {"Retry-After": "1"})
