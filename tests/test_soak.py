"""A short soak (benchmarks/soak.py) against a Serve application of the default model: mixed
traffic with cancelled streams and bad requests for ~45 s, then no 5xx, no KV block left in use,
the greedy check identical every time and the replica's RSS bounded after the warm-up. The full
soak is a benchmark command (``python -m benchmarks.soak``)."""
from __future__ import annotations

import pytest

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
