"""The monitoring configs (ray_configs/monitoring): they parse, every specray metric they query
exists in EngineMetrics, the dashboard has the panels operators need, and the alerts fire at the
agreed thresholds; with promtool installed, the rules and config pass ``promtool check`` and the
rule unit tests (specray_alerts_test.yml: every alert fires when it should and only then)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cluster.metrics import EngineMetrics
from cluster.spec_guard import SpecGuard

DIR = Path(__file__).resolve().parent.parent / "ray_configs" / "monitoring"
NAME = re.compile(r"specray:[A-Za-z0-9_:]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every series name an EngineMetrics registry can export (from a real registry)."""
    names = set()
    metrics, guard = EngineMetrics(), SpecGuard()
    guard.last_speedup = 1.0  # exported once the guard has judged a window
    metrics.watch(None, None, 1, guard)
    for fam in metrics.registry.collect():
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
                 "http_requests_total", "spec_decode_num_decode_steps_total", "spec_decode_num_decode_tokens_total",
                 "spec_decode_measured_seconds_total", "spec_decode_plain_equivalent_seconds_total",
                 "spec_decode_estimated_speedup", "spec_decode_guard_tripped", "spec_decode_guard_trips_total",
                 "engine_up"):
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


# ---- alert expressions, parsed ------------------------------------------------------------------
# PromQL binary operators, lowest precedence first (all left-associative except `^`).
_LEVELS = (("or",), ("and", "unless"), ("==", "!=", "<=", ">=", "<", ">"), ("+", "-"), ("*", "/", "%"), ("^",))
_COMPARISONS = _LEVELS[2]
_SYMBOLS = sorted((op for level in _LEVELS for op in level if not op.isalpha()), key=len, reverse=True)
_IDENT = re.compile(r"[A-Za-z0-9_:]")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_SELECTED = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{")  # a metric name with its label matchers


@dataclass(frozen=True)
class BinOp:
    op: str
    lhs: "BinOp | str"
    rhs: "BinOp | str"


def _top_level_ops(expr: str) -> list[tuple[int, str]]:
    """(position, operator) of each binary operator outside brackets and string literals."""
    ops, depth, i, quote = [], 0, 0, None
    while i < len(expr):
        ch = expr[i]
        if quote:
            i += 2 if ch == "\\" else 1
            quote = None if ch == quote else quote
            continue
        if ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            assert depth >= 0, f"unbalanced brackets at {i} in {expr!r}"
        elif depth == 0:
            word = re.match(r"[A-Za-z0-9_:]+", expr[i:]) if not (i and _IDENT.match(expr[i - 1])) else None
            if word and word.group() in ("and", "or", "unless"):
                ops.append((i, word.group()))
                i += len(word.group())
                continue
            sym = next((op for op in _SYMBOLS if expr.startswith(op, i)), None)
            if sym and _has_left_operand(expr[:i]):
                ops.append((i, sym))
                i += len(sym)
                continue
        i += 1
    assert depth == 0 and quote is None, f"unbalanced brackets or quotes in {expr!r}"
    return ops


def _has_left_operand(before: str) -> bool:
    """False for a unary sign (`-1`, `> -1`, `and -1`) and an exponent's sign (`1e-3`)."""
    before = before.rstrip()
    if not before or before[-1] in "=!<>+-*/%^":
        return False
    return not re.search(r"(^|[^A-Za-z0-9_:])([0-9.]+[eE]|and|or|unless)$", before)


def _unwrap(expr: str) -> str:
    """Drop parentheses around the whole expression."""
    while expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for i, ch in enumerate(expr):
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and i < len(expr) - 1:
                return expr
        expr = expr[1:-1].strip()
    return expr


def parse(expr: str) -> BinOp | str:
    """An expression as a tree of its binary operators; anything without one stays text."""
    expr = _unwrap(expr.strip())
    ops = _top_level_ops(expr)
    for level in _LEVELS:
        hits = [(i, op) for i, op in ops if op in level]
        if hits:
            i, op = hits[0] if level == ("^",) else hits[-1]
            return BinOp(op, parse(expr[:i]), parse(expr[i + len(op):]))
    return expr


def _comparison(node: BinOp | str) -> tuple[str, BinOp | str, float]:
    """(operator, the compared expression, threshold) of `<expr> <cmp> <number>`."""
    assert isinstance(node, BinOp) and node.op in _COMPARISONS, f"not a comparison: {node}"
    assert isinstance(node.rhs, str) and _NUMBER.fullmatch(node.rhs), f"no numeric threshold: {node}"
    return node.op, node.lhs, float(node.rhs)


def _text(node: BinOp | str) -> str:
    return node if isinstance(node, str) else f"{_text(node.lhs)} {node.op} {_text(node.rhs)}"


def _metrics(node: BinOp | str) -> set[str]:
    """Names of the metrics an expression selects (every alert's selectors carry label matchers)."""
    return set(_SELECTED.findall(_text(node)))


def test_the_expression_parser():
    tree = parse('sum(rate(a{s=~"5..", x!="<"}[5m])) / sum(b) > 0.5 and c{j="k"} > 0')
    assert tree.op == "and"
    op, ratio, threshold = _comparison(tree.lhs)
    assert (op, threshold) == (">", 0.5) and ratio.op == "/"
    assert ratio.lhs == 'sum(rate(a{s=~"5..", x!="<"}[5m]))' and ratio.rhs == "sum(b)"
    assert _comparison(tree.rhs) == (">", 'c{j="k"}', 0.0)
    scaled = parse("q(x[15m]) > 1.5 * q(x[1d])")
    assert scaled == BinOp(">", "q(x[15m])", BinOp("*", "1.5", "q(x[1d])"))
    assert parse("(a - b) - c") == BinOp("-", BinOp("-", "a", "b"), "c")
    assert parse("-1 + x") == BinOp("+", "-1", "x") and parse("x * -2") == BinOp("*", "x", "-2")
    assert parse("x > 1e-3") == BinOp(">", "x", "1e-3") and parse("a_and_b or c") == BinOp("or", "a_and_b", "c")
    assert parse("up == 0") == BinOp("==", "up", "0") and parse("(up)") == "up"
    assert _metrics(tree) == {"a", "c"}


def _ratio(node: BinOp | str) -> tuple[str, str]:
    """(numerator, denominator) text of ``sum(...) / sum(...)``."""
    assert isinstance(node, BinOp) and node.op == "/", node
    num, den = _text(node.lhs), _text(node.rhs)
    assert num.startswith("sum(") and den.startswith("sum("), node
    return num, den


def _speculation_in_use(node: BinOp | str) -> None:
    """The gate of the speculation warnings: at least 10% of decoding sequence-steps drafted."""
    op, share, value = _comparison(node)
    num, den = _ratio(share)
    assert (op, value) == (">=", 0.1)
    assert "spec_decode_num_decode_steps_total" in num and 'drafted="true"' in num
    assert "spec_decode_num_decode_steps_total" in den and "drafted" not in den


def test_no_alert_on_the_per_node_acceptance_rate(rules):
    """Trees and adaptive depth keep the per-node acceptance rate low while speculation pays."""
    assert not [n for n, r in rules.items() if "num_accepted_tokens" in r["expr"] or "num_draft_tokens" in r["expr"]]


def test_speculation_not_paying_alert(rules):
    rule = rules["SpecraySpeculationNotPaying"]
    tree = parse(rule["expr"])
    assert tree.op == "and"
    op, ratio, value = _comparison(tree.lhs)
    num, den = _ratio(ratio)
    assert "plain_equivalent_seconds_total" in num and "measured_seconds_total" in den
    assert (op, value, rule["for"], rule["labels"]["severity"]) == ("<", 1.0, "10m", "warning")
    _speculation_in_use(tree.rhs)


def test_low_tokens_per_step_alert(rules):
    rule = rules["SpecrayLowTokensPerStep"]
    tree = parse(rule["expr"])
    op, ratio, value = _comparison(tree.lhs)
    num, den = _ratio(ratio)
    assert "num_decode_tokens_total" in num and "num_decode_steps_total" in den
    assert 'drafted="true"' in num and 'drafted="true"' in den  # per speculative step, not diluted by plain ones
    assert (op, value, rule["for"], rule["labels"]["severity"]) == ("<", 1.1, "10m", "warning")
    _speculation_in_use(tree.rhs)


def test_guard_tripped_alert(rules):
    rule = rules["SpecrayFallbackGuardTripped"]
    op, tripped, value = _comparison(parse(rule["expr"]))
    assert "avg_over_time(specray:spec_decode_guard_tripped" in _text(tripped) and "[30m]" in _text(tripped)
    assert (op, value, rule["labels"]["severity"]) == (">", 0.5, "critical")


def test_tpot_regression_alert(rules):
    (rule,) = [r for r in rules.values() if "time_per_output_token_seconds_bucket" in r["expr"]]
    tree = parse(rule["expr"])
    assert isinstance(tree, BinOp) and tree.op == "and", rule["expr"]
    regression = tree.lhs
    assert isinstance(regression, BinOp) and regression.op == ">", rule["expr"]
    recent, scaled = _text(regression.lhs), regression.rhs
    assert isinstance(scaled, BinOp) and scaled.op == "*" and scaled.lhs == "1.5", rule["expr"]
    baseline = _text(scaled.rhs)
    assert "histogram_quantile(0.95," in recent and "[15m]" in recent
    assert "histogram_quantile(0.95," in baseline and "[1d]" in baseline
    op, traffic, value = _comparison(tree.rhs)  # only with enough finished requests for a p95
    assert (op, value) == (">", 0.05) and "[15m]" in _text(traffic)
    assert _metrics(traffic) == {"specray:time_per_output_token_seconds_count"}


# Every alert: its comparison, threshold and the metrics it compares (the TPOT one: above).
THRESHOLDS = {
    "SpecraySpeculationNotPaying": ("<", 1.0, {"specray:spec_decode_plain_equivalent_seconds_total",
                                               "specray:spec_decode_measured_seconds_total"}),
    "SpecrayLowTokensPerStep": ("<", 1.1, {"specray:spec_decode_num_decode_tokens_total",
                                           "specray:spec_decode_num_decode_steps_total"}),
    "SpecrayFallbackGuardTripped": (">", 0.5, {"specray:spec_decode_guard_tripped"}),
    "SpecrayMetricsDown": ("==", 0.0, {"up"}),
    "SpecrayNoHealthyReplica": ("<", 1.0, {"specray:engine_up"}),
    "SpecrayHTTP5xxRate": (">", 0.05, {"specray:http_requests_total"}),
    "SpecrayKVCacheSaturated": (">", 0.95, {"specray:kv_blocks_used", "specray:kv_blocks_total"}),
}


def test_every_alert_has_the_agreed_threshold(rules):
    assert set(rules) == set(THRESHOLDS) | {"SpecrayTPOTRegression"}
    for name, (op, threshold, metrics) in THRESHOLDS.items():
        tree = parse(rules[name]["expr"])
        condition = tree.lhs if isinstance(tree, BinOp) and tree.op == "and" else tree
        got_op, compared, got = _comparison(condition)
        assert (got_op, got, _metrics(compared)) == (op, threshold, metrics), name
    # the KV alert fires only with requests waiting
    kv = parse(rules["SpecrayKVCacheSaturated"]["expr"])
    assert kv.op == "and" and _comparison(kv.rhs)[::2] == (">", 0.0)
    assert _metrics(kv.rhs) == {"specray:num_requests_waiting"}
    # the 5xx rate is 5xx answers over all answers
    ratio = _comparison(parse(rules["SpecrayHTTP5xxRate"]["expr"]))[1]
    assert ratio.op == "/" and 'status=~"5.."' in _text(ratio.lhs) and "status" not in _text(ratio.rhs)


def test_availability_alerts(rules):
    exprs = {name: r["expr"] for name, r in rules.items()}
    assert any(re.search(r'status=~"5\.\."', e) for e in exprs.values()), "a 5xx-rate alert"
    assert any(e.strip().startswith("up{") and e.strip().endswith("== 0") for e in exprs.values()), "a down alert"
    # replica health from a metric the app exports: works where Ray's own metrics are not scraped
    # (serve_local: no Ray service-discovery file), and nothing answering counts as no replica
    healthy = parse(exprs["SpecrayNoHealthyReplica"])
    assert _metrics(healthy) == {"specray:engine_up"} and "ray_serve" not in exprs["SpecrayNoHealthyReplica"]
    assert isinstance(healthy.lhs, BinOp) and healthy.lhs.op == "or" and healthy.lhs.rhs == "vector(0)"


def test_prometheus_config_loads_the_rules():
    cfg = yaml.safe_load((DIR / "prometheus.yml").read_text())
    for f in cfg["rule_files"]:
        assert (DIR / f).is_file(), f
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["specray"]["metrics_path"] == "/metrics"
    # the rules select the job the config scrapes
    text = (DIR / "specray_alerts.yml").read_text()
    assert 'job="specray"' in text


# ---- promtool (Debian's `prometheus` package; `make test` installs it where it can) ------------------
def _promtool(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    if exe is None:
        reason = "promtool not installed (apt-get install prometheus); the alert rules were not run"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    return subprocess.run([exe, *args], cwd=DIR, capture_output=True, text=True, timeout=300)


def test_promtool_check_rules():
    out = _promtool("check", "rules", "specray_alerts.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_check_config():
    out = _promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_rule_unit_tests_cover_every_alert(rules):
    tests = yaml.safe_load((DIR / "specray_alerts_test.yml").read_text())
    assert tests["rule_files"] == ["specray_alerts.yml"]
    fired, silent = set(), set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fired == set(rules) and silent == set(rules), (set(rules) - fired, set(rules) - silent)
    out = _promtool("test", "rules", "specray_alerts_test.yml")
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
