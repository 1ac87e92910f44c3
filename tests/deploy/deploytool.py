"""Code shared by `.ci/deploy-checks` and the tests in tests/deploy: reading the deployment
artefacts, extracting legate's config from the ConfigMap, and adapting prometheus.yml to a
Prometheus built without Kubernetes discovery.

Run as a script for the shell checks:
  deploytool.py extract-config OUT.toml        the ConfigMap's legate.toml
  deploytool.py key-file-overrides DIR         env overrides of api_key_file for `legate check`
  deploytool.py file-sd-config IN.yml OUT.yml  prometheus.yml with kubernetes_sd -> file_sd
"""

import argparse
import json
import pathlib
import re
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus"


# SPEC §8: the metric names legate exports, the only legate_* names dashboards and rules may use
# (and the one extension the shipped alerts need).
SPEC_METRICS = {
    "legate_requests_total": "counter",
    "legate_overhead_seconds": "histogram",
    "legate_request_duration_seconds": "histogram",
    "legate_upstream_attempts_total": "counter",
    "legate_upstream_duration_seconds": "histogram",
    "legate_time_to_first_token_seconds": "histogram",
    "legate_retries_total": "counter",
    "legate_fallbacks_total": "counter",
    "legate_breaker_state": "gauge",
    "legate_ratelimit_rejections_total": "counter",
    "legate_shed_total": "counter",
    "legate_tokens_total": "counter",
    "legate_cost_usd_total": "counter",
    "legate_inflight_requests": "gauge",
    "legate_queue_depth": "gauge",
    "legate_upstream_ratelimit_remaining_ratio": "gauge",
    "legate_config_reloads_total": "counter",
    "legate_build_info": "gauge",
    "legate_telemetry_dropped_total": "counter",
    # An extension the README lists under Metrics: the Redis rate-limit store out of reach,
    # which the README tells operators to alert on.
    "legate_ratelimit_store_degraded": "gauge",
}


def metric_names(expr):
    """legate_* series named in a PromQL expression, histogram suffixes folded into the
    histogram's name. Raises on a name SPEC §8 does not define."""
    names = set()
    for name in re.findall(r"\blegate_[a-z0-9_]+", expr):
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            stem = name.removesuffix(suffix)
            if stem != name and SPEC_METRICS.get(stem) == "histogram":
                base = stem
        if base not in SPEC_METRICS:
            raise ValueError(f"{name} is not a SPEC §8 metric (in {expr!r})")
        names.add(base)
    return names


def load_yaml(path):
    """The single document of a YAML file."""
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def configmap_toml_text():
    return load_yaml(K8S / "configmap.yaml")["data"]["legate.toml"]


def configmap_config():
    return tomllib.loads(configmap_toml_text())


def key_files(config):
    """provider name -> api_key_file, for providers that read their key from a file."""
    return {
        name: p["api_key_file"]
        for name, p in config.get("providers", {}).items()
        if "api_key_file" in p
    }


def key_file_overrides(config, directory):
    """Environment overrides that point every api_key_file at a dummy file in `directory`.

    `legate check` refuses a key file that does not exist, and the Secret's mount path exists
    only in the pod. The paths themselves are checked against the Deployment by the tests.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    env = {}
    for name in key_files(config):
        path = directory / name
        path.write_text("dummy-key-for-validation\n", encoding="utf-8")
        env[f"LEGATE__PROVIDERS__{name.upper()}__API_KEY_FILE"] = str(path)
    return env


def parse_duration_seconds(text):
    """legate's duration strings ("500ms", "30s", "5m", "1h") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * units[suffix]
    raise ValueError(f"not a duration: {text!r}")


def file_sd_config(config, targets_file):
    """A copy of a Prometheus config in which each kubernetes_sd_configs is replaced by a
    file_sd_configs reading `targets_file`; relabelling and everything else are kept.

    Debian's Prometheus is built without Kubernetes discovery, so its promtool rejects the
    real file; with this substitution promtool still checks the rest of the job and can run
    the relabelling on synthetic pod targets.
    """
    derived = json.loads(json.dumps(config))
    for job in derived.get("scrape_configs", []):
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["file_sd_configs"] = [{"files": [str(targets_file)]}]
    return derived


def _main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("extract-config")
    p.add_argument("out")
    p = sub.add_parser("key-file-overrides")
    p.add_argument("directory")
    p = sub.add_parser("file-sd-config")
    p.add_argument("src")
    p.add_argument("out")
    args = parser.parse_args(argv)

    if args.cmd == "extract-config":
        pathlib.Path(args.out).write_text(configmap_toml_text(), encoding="utf-8")
    elif args.cmd == "key-file-overrides":
        for k, v in key_file_overrides(configmap_config(), args.directory).items():
            print(f"{k}={v}")
    elif args.cmd == "file-sd-config":
        src = pathlib.Path(args.src).resolve()
        config = load_yaml(src)
        # Rule files are relative to the config file: keep them resolvable from the copy.
        config["rule_files"] = [str(src.parent / r) for r in config.get("rule_files", [])]
        out = pathlib.Path(args.out)
        derived = file_sd_config(config, out.with_suffix(".targets.json"))
        out.with_suffix(".targets.json").write_text("[]\n", encoding="utf-8")
        out.write_text(yaml.safe_dump(derived, sort_keys=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
