"""deploy/prometheus beyond what promtool's own checks say: the Kubernetes pod job's relabelling
keeps exactly the legate admin port of each annotated pod, and the rules only use SPEC §8
metrics and recording rules that exist. (`promtool check config/rules` and `promtool test
rules` run in .ci/deploy-checks.)"""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

import deploytool
from deploytool import PROMETHEUS


@pytest.fixture
def promtool():
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed, and CI is set: .ci/deploy-checks installs it")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def rules(path):
    return [r for g in deploytool.load_yaml(path)["groups"] for r in g["rules"]]


def pod_target(ip, container, port=None, port_name=None, annotated=True, phase="Running"):
    """A target as Kubernetes pod discovery would announce it."""
    labels = {
        "__meta_kubernetes_namespace": "agents",
        "__meta_kubernetes_pod_name": f"agent-{ip.rsplit('.', 1)[1]}",
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_container_init": "true" if container == "legate" else "false",
        "__meta_kubernetes_pod_phase": phase,
    }
    if port is not None:
        labels["__meta_kubernetes_pod_container_port_number"] = str(port)
        labels["__meta_kubernetes_pod_container_port_name"] = port_name
    if annotated:
        labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] = "true"
        labels["__meta_kubernetes_pod_annotation_prometheus_io_port"] = "9787"
        labels["__meta_kubernetes_pod_annotation_prometheus_io_path"] = "/metrics"
    # Discovery's address is the pod IP with the port, or the bare IP for a portless container.
    return {"targets": [f"{ip}:{port}" if port else ip], "labels": labels}


def test_pod_job_scrapes_only_the_legate_admin_port(promtool, tmp_path):
    targets = tmp_path / "pods.json"
    targets.write_text(
        json.dumps(
            [
                # The example pod: legate's admin port, and an agent that serves on 8080.
                pod_target("10.0.0.1", "legate", 9787, "legate-admin"),
                pod_target("10.0.0.1", "agent", 8080, "http"),
                pod_target("10.0.0.1", "agent"),
                # Not annotated, or finished: not scraped.
                pod_target("10.0.0.2", "legate", 9787, "legate-admin", annotated=False),
                pod_target("10.0.0.3", "legate", 9787, "legate-admin", phase="Succeeded"),
                # Annotated, but not legate: another job's business.
                pod_target("10.0.0.4", "web", 9787, "metrics"),
            ]
        ),
        encoding="utf-8",
    )
    config = deploytool.load_yaml(PROMETHEUS / "prometheus.yml")
    config["rule_files"] = []
    derived = tmp_path / "prometheus.yml"
    derived.write_text(yaml.safe_dump(deploytool.file_sd_config(config, targets)), encoding="utf-8")

    # promtool collects discovery updates for the whole timeout; file discovery answers at once.
    result = subprocess.run(
        [promtool, "check", "service-discovery", str(derived), "legate-pods", "--timeout=3s"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    kept = [t["labels"] for t in json.loads(result.stdout) if t["labels"]]
    assert len(kept) == 1, kept
    (target,) = kept
    assert target["__address__"] == "10.0.0.1:9787"
    assert target["__metrics_path__"] == "/metrics"
    assert (target["job"], target["namespace"], target["pod"], target["container"]) == (
        "legate-pods",
        "agents",
        "agent-1",
        "legate",
    )


def test_static_job_scrapes_the_default_admin_address():
    config = deploytool.load_yaml(PROMETHEUS / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "legate"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9787"]}]
    assert sorted(config["rule_files"]) == ["alert-rules.yml", "recording-rules.yml"]


def test_rules_use_spec_metrics_and_defined_recordings():
    recorded = {r["record"] for r in rules(PROMETHEUS / "recording-rules.yml")}
    used = set()
    for path in ("recording-rules.yml", "alert-rules.yml"):
        for rule in rules(PROMETHEUS / path):
            used |= deploytool.metric_names(rule["expr"])
            for name in set(re.findall(r"\blegate:[a-z0-9_:]+", rule["expr"])):
                assert name in recorded, f"{name} is used but not recorded"
    # The conditions the alerts must watch.
    for metric in (
        "legate_breaker_state",
        "legate_retries_total",
        "legate_upstream_attempts_total",
        "legate_fallbacks_total",
        "legate_requests_total",
        "legate_ratelimit_rejections_total",
        "legate_cost_usd_total",
        "legate_config_reloads_total",
    ):
        assert metric in used, metric


def test_every_alert_says_what_and_how_bad():
    alerts = rules(PROMETHEUS / "alert-rules.yml")
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names))
    for alert in alerts:
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}, alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    expected = {"LegateDown", "LegateNotReady", "LegateBreakerOpen", "LegateDailySpendHigh"}
    assert expected <= set(names)
