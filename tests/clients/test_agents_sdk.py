"""The OpenAI Agents SDK (`openai-agents`) with its Chat Completions model through legate: an
agent with one function tool, same-API and served by an Anthropic-kind step, non-streamed and
streamed."""

import asyncio
import json

import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from conftest import CLIENT_KEY, tool_then_text

SECRET = "The secret word is pineapple."
ANSWER = "The note says the secret word is pineapple."

# Traces would go to the provider's own endpoint, not through legate.
set_tracing_disabled(True)

tool_inputs = []


@function_tool
def read_note(name: str) -> str:
    """Read a note by name."""
    tool_inputs.append(name)
    return SECRET if name == "todo" else "no such note"


def agent_for(legate, model):
    client = AsyncOpenAI(base_url=legate.url + "/v1", api_key=CLIENT_KEY, max_retries=0)
    return Agent(
        name="reader",
        instructions="Answer with the content of the note the user asks about.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        tools=[read_note],
    )


async def run_streamed(agent, prompt):
    result = Runner.run_streamed(agent, prompt)
    async for _ in result.stream_events():
        pass
    return result


# (model asked for, upstream path, upstream model)
ROUTES = {
    "same-api": ("gpt-4o-mini", "/v1/chat/completions", "gpt-4o-mini"),
    "to-anthropic": ("served-by-anthropic", "/v1/messages", "claude-backend"),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_agent_with_function_tool(mock, legate, route, streamed):
    model, path, upstream_model = ROUTES[route]
    mock.script(tool_then_text("read_note", {"name": "todo"}, ANSWER))
    tool_inputs.clear()
    agent = agent_for(legate, model)
    prompt = 'What does the note "todo" say?'
    if streamed:
        result = asyncio.run(run_streamed(agent, prompt))
    else:
        result = Runner.run_sync(agent, prompt)
    assert result.final_output == ANSWER
    assert tool_inputs == ["todo"]
    reqs = mock.requests()
    assert [(r["path"], r["json"]["model"]) for r in reqs] == [(path, upstream_model)] * 2
    assert all(bool(r["json"].get("stream")) == streamed for r in reqs)
    assert CLIENT_KEY not in json.dumps([r["headers"] for r in reqs])
    # The instructions and the tool's output reached the provider.
    assert "Answer with the content" in json.dumps(reqs[0]["json"])
    assert SECRET in json.dumps(reqs[1]["json"]["messages"][-1])
    assert legate.metric("legate_requests_total", api="openai", status="200") == 2
