"""Codex CLI (`@openai/codex`), which speaks only the Responses API, runs `codex exec`
non-interactively against legate + legate mock: one shell tool call, then a final answer.
Served once by passthrough and once by an Anthropic-kind step. Codex is told the provider
supports WebSockets, so it tries `GET /v1/responses` first: legate's 426 must send it to HTTP
at once (counted as status 426, and the run stays fast)."""

import os
import subprocess
import time

import pytest

from conftest import CLIENT_KEY, OFFLINE_ENV, node_bin, tool_then_text

MARKER = "legate-codex-tool-ran"
ANSWER = "The command printed the marker."

CONFIG = """
model = "{model}"
model_provider = "legate"

[model_providers.legate]
name = "legate"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "LEGATE_DUMMY_KEY"
request_max_retries = 0
stream_max_retries = 0
supports_websockets = true
"""

# (model asked for, upstream path, upstream model)
ROUTES = {
    "passthrough": ("gpt-codex-test", "/v1/responses", "gpt-codex-test"),
    "to-anthropic": ("served-by-anthropic", "/v1/messages", "claude-backend"),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_codex_exec_runs_a_shell_tool_and_answers(mock, legate, tmp_path, route):
    model, path, upstream_model = ROUTES[route]
    home, codex_home, work = tmp_path / "home", tmp_path / "codex", tmp_path / "work"
    for d in (home, codex_home, work):
        d.mkdir()
    (codex_home / "config.toml").write_text(CONFIG.format(model=model, url=legate.url))
    mock.script(tool_then_text("exec_command", {"cmd": f"echo {MARKER}"}, ANSWER))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "CODEX"))},
        **OFFLINE_ENV,
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "LEGATE_DUMMY_KEY": CLIENT_KEY,
    }
    started = time.monotonic()
    out = subprocess.run(
        [node_bin("codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
         "Run the marker command, then tell me what it printed."],
        cwd=work, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stderr[-3000:]
    assert ANSWER in out.stdout
    reqs = [r for r in mock.requests() if r["path"] == path]
    assert [r["json"]["model"] for r in reqs] == [upstream_model] * 2
    # The tool really ran, and its output went back to the model in the second call.
    assert MARKER in str(reqs[1]["json"])
    assert CLIENT_KEY not in str([r["headers"] for r in mock.requests()])
    # The WebSocket attempt got 426 and cost nothing: no seconds of retries.
    assert legate.metric("legate_requests_total", api="responses", status="426") >= 1
    assert legate.metric("legate_requests_total", api="responses", status="200") == 2
    assert elapsed < 30, f"codex took {elapsed:.1f}s"
