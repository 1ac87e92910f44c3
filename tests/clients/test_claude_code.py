"""Claude Code (`claude -p`, the npm package) through legate: one Read-tool round trip same-API,
through a cross-provider alias, and through a fallback chain; and its token counting (`/context`,
which calls count_tokens)."""

import json
import os
import subprocess

from conftest import CLIENT_KEY, OFFLINE_ENV, PROVIDER_KEY, node_bin, tool_then_text

SECRET = "The secret word is pineapple."
ANSWER = "The note says the secret word is pineapple."
MODEL = "claude-sonnet-5-5"


def run_claude(legate, tmp_path, model, prompt, timeout=120):
    """Runs `claude -p` in a fresh HOME and working directory; returns the finished process."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "ANTHROPIC_BASE_URL": legate.url,
        "ANTHROPIC_API_KEY": CLIENT_KEY,
        # legate retries and falls back; the client must not multiply that.
        "CLAUDE_CODE_MAX_RETRIES": "0",
        # A stream broken after its content would be sent again, whole, without streaming.
        "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        **OFFLINE_ENV,
    }
    return subprocess.run(
        [node_bin("claude"), "-p", prompt, "--model", model, "--allowedTools", "Read"],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_round_trip(mock, legate, tmp_path, model):
    """Scripts a Read of notes.txt then a final answer, runs Claude Code, checks what both ends
    saw; returns the upstream requests."""
    notes = tmp_path / "work" / "notes.txt"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text(SECRET + "\n")
    mock.script(tool_then_text("Read", {"file_path": str(notes)}, ANSWER))
    done = run_claude(legate, tmp_path, model, "What does notes.txt say?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ANSWER
    reqs = mock.requests()
    for r in reqs:
        assert CLIENT_KEY not in json.dumps(r["headers"])
        assert PROVIDER_KEY in json.dumps(r["headers"])
    return reqs


def test_read_round_trip_same_api(mock, legate, tmp_path):
    reqs = read_round_trip(mock, legate, tmp_path, MODEL)
    assert [(r["path"], r["json"]["model"]) for r in reqs] == [
        ("/v1/messages?beta=true", MODEL),
        ("/v1/messages?beta=true", MODEL),
    ]
    assert all(r["json"]["stream"] is True for r in reqs)
    # The file's content went back to the model as the Read tool's result.
    last = reqs[1]["json"]["messages"][-1]["content"][0]
    assert last["type"] == "tool_result"
    assert SECRET in json.dumps(last["content"])
    assert legate.metric("legate_requests_total", api="anthropic", status="200") == 2
    assert legate.metric("legate_requests_total", api="anthropic", status="400") == 0
    # Metered from the streams' usage: the mock reports 10 input and 5 output tokens a call.
    assert legate.metric("legate_tokens_total", provider="anthropic", kind="input") == 20
    assert legate.metric("legate_tokens_total", provider="anthropic", kind="output") == 10


def test_read_round_trip_cross_provider(mock, legate, tmp_path):
    reqs = read_round_trip(mock, legate, tmp_path, "xgpt")
    assert len(reqs) == 2
    assert all(r["path"].startswith("/v1/chat/completions") for r in reqs)
    assert all(r["json"]["model"] == "gpt-4o-mini" and r["json"]["stream"] for r in reqs)
    # The Read result reached the OpenAI-kind provider as a `tool` message.
    tool_msg = reqs[1]["json"]["messages"][-1]
    assert tool_msg["role"] == "tool"
    assert SECRET in tool_msg["content"]
    assert legate.metric("legate_translated_requests_total", **{"from": "anthropic"}) == 2
    assert legate.metric("legate_tokens_total", provider="openai", kind="input") == 20
    assert legate.metric("legate_tokens_total", provider="openai", kind="output") == 10


def test_cross_provider_is_clean(mock, legate, tmp_path):
    """Claude Code sends `{"role":"system"}` entries in messages[] for model names it does not
    recognise; none of its requests may be refused, and `?beta=true` is Anthropic's alone."""
    reqs = read_round_trip(mock, legate, tmp_path, "xgpt")
    assert [r["path"] for r in reqs] == ["/v1/chat/completions"] * 2
    assert legate.metric("legate_requests_total", model="xgpt", status="400") == 0
    assert legate.metric("legate_requests_total", model="xgpt", status="200") == 2
    # The system entry is kept, in position, as a system message.
    roles = [m["role"] for m in reqs[0]["json"]["messages"]]
    assert roles.count("system") >= 2
    # Claude Code asks for 32000 output tokens; gpt-4o-mini allows 16384.
    for r in reqs:
        body = r["json"]
        assert body.get("max_completion_tokens", body.get("max_tokens")) <= 16384


def test_read_round_trip_through_fallback(mock, legate, tmp_path):
    notes = tmp_path / "work" / "notes.txt"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text(SECRET + "\n")
    script = tool_then_text("Read", {"file_path": str(notes)}, ANSWER)
    # The primary is overloaded for the whole test; the queued tool call is for the backup.
    script["replies"][0]["match"] = {"model": "claude-backup"}
    script["replies"].insert(0, {"match": {"model": "claude-primary"}, "times": 0, "status": 529})
    mock.script(script)
    done = run_claude(legate, tmp_path, "large", "What does notes.txt say?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ANSWER
    # Per client request: two attempts on the primary (max_attempts = 2), then the backup.
    assert mock.calls() == [
        ("/v1/messages?beta=true", "claude-primary"),
        ("/v1/messages?beta=true", "claude-primary"),
        ("/v1/messages?beta=true", "claude-backup"),
    ] * 2
    assert legate.metric("legate_requests_total", model="large", status="200") == 2
    assert legate.metric("legate_fallbacks_total") == 2


def test_overloaded_chain_is_not_retried_by_claude_code(mock, legate, tmp_path):
    """With CLAUDE_CODE_MAX_RETRIES=0, a chain that fails ends after legate's own attempts."""
    mock.script({"default": {"status": 529}})
    done = run_claude(legate, tmp_path, MODEL, "hi")
    assert done.returncode != 0
    assert mock.calls() == [("/v1/messages?beta=true", MODEL)] * 2
    assert legate.metric("legate_requests_total", api="anthropic", status="529") == 1


def test_a_stream_broken_after_content_is_sent_once(mock, legate, tmp_path):
    """A stream cut after its first content ends in an error event (past the commit point
    nothing can be retried); with the README's settings Claude Code does not send the turn
    again, whole, as its non-streaming fallback would."""
    mock.script({"default": {"cut_after": 4, "content": [
        {"type": "text", "text": "one two three four five six seven eight"}]}})
    done = run_claude(legate, tmp_path, MODEL, "hi")
    assert done.returncode != 0
    assert mock.calls() == [("/v1/messages?beta=true", MODEL)]
    assert legate.metric("legate_requests_total", api="anthropic", status="502") == 1


def context_report(mock, legate, tmp_path, model):
    """`/context` in print mode: Claude Code counts its prompt with count_tokens."""
    done = run_claude(legate, tmp_path, model, "/context")
    assert done.returncode == 0, done.stderr
    assert "Context Usage" in done.stdout
    assert f"**Model:** {model}" in done.stdout
    return done


def test_count_tokens_same_api(mock, legate, tmp_path):
    context_report(mock, legate, tmp_path, MODEL)
    calls = mock.calls()
    assert calls, "Claude Code made no count_tokens call"
    # Only token counting, no generation, and each counted once upstream.
    assert set(calls) == {("/v1/messages/count_tokens?beta=true", MODEL)}
    assert legate.metric("legate_requests_total", api="anthropic", status="200") == len(calls)


def test_count_tokens_cross_provider(mock, legate, tmp_path):
    context_report(mock, legate, tmp_path, "xgpt")
    # Estimated by legate: nothing reaches the OpenAI-kind provider, and nothing is refused.
    assert mock.calls() == []
    assert legate.metric("legate_requests_total", model="xgpt", status="400") == 0
    assert legate.metric("legate_requests_total", model="xgpt", status="200") > 0
