"""LangChain's chat models through legate: `ChatOpenAI` (langchain-openai) and `ChatAnthropic`
(langchain-anthropic), each with a bound tool, a tool call, the tool's result sent back and the
final answer; same-API and translated, invoked and streamed."""

import json

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from conftest import CLIENT_KEY, tool_then_text

SECRET = "The secret word is pineapple."
ANSWER = "The note says the secret word is pineapple."


@tool
def read_note(name: str) -> str:
    """Read a note by name."""
    return SECRET if name == "todo" else "no such note"


def chat_model(legate, kind, model):
    # max_retries=0: legate retries and falls back; the client's retries would multiply that.
    if kind == "openai":
        return ChatOpenAI(base_url=legate.url + "/v1", api_key=CLIENT_KEY, model=model,
                          max_retries=0, include_response_headers=True)
    return ChatAnthropic(base_url=legate.url, api_key=CLIENT_KEY, model=model, max_retries=0,
                         max_tokens=1024)


def ask(llm, messages, streamed):
    if not streamed:
        return llm.invoke(messages)
    chunks = iter(llm.stream(messages))
    message = next(chunks)
    for chunk in chunks:
        message = message + chunk
    return message


# (chat model, model asked for, upstream path, upstream model, x-legate-served-by)
ROUTES = {
    "openai-same-api": ("openai", "gpt-4o-mini", "/v1/chat/completions", "gpt-4o-mini",
                        "openai:gpt-4o-mini"),
    "openai-to-anthropic": ("openai", "served-by-anthropic", "/v1/messages", "claude-backend",
                            "anthropic:claude-backend"),
    "anthropic-same-api": ("anthropic", "claude-sonnet-5-5", "/v1/messages",
                           "claude-sonnet-5-5", None),
    "anthropic-to-openai": ("anthropic", "xgpt", "/v1/chat/completions", "gpt-4o-mini", None),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_tool_call_round_trip(mock, legate, route, streamed):
    kind, model, path, upstream_model, served_by = ROUTES[route]
    mock.script(tool_then_text("read_note", {"name": "todo"}, ANSWER))
    llm = chat_model(legate, kind, model).bind_tools([read_note])
    messages = [HumanMessage('What does the note "todo" say?')]

    first = ask(llm, messages, streamed)
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("read_note", {"name": "todo"})]
    call = first.tool_calls[0]
    messages += [first, ToolMessage(read_note.invoke(call["args"]), tool_call_id=call["id"])]
    final = ask(llm, messages, streamed)
    assert final.text == ANSWER
    assert final.tool_calls == []

    reqs = mock.requests()
    assert [(r["path"], r["json"]["model"]) for r in reqs] == [(path, upstream_model)] * 2
    assert all(bool(r["json"].get("stream")) == streamed for r in reqs)
    assert CLIENT_KEY not in json.dumps([r["headers"] for r in reqs])
    assert SECRET in json.dumps(reqs[1]["json"]["messages"][-1])
    if served_by and not streamed:
        assert final.response_metadata["headers"]["x-legate-served-by"] == served_by


def test_client_retries_are_counted(mock, legate):
    """A client that times out and retries on its own: the OpenAI SDK under ChatOpenAI marks the
    retry with `x-stainless-retry-count: 1`, and legate counts it for the operator. The SDK's
    read timeout is withheld from legate (the header it sends is replaced): legate would
    otherwise answer 504 before the timeout, and the SDK would not retry at all."""
    mock.script({"replies": [{"delay_ms": 3000}],
                 "default": {"content": [{"type": "text", "text": ANSWER}]}})
    llm = ChatOpenAI(base_url=legate.url + "/v1", api_key=CLIENT_KEY, model="gpt-4o-mini",
                     max_retries=1, timeout=1.0,
                     model_kwargs={"extra_headers": {"x-stainless-read-timeout": "NOT_GIVEN"}})
    assert llm.invoke("hi").text == ANSWER
    retry_counts = [dict(r["headers"]).get("x-stainless-retry-count") for r in mock.requests()]
    assert retry_counts == ["0", "1"]
    assert legate.metric("legate_client_retries_total", api="openai") == 1


class Word(BaseModel):
    """The secret word."""

    word: str


def test_structured_output_through_a_translated_route(mock, legate):
    """`with_structured_output` sends a JSON schema; served by an Anthropic step, the schema
    reaches the provider as Anthropic's own structured-output field, never dropped silently."""
    mock.script({"default": {"content": [{"type": "text", "text": '{"word": "pineapple"}'}]}})
    llm = ChatOpenAI(base_url=legate.url + "/v1", api_key=CLIENT_KEY,
                     model="served-by-anthropic", max_retries=0)
    answer = llm.with_structured_output(Word, method="json_schema").invoke("The word?")
    assert answer == Word(word="pineapple")
    (req,) = mock.requests()
    assert req["path"] == "/v1/messages"
    fmt = req["json"]["output_config"]["format"]
    assert fmt["type"] == "json_schema"
    assert fmt["schema"]["properties"] == {"word": {"title": "Word", "type": "string"}}
    assert fmt["schema"]["required"] == ["word"]
