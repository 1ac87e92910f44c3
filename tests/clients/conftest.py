"""Fixtures for the client suite: each test gets its own `legate mock` (the provider) and
`legate serve` in front of it, both real binaries on 127.0.0.1 with ports chosen by the OS.

The clients under test run unchanged: only their base URL (and a dummy key) points at legate.
Every non-loopback connection a client might attempt (telemetry, update checks, token
downloads) is sent to a dead proxy on loopback, so nothing leaves the machine."""

import json
import os
import pathlib
import socket
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BIN = os.environ.get("LEGATE_BIN", str(ROOT / "target" / "debug" / "legate"))
NODE_MODULES = HERE / "node_modules"
PROVIDER_KEY = "sk-CANARY-clients-provider-key"
CLIENT_KEY = "dummy-client-key"


def _dead_port():
    """A loopback port with nothing listening: bound, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEAD_PROXY = f"http://127.0.0.1:{_dead_port()}"
OFFLINE_ENV = {
    "HTTPS_PROXY": DEAD_PROXY,
    "HTTP_PROXY": DEAD_PROXY,
    "https_proxy": DEAD_PROXY,
    "http_proxy": DEAD_PROXY,
    "ALL_PROXY": DEAD_PROXY,
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
# The Python clients run inside this process: they get the same dead proxy.
os.environ.update(OFFLINE_ENV)
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

# The legate configuration every test runs with. `{mock}` is the mock's URL.
CONFIG = """
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

# Fast, deterministic retries: two attempts per step, and a breaker that never opens within
# one test, so the exact upstream call count is known.
[retry]
max_attempts = 2
base_delay = "10ms"
max_delay = "20ms"

[breaker]
min_calls = 1000

[providers.anthropic]
kind = "anthropic"
base_url = "{mock}"
api_key_env = "LEGATE_TEST_PROVIDER_KEY"
first_byte_timeout = "20s"

[providers.openai]
kind = "openai"
base_url = "{mock}"
api_key_env = "LEGATE_TEST_PROVIDER_KEY"
first_byte_timeout = "20s"

# Anthropic callers (Claude Code) served by an OpenAI-kind provider: translation.
[[models]]
name = "xgpt"
chain = ["openai:gpt-4o-mini"]

# OpenAI callers served by an Anthropic-kind provider: translation.
[[models]]
name = "served-by-anthropic"
chain = ["anthropic:claude-backend"]

# A fallback chain: the tests make the primary answer 529.
[[models]]
name = "large"
chain = ["anthropic:claude-primary", "anthropic:claude-backup"]

[[models]]
name = "gpt-large"
chain = ["openai:gpt-primary", "openai:gpt-backup"]
"""


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
        raise RuntimeError(f"legate {args[0]} printed no listening line")
    return proc, line


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def _get(url, method="GET", body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    return raw


class Mock:
    """The mock's control plane: script it, read what reached the provider."""

    def __init__(self, url):
        self.url = url

    def script(self, script):
        _get(self.url + "/_mock/script", "PUT", script)

    def requests(self):
        reqs = json.loads(_get(self.url + "/_mock/requests"))
        for r in reqs:
            r["json"] = json.loads(r["body"]) if r["body"] else None
        return reqs

    def calls(self):
        """(path, model) of every request that reached the provider, in order."""
        return [(r["path"], (r["json"] or {}).get("model")) for r in self.requests()]


class Legate:
    def __init__(self, url, admin):
        self.url = url
        self.admin = admin

    def metric(self, name, **labels):
        """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
        text = _get(self.admin + "/metrics").decode()
        total = 0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total


@pytest.fixture
def mock():
    proc, line = _spawn(["mock", "--listen", "127.0.0.1:0"])
    url = next(w for w in line.split() if w.startswith("http://"))
    yield Mock(url)
    _stop(proc)


@pytest.fixture
def legate(mock, tmp_path):
    cfg = tmp_path / "legate.toml"
    cfg.write_text(CONFIG.replace("{mock}", mock.url))
    proc, line = _spawn(
        ["serve", "--config", str(cfg)], env={"LEGATE_TEST_PROVIDER_KEY": PROVIDER_KEY}
    )
    urls = [w.strip("()") for w in line.split() if w.strip("()").startswith("http://")]
    yield Legate(urls[0], urls[1])
    _stop(proc)


def tool_then_text(tool_name, tool_input, final_text):
    """A script: the first generation calls `tool_name`, every later one answers `final_text`."""
    return {
        "replies": [
            {
                "content": [{"type": "tool_use", "name": tool_name, "input": tool_input}],
                "stop_reason": "tool_use",
            }
        ],
        "default": {"content": [{"type": "text", "text": final_text}]},
    }


def node_bin(name):
    """A client's executable from tests/clients/node_modules; missing means a failed install,
    which fails the test (the suite never skips a client)."""
    path = NODE_MODULES / ".bin" / name
    assert path.exists(), f"{path} is missing: run `npm ci` in tests/clients"
    return str(path)
