"""The Vercel AI SDK (`ai` with `@ai-sdk/openai` chat model and `@ai-sdk/anthropic`) through
legate: generateText and streamText with one tool call, same-API, translated and through
fallback."""

import json
import os
import subprocess

import pytest

from conftest import CLIENT_KEY, HERE, OFFLINE_ENV, tool_then_text

SECRET = "The secret word is pineapple."
ANSWER = "The note says: the secret word is pineapple."


def run_ai_sdk(legate, **args):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **OFFLINE_ENV}
    done = subprocess.run(
        ["node", str(HERE / "ai_sdk.mjs"), json.dumps({"baseURL": legate.url, **args})],
        cwd=HERE,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_agent_run(out, mode):
    assert out["text"] == ANSWER
    if mode == "stream":
        assert out["streamed"] == ANSWER
    assert out["toolCalls"] == [{"name": "read_note", "input": {"name": "todo"}}]
    assert out["toolResults"] == [SECRET]
    assert out["finishReasons"] == ["tool-calls", "stop"]


# (provider in the SDK, model asked for, upstream path, upstream model, x-legate-served-by)
ROUTES = {
    "openai-same-api": ("openai", "gpt-4o-mini", "/v1/chat/completions", "gpt-4o-mini",
                        "openai:gpt-4o-mini"),
    "openai-to-anthropic": ("openai", "served-by-anthropic", "/v1/messages", "claude-backend",
                            "anthropic:claude-backend"),
    "anthropic-same-api": ("anthropic", "claude-sonnet-5-5", "/v1/messages", "claude-sonnet-5-5",
                           "anthropic:claude-sonnet-5-5"),
    "anthropic-to-openai": ("anthropic", "xgpt", "/v1/chat/completions", "gpt-4o-mini",
                            "openai:gpt-4o-mini"),
}


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_tool_round_trip(mock, legate, route, mode):
    provider, model, path, upstream_model, served_by = ROUTES[route]
    mock.script(tool_then_text("read_note", {"name": "todo"}, ANSWER))
    out = run_ai_sdk(legate, provider=provider, model=model, mode=mode)
    check_agent_run(out, mode)
    reqs = mock.requests()
    assert [(r["path"], r["json"]["model"]) for r in reqs] == [(path, upstream_model)] * 2
    assert all(bool(r["json"].get("stream")) == (mode == "stream") for r in reqs)
    assert CLIENT_KEY not in json.dumps([r["headers"] for r in reqs])
    # The tool's output went back to the provider in its own API's shape.
    assert SECRET in json.dumps(reqs[1]["json"]["messages"][-1])
    # The SDK exposes each step's response headers.
    assert out["servedBy"] == [served_by] * 2


def test_fallback_with_sdk_retries_off(mock, legate):
    """The primary answers 529: legate tries it twice, then the backup serves; the SDK, with
    maxRetries 0, sends each step once."""
    script = tool_then_text("read_note", {"name": "todo"}, ANSWER)
    script["replies"][0]["match"] = {"model": "gpt-backup"}
    script["replies"].insert(0, {"match": {"model": "gpt-primary"}, "times": 0, "status": 529})
    mock.script(script)
    out = run_ai_sdk(legate, provider="openai", model="gpt-large", mode="stream")
    check_agent_run(out, "stream")
    assert [m for _, m in mock.calls()] == ["gpt-primary", "gpt-primary", "gpt-backup"] * 2
    assert legate.metric("legate_fallbacks_total") == 2
    assert legate.metric("legate_requests_total", model="gpt-large", status="200") == 2


def test_failed_chain_is_not_multiplied_by_sdk_retries(mock, legate):
    """Left at its default (maxRetries 2) the SDK would send the request three times; legate's
    `x-should-retry: false` does not stop it (six upstream calls here), so it needs maxRetries 0."""
    mock.script({"default": {"status": 529}})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **OFFLINE_ENV}
    args = {"baseURL": legate.url, "provider": "openai", "model": "gpt-4o-mini",
            "mode": "generate", "maxRetries": 0}
    done = subprocess.run(["node", str(HERE / "ai_sdk.mjs"), json.dumps(args)], cwd=HERE,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "529" in done.stderr or "Overloaded" in done.stderr
    assert [m for _, m in mock.calls()] == ["gpt-4o-mini"] * 2
    assert legate.metric("legate_requests_total", api="openai", status="529") == 1
