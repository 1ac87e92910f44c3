"""Fixtures that run the real `legate` binary: `legate mock` as the provider and `legate serve`
in front of it, both on 127.0.0.1 with ports chosen by the OS."""

import json
import os
import pathlib
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("LEGATE_BIN", str(ROOT / "target" / "debug" / "legate"))
PROVIDER_KEY = "sk-ant-CANARY-sdk-provider-key"


def _spawn(args, env=None):
    proc = subprocess.Popen(
        [BIN, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"{args[0]} printed no listening line")
    return proc, line


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


class Mock:
    def __init__(self, url):
        self.url = url

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def script(self, script):
        self._call("PUT", "/_mock/script", script)

    def requests(self):
        return self._call("GET", "/_mock/requests")


class Legate:
    def __init__(self, url, admin):
        self.url = url
        self.admin = admin

    def metric(self, name, **labels):
        """Sum of the samples of `name` whose labels include `labels` (None if none)."""
        with urllib.request.urlopen(self.admin + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        total = None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total = (total or 0) + sample.value
        return total


@pytest.fixture
def mock():
    proc, line = _spawn(["mock", "--listen", "127.0.0.1:0"])
    url = next(w for w in line.split() if w.startswith("http://"))
    yield Mock(url)
    _stop(proc)


def start_legate(provider_url, tmp_path, extra=""):
    """`legate serve` in front of `provider_url` (both APIs, the provider key from the
    environment), with `extra` TOML after the providers; returns its process and its URLs."""
    cfg = tmp_path / "legate.toml"
    cfg.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
kind = "anthropic"
base_url = "{provider_url}"
api_key_env = "ANTHROPIC_API_KEY"

[providers.openai]
kind = "openai"
base_url = "{provider_url}"
api_key_env = "OPENAI_API_KEY"
{extra}"""
    )
    proc, line = _spawn(
        ["serve", "--config", str(cfg)],
        env={"ANTHROPIC_API_KEY": PROVIDER_KEY, "OPENAI_API_KEY": PROVIDER_KEY},
    )
    words = [w.strip("()") for w in line.split()]
    urls = [w for w in words if w.startswith("http://")]
    return proc, Legate(urls[0], urls[1])


@pytest.fixture
def legate(mock, tmp_path):
    proc, served = start_legate(
        mock.url,
        tmp_path,
        """
[[models]]
name = "served-by-openai"
chain = ["openai:gpt-backend"]

[[models]]
name = "served-by-anthropic"
chain = ["anthropic:claude-backend"]

[[models]]
name = "with-fallback"
chain = ["openai:gpt-down", "anthropic:claude-spare"]
""",
    )
    yield served
    _stop(proc)
