"""deploy/grafana/legate-dashboard.json: importable (a datasource variable, unique ids, a layout
that fits), queries over SPEC §8 metrics only that promtool can parse, and a panel for each
thing an operator of legate watches."""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

import deploytool

DASHBOARD = deploytool.DEPLOY / "grafana" / "legate-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def dashboard():
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels():
    """The metric panels (Prometheus); the trace panel has its own test."""
    return [
        p
        for p in dashboard()["panels"]
        if p["type"] != "row" and p["datasource"].get("type") == "prometheus"
    ]


def test_a_panel_finds_the_trace_of_a_request_id():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["traces"]["type"] == "datasource"
    assert variables["traces"]["query"] == "tempo"
    assert variables["request_id"]["type"] == "textbox"
    (panel,) = [p for p in dashboard()["panels"] if p["type"] == "traces"]
    assert panel["datasource"] == {"type": "tempo", "uid": "${traces}"}
    assert panel["description"]
    (target,) = panel["targets"]
    assert target["datasource"] == panel["datasource"]
    assert target["queryType"] == "traceql"
    # The span attribute legate exports on every span of a request.
    assert target["query"] == '{ span.legate.request_id = "$request_id" }'


def exprs():
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def test_datasource_is_a_variable():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in panels():
        assert p["datasource"] == DATASOURCE, p["title"]
        assert all(t["datasource"] == DATASOURCE for t in p["targets"]), p["title"]
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE, v["name"]


def test_ids_are_unique_and_panels_fit_the_grid_without_overlap():
    all_panels = dashboard()["panels"]
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in all_panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        area = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not area & cells, f"{p['title']} overlaps another panel"
        cells |= area


def test_every_panel_is_described():
    dash = dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    for p in panels():
        assert p["title"] and p["description"], p["title"]
        assert p["targets"], p["title"]


def test_queries_cover_what_an_operator_watches():
    used = set()
    for _, expr in exprs():
        used |= deploytool.metric_names(expr)
    for metric in (
        "legate_requests_total",
        "legate_request_duration_seconds",
        "legate_overhead_seconds",
        "legate_time_to_first_token_seconds",
        "legate_upstream_attempts_total",
        "legate_retries_total",
        "legate_fallbacks_total",
        "legate_breaker_state",
        "legate_tokens_total",
        "legate_cost_usd_total",
        "legate_inflight_requests",
        "legate_queue_depth",
        "legate_ratelimit_rejections_total",
        "legate_shed_total",
    ):
        assert metric in used, metric
    # Quantiles are asked for at p50 and p99.
    joined = "\n".join(e for _, e in exprs())
    assert "histogram_quantile(0.5," in joined and "histogram_quantile(0.99," in joined
    titles = {p["title"] for p in panels()}
    assert "Requests by status" in titles


def test_queries_parse(tmp_path):
    """Each query, with Grafana's variables replaced by values, as a recording rule that
    promtool parses."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed, and CI is set: .ci/deploy-checks installs it")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    substitutions = {"$__rate_interval": "1m", "$__range": "6h", "$job": ".*", "$tenant": ".*"}
    rules = []
    for n, (title, expr) in enumerate(exprs()):
        for var, value in substitutions.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{title}: unknown variable in {expr}"
        rules.append({"record": f"dashboard:query:{n}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_variables_only_reference_defined_variables():
    defined = {v["name"] for v in dashboard()["templating"]["list"]}
    builtin = {"__rate_interval", "__range", "__interval", "__all"}
    text = DASHBOARD.read_text(encoding="utf-8")
    for name in set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text)):
        assert name in defined | builtin, name
