"""The monitoring configs (ray_configs/monitoring): they parse, every specray metric they query
exists in EngineMetrics, the dashboard has the panels operators need, and the alerts fire at the
agreed thresholds."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from cluster.metrics import EngineMetrics

DIR = Path(__file__).resolve().parent.parent / "ray_configs" / "monitoring"
NAME = re.compile(r"specray:[A-Za-z0-9_:]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every series name an EngineMetrics registry can export (from a real registry)."""
    names = set()
    for fam in EngineMetrics().registry.collect():
        names.update(fam.name + s for s in SUFFIXES[fam.type])
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads((DIR / "grafana_dashboard.json").read_text())


@pytest.fixture(scope="module")
def rules() -> dict[str, dict]:
    doc = yaml.safe_load((DIR / "specray_alerts.yml").read_text())
    out = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] not in out, rule["alert"]
            out[rule["alert"]] = rule
    return out


def _exprs(dashboard: dict) -> dict[str, list[str]]:
    """Panel title -> its query expressions."""
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"] if p["type"] != "row"}


def _check_query(expr: str, exported: set[str]) -> set[str]:
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
    names = set(NAME.findall(expr))
    unknown = names - exported
    assert not unknown, f"{sorted(unknown)} are not exported by EngineMetrics (query: {expr})"
    return names


def test_exported_names_are_the_agreed_ones(exported):
    for name in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total",
                 "spec_decode_draft_seconds_bucket", "spec_decode_verify_seconds_bucket",
                 "time_to_first_token_seconds_bucket", "time_per_output_token_seconds_bucket",
                 "e2e_request_latency_seconds_bucket", "request_success_total", "prompt_tokens_total",
                 "generation_tokens_total", "num_requests_running", "num_requests_waiting", "kv_blocks_used",
                 "kv_blocks_total", "kv_cache_usage_perc", "prefix_cache_queries_total", "prefix_cache_hits_total",
                 "http_requests_total"):
        assert "specray:" + name in exported, name


def test_dashboard_queries_known_metrics(dashboard, exported):
    used = set()
    for title, exprs in _exprs(dashboard).items():
        assert exprs, f"panel {title!r} has no query"
        for expr in exprs:
            used |= _check_query(expr, exported)
    # every metric family is shown somewhere
    families = {n.removesuffix(s) for n in exported for s in ("_total", "_bucket", "_sum", "_count") if n.endswith(s)}
    families |= {n for n in exported if not n.endswith(("_total", "_bucket", "_sum", "_count"))}
    shown = {f for f in families if any(u.startswith(f) for u in used)}
    assert shown == families, f"not on the dashboard: {sorted(families - shown)}"


def test_dashboard_has_the_panels_operators_need(dashboard):
    exprs = _exprs(dashboard)

    def panel(*words: str) -> list[str]:
        hits = [t for t in exprs if all(w.lower() in t.lower() for w in words)]
        assert len(hits) == 1, f"one panel titled with {words}, found {hits}"
        return exprs[hits[0]]

    acc = " ".join(panel("acceptance rate"))
    assert re.search(r"accepted_tokens_total.*\)\s*/\s*sum.*draft_tokens_total", acc), acc
    assert re.match(r"1 \+ .*accepted_tokens_total.*/.*num_drafts_total", " ".join(panel("mean accepted length")))
    assert "by (position)" in " ".join(panel("per-position"))
    for name, hist in (("TTFT", "time_to_first_token"), ("TPOT", "time_per_output_token"), ("E2E", "e2e_request")):
        qs = panel(name, "p50", "p95")
        assert any(q.startswith("histogram_quantile(0.5,") and hist in q for q in qs), qs
        assert any(q.startswith("histogram_quantile(0.95,") and hist in q for q in qs), qs
    assert any("generation_tokens_total" in q for q in panel("tokens per second"))
    assert {"num_requests_running", "num_requests_waiting"} <= {n.split(":")[1] for q in panel("running", "waiting")
                                                                 for n in NAME.findall(q)}
    assert any("kv_" in q for q in panel("KV cache usage"))
    assert "prefix_cache_hits_total" in " ".join(panel("prefix cache hit rate"))
    errors = " ".join(panel("HTTP errors", "status"))
    assert "by (status)" in errors and 'status!~"2.."' in errors
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["title"]


def test_alert_queries_known_metrics(rules, exported):
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
        _check_query(rule["expr"], exported)


def _threshold(expr: str, op: str) -> float:
    m = re.search(rf"\)\s*{re.escape(op)}\s*([0-9.]+)\s*$", expr.strip())
    assert m, f"no trailing '{op} <number>' in {expr}"
    return float(m.group(1))


def _acceptance_rules(rules: dict) -> list[dict]:
    return [r for r in rules.values() if "spec_decode_num_accepted_tokens_total" in r["expr"]]


@pytest.mark.parametrize("severity,threshold,duration", [("warning", 0.5, "10m"), ("critical", 0.3, "5m")])
def test_acceptance_rate_alerts(rules, severity, threshold, duration):
    (rule,) = [r for r in _acceptance_rules(rules) if r["labels"]["severity"] == severity]
    num, _, den = rule["expr"].partition(")))\n")
    assert "spec_decode_num_accepted_tokens_total" in num and "spec_decode_num_draft_tokens_total" in den, rule["expr"]
    assert den.lstrip().startswith("/ sum("), rule["expr"]
    assert _threshold(rule["expr"], "<") == threshold
    assert rule["for"] == duration


def test_tpot_regression_alert(rules):
    (rule,) = [r for r in rules.values() if "time_per_output_token_seconds_bucket" in r["expr"]]
    recent, _, baseline = rule["expr"].partition("> 1.5 *")
    assert baseline, rule["expr"]
    assert "histogram_quantile(0.95," in recent and "[15m]" in recent
    assert "histogram_quantile(0.95," in baseline.split("and")[0] and "[1d]" in baseline.split("and")[0]


def test_availability_alerts(rules):
    exprs = {name: r["expr"] for name, r in rules.items()}
    assert any(re.search(r'status=~"5\.\."', e) for e in exprs.values()), "a 5xx-rate alert"
    assert any(e.strip().startswith("up{") and e.strip().endswith("== 0") for e in exprs.values()), "a down alert"
    assert any("ray_serve_deployment_replica_healthy" in e for e in exprs.values()), "a replica-down alert"


def test_prometheus_config_loads_the_rules():
    cfg = yaml.safe_load((DIR / "prometheus.yml").read_text())
    for f in cfg["rule_files"]:
        assert (DIR / f).is_file(), f
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["specray"]["metrics_path"] == "/metrics"
    # the rules select the job the config scrapes
    text = (DIR / "specray_alerts.yml").read_text()
    assert 'job="specray"' in text
