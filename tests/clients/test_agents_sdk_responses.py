"""The OpenAI Agents SDK with its default model (`OpenAIResponsesModel`, the Responses API)
through legate: an agent with one function tool, passed through to an OpenAI-kind provider and
served by an Anthropic-kind step (translated, the second turn rebuilt from legate's store when
the SDK chains turns by previous_response_id)."""

import asyncio
import json

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from conftest import CLIENT_KEY, tool_then_text

SECRET = "The secret word is mango."
ANSWER = "The note says the secret word is mango."

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
        model=OpenAIResponsesModel(model=model, openai_client=client),
        tools=[read_note],
    )


async def run_streamed(agent, prompt):
    result = Runner.run_streamed(agent, prompt)
    async for _ in result.stream_events():
        pass
    return result


# (model asked for, upstream path, upstream model)
ROUTES = {
    "passthrough": ("gpt-4o-mini", "/v1/responses", "gpt-4o-mini"),
    "to-anthropic": ("served-by-anthropic", "/v1/messages", "claude-backend"),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_responses_agent_with_function_tool(mock, legate, route, streamed):
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
    assert CLIENT_KEY not in json.dumps([r["headers"] for r in reqs])
    # The tool's output reached the provider in the second call.
    assert SECRET in json.dumps(reqs[1]["json"])
