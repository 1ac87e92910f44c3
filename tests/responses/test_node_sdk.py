"""The official OpenAI Node SDK (`openai` from npm) and its Responses API through legate:
create, stream and retrieve, with a function-call round trip chained by previous_response_id,
passed through and served by an Anthropic-kind step."""

import json
import subprocess

import pytest

from conftest import HERE, OFFLINE_ENV

import os

ROUTES = {
    "passthrough": ("gpt-node-test", "/v1/responses"),
    "to-anthropic": ("served-by-anthropic", "/v1/messages"),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_node_sdk_responses_round_trip(mock, legate, route):
    model, path = ROUTES[route]
    mock.script({"replies": [
        {"content": [{"type": "tool_use", "id": "toolu_n1", "name": "weather",
                      "input": {"city": "Oslo"}}]},
        {"content": [{"type": "text", "text": "It rains in Oslo."}]}]})
    out = subprocess.run(
        ["node", str(HERE / "node_sdk.mjs"), legate.url + "/v1", model],
        env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=60,
        cwd=HERE,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["call"] == {"name": "weather", "arguments": {"city": "Oslo"}}
    assert got["deltas"] == "It rains in Oslo."
    assert got["text"] == "It rains in Oslo."
    gens = [r for r in mock.requests() if r["path"] == path]
    assert len(gens) == 2
    if route == "to-anthropic":
        # The translated route keeps the conversation and answers retrieve itself.
        assert got["retrieved"] == "It rains in Oslo."
        assert gens[1]["json"]["messages"][1]["content"][0]["type"] == "tool_use"
