"""deploy/otel-collector/collector.yaml: a collector config whose pipelines only name
components it defines, receiving OTLP over HTTP on the port legate's README documents, with a
pipeline for traces and one for metrics (the two signals legate exports)."""

import yaml

import deploytool

CONFIG = deploytool.DEPLOY / "otel-collector" / "collector.yaml"


def config():
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def test_legate_can_reach_the_otlp_http_receiver():
    http = config()["receivers"]["otlp"]["protocols"]["http"]
    assert http["endpoint"].endswith(":4318")
    assert "grpc" not in config()["receivers"]["otlp"]["protocols"], "legate exports over HTTP"


def test_pipelines_name_only_defined_components():
    c = config()
    pipelines = c["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics"}
    for name, p in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for component in p.get(kind, []):
                assert component in c[kind], f"{name}: {kind} {component} is not defined"
        assert p["receivers"] == ["otlp"], name
        # The memory limiter comes first, so the collector bounds its memory before batching.
        assert p["processors"][0] == "memory_limiter", name


def test_the_readme_shows_this_config():
    readme = (deploytool.ROOT / "README.md").read_text(encoding="utf-8")
    assert "deploy/otel-collector/collector.yaml" in readme
    assert "otlp_endpoint" in readme
