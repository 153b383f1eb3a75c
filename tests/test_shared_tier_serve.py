"""The shared KV tier between two live Serve replicas (issue 27): the application `specray serve`
builds, with num_replicas=2 and kv_tier on. One replica computes a long prompt's prefill and
publishes its blocks; the other, asked the same prompt, fetches them instead of computing them
(``prompt_tokens_details.cached_tokens``, its own prefix-cache and ``kv_shared`` counters, the
tier's) and answers the same text (greedy). Which replica answered: the ``x-specray-replica`` header,
checked against the replica ids the metrics hub knows. When the tier's host replica dies, Serve
starts another with a new tier, and the engine replicas share through that one."""
from __future__ import annotations

import time

import pytest

from deployments.replica_state import REPLICA_HEADER
from tests.serve_app import serve_app
from tests.test_metrics import _scrape, sample_value

pytestmark = [pytest.mark.ray, pytest.mark.model]

APP = "specray-shared-tier-test"
BS = 16  # EngineConfig's default block size (tests.serve_app.ngram_engine keeps it)
# fetch_timeout_ms: a loaded 2-core CI box must not turn the fetch into a timeout (a miss, recomputed)
TIER = {"enabled": True, "capacity_gb": 0.25, "fetch_timeout_ms": 60_000}
COLORS = ("red", "green", "blue", "white", "black")
MAX_TRIES = 16  # Serve picks either idle replica at random: 2**-16 that the other one never answers


def _prompt(log: int) -> str:
    """Some 320 tokens (20 blocks), a different text from the first block on for each ``log``."""
    shelves = " ".join(f"Shelf {i} holds {(i * 7 + log) % 11 + 2} boxes of {COLORS[(i + log) % 5]} tiles."
                       for i in range(24))
    return f"Inventory log {log}. {shelves} The shelf with the most boxes is"


@pytest.fixture(scope="module")
def two_replicas(ray_cluster):
    with serve_app(APP, num_replicas=2, num_cpus=0.5, kv_tier=TIER) as url:
        yield url


def _replica_snapshots() -> dict:
    """Each live replica's latest metrics, by Serve replica id (what its /metrics push says); {} until
    the first push has started the metrics hub."""
    import ray

    from deployments.metrics_hub import SERVE_NAMESPACE, hub_name

    try:
        hub = ray.get_actor(hub_name(APP, "OpenAIIngress"), namespace=SERVE_NAMESPACE)
    except ValueError:
        return {}
    return ray.get(hub.replicas.remote())


def _wait_for(what: str, check, timeout_s: float = 60):
    """Poll ``check()`` until it returns something truthy (replicas push their metrics every 2 s)."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return result


def _v(snap, name: str, **labels) -> float:
    return sample_value(snap, "specray:" + name, **labels)


def _replicas_on_the_tier(blocks: int | None = None) -> dict:
    """Both replicas' snapshots once each reports the tier's figures (it holds the tier's handle),
    the tier holding ``blocks`` blocks if given; {} before."""
    s = _replica_snapshots()
    on = [_v(snap, "kv_shared_tier_capacity_bytes") == TIER["capacity_gb"] * 2**30
          and (blocks is None or _v(snap, "kv_shared_tier_blocks") == blocks) for snap in s.values()]
    return s if len(s) == 2 and all(on) else {}


def _complete(url: str, prompt: str) -> tuple[str, dict]:
    """-> (the replica that answered, the completion)."""
    import requests

    r = requests.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers[REPLICA_HEADER], r.json()


def _tier_stats() -> dict:
    from ray import serve

    return serve.get_deployment_handle("SharedKVTier", APP).stats.remote().result()


def _share(url: str, prompt: str, replicas: dict) -> dict:
    """One replica computes ``prompt`` and publishes its blocks, then the same request goes out until
    the other replica answers it. Checks the answers (same text; cached tokens: none on the first,
    then all whole blocks, its own cache on the first replica, fetched on the other) and returns
    what the replicas' metrics say once every answer is in them (``snaps``), with ``first`` and
    ``other`` (replica ids), ``n`` (prompt tokens) and ``full`` (of those, whole blocks before the last)."""
    before = _tier_stats()["put_blocks"]
    first_replica, first = _complete(url, prompt)
    assert first_replica in replicas, (first_replica, list(replicas))
    n = first["usage"]["prompt_tokens"]
    full = (n - 1) // BS * BS  # what a prefix hit can cover: whole blocks, never the last token
    assert full >= 12 * BS and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    text = first["choices"][0]["text"]
    assert text
    # publishing is not awaited: wait until the tier holds every whole prompt block
    _wait_for("the prefix to be published", lambda: _tier_stats()["put_blocks"] - before == n // BS)

    for sent in range(2, MAX_TRIES + 2):  # the same prompt until the other replica answers it
        replica, again = _complete(url, prompt)
        assert replica in replicas, (replica, list(replicas))
        assert again["choices"][0]["text"] == text  # greedy: fetched K/V or computed, the same answer
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == full  # on the first: its own cache
        if replica != first_replica:
            break
    else:
        pytest.fail(f"replica {first_replica} answered all {MAX_TRIES + 1} requests")
    total = sum(_v(snap, "request_success_total") for snap in replicas.values()) + sent

    def all_answers_pushed():
        s = _replica_snapshots()
        return sum(_v(snap, "request_success_total") for snap in s.values()) == total and s

    snaps = _wait_for("every answer in its replica's metrics", all_answers_pushed)
    return {"snaps": snaps, "first": first_replica, "other": replica, "n": n, "full": full}


def test_other_replica_fetches_the_published_prefix(two_replicas):
    replicas = _wait_for("both replicas to see the tier", _replicas_on_the_tier)
    r = _share(two_replicas, _prompt(0), replicas)
    n, full, other, mine = r["n"], r["full"], r["snaps"][r["other"]], r["snaps"][r["first"]]
    block_bytes = _tier_stats()["put_bytes"] // (n // BS)
    # the other replica computed only the prompt's last, partial block: the rest came from the tier
    assert _v(other, "kv_shared_lookups_total", result="hit") == 1
    assert _v(other, "kv_shared_lookups_total") == 1  # no miss, timeout or error
    assert _v(other, "kv_shared_blocks_total", direction="fetched") == full // BS
    assert _v(other, "kv_shared_bytes_total", direction="fetched") == full // BS * block_bytes
    computed = {rid: _v(snap, "prefix_cache_queries_total") - _v(snap, "prefix_cache_hits_total")
                for rid, snap in r["snaps"].items()}  # prompt tokens each replica computed
    assert computed[r["other"]] == n - full
    assert _v(other, "kv_shared_blocks_total", direction="published") == n // BS - full // BS
    # the first replica computed the whole prompt once, fetched nothing, published every whole block
    assert computed[r["first"]] == n + (_v(mine, "request_success_total") - 1) * (n - full)
    assert _v(mine, "kv_shared_lookups_total", result="miss") == _v(mine, "kv_shared_lookups_total") == 1
    assert _v(mine, "kv_shared_blocks_total", direction="fetched") == 0
    assert _v(mine, "kv_shared_blocks_total", direction="published") >= n // BS
    stats = _tier_stats()
    assert (stats["lookup_hits"], stats["hit_blocks"]) == (1, full // BS)
    # what an operator scrapes: the application's totals
    scrape = _scrape(two_replicas)
    assert scrape[("specray:kv_shared_lookups_total", (("result", "hit"),))] == 1
    assert scrape[("specray:kv_shared_blocks_total", (("direction", "fetched"),))] == full // BS


def test_every_answer_names_its_replica(two_replicas):
    """The header on a success, an error and /metrics, naming a replica the hub knows."""
    import requests

    replicas = _wait_for("both replicas", lambda: len(s := _replica_snapshots()) == 2 and s)
    answers = [requests.get(f"{two_replicas}/metrics", timeout=60),
               requests.post(f"{two_replicas}/v1/completions", json={"prompt": "x", "model": "nope"}, timeout=60),
               requests.get(f"{two_replicas}/health", timeout=60)]
    assert [r.status_code for r in answers] == [200, 404, 200]
    assert all(r.headers.get(REPLICA_HEADER) in replicas for r in answers), [r.headers for r in answers]


def test_replicas_share_through_the_new_tier_after_its_host_restarts(two_replicas):
    """The tier host's replica dies, and its tier actor with it (the owner); Serve starts another host
    with a new, empty tier. The engine replicas let go of the dead tier and look the new one up by
    name: they report its figures, and one replica's prefix reaches the other through it."""
    import ray
    from ray.serve._private.common import REPLICA_ID_FULL_ID_STR_PREFIX
    from ray.serve._private.constants import SERVE_NAMESPACE

    _wait_for("both replicas to see the tier", _replicas_on_the_tier)
    _complete(two_replicas, _prompt(1))  # the old tier holds something
    _wait_for("the old tier to fill", lambda: _tier_stats()["blocks"] > 0)
    host = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"{REPLICA_ID_FULL_ID_STR_PREFIX}{APP}#SharedKVTier#")]
    assert len(host) == 1, host
    ray.kill(ray.get_actor(host[0], namespace=SERVE_NAMESPACE), no_restart=True)

    def new_tier_up():
        try:
            return _tier_stats()["blocks"] == 0
        except Exception:  # noqa: BLE001  the handle's dead replica, or no replica yet
            return False

    _wait_for("Serve to start a new tier host", new_tier_up)
    replicas = _wait_for("both replicas to report the new tier", lambda: _replicas_on_the_tier(blocks=0))
    r = _share(two_replicas, _prompt(2), replicas)  # the other replica's answer: cached_tokens == r["full"]
    stats = _tier_stats()  # the new tier's
    assert (stats["lookup_hits"], stats["hit_blocks"]) == (1, r["full"] // BS)
