"""The official openai Python SDK's Responses API through legate: passthrough, fallback, and
an Anthropic step with a two-turn function call round trip and previous_response_id."""

import json

import openai
import pytest

from conftest import PROVIDER_KEY

TOOLS = [{"type": "function", "name": "weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]


def client(legate):
    return openai.OpenAI(base_url=legate.url + "/v1", api_key="dummy-client-key", max_retries=0)


def test_create_and_retrieve_passthrough(mock, legate):
    mock.script({"default": {"content": [{"type": "text", "text": "hi there"}],
                             "usage": {"input_tokens": 9, "output_tokens": 2}}})
    out = client(legate).responses.create(model="served-by-openai", input="hi")
    assert out.output_text == "hi there"
    assert out.usage.input_tokens == 9
    reqs = mock.requests()
    assert reqs[0]["path"] == "/v1/responses"
    assert json.loads(reqs[0]["body"])["model"] == "gpt-backend"
    assert dict(reqs[0]["headers"]).get("authorization") == f"Bearer {PROVIDER_KEY}"
    got = client(legate).responses.retrieve(out.id)
    assert got.id == out.id
    assert legate.metric("legate_requests_total", api="responses", status="200") >= 1


def test_stream_helper_passthrough(mock, legate):
    mock.script({"default": {"content": [{"type": "text", "text": "streamed words here"}]}})
    with client(legate).responses.stream(model="served-by-openai", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "streamed words here"
    assert final.output_text == "streamed words here"


def test_fallback_to_an_anthropic_step(mock, legate):
    mock.script({"replies": [{"match": {"model": "gpt-down"}, "status": 503, "times": 0}],
                 "default": {"content": [{"type": "text", "text": "from the spare"}]}})
    raw = client(legate).responses.with_raw_response.create(model="with-fallback", input="hi")
    assert raw.headers["x-legate-served-by"] == "anthropic:claude-spare"
    assert raw.parse().output_text == "from the spare"


@pytest.mark.parametrize("streaming", [False, True])
def test_function_call_round_trip_on_an_anthropic_step(mock, legate, streaming):
    mock.script({"replies": [
        {"content": [{"type": "tool_use", "id": "toolu_1", "name": "weather",
                      "input": {"city": "Oslo"}}]},
        {"content": [{"type": "text", "text": "It rains in Oslo."}]}]})
    c = client(legate)
    if streaming:
        with c.responses.stream(model="served-by-anthropic", input="Weather in Oslo?",
                                tools=TOOLS) as stream:
            first = stream.get_final_response()
    else:
        first = c.responses.create(model="served-by-anthropic", input="Weather in Oslo?",
                                   tools=TOOLS)
    call = next(i for i in first.output if i.type == "function_call")
    assert call.name == "weather"
    assert json.loads(call.arguments) == {"city": "Oslo"}
    second = c.responses.create(
        model="served-by-anthropic", previous_response_id=first.id, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}])
    assert second.output_text == "It rains in Oslo."
    sent = json.loads(mock.requests()[1]["body"])
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][2]["content"][0]["type"] == "tool_result"
    assert c.responses.retrieve(second.id).output_text == "It rains in Oslo."


def test_stream_cut_after_content_raises_or_fails(mock, legate):
    mock.script({"default": {"cut_after": 6, "content": [{"type": "text", "text": "a b c d e f"}]}})
    with pytest.raises(Exception):
        with client(legate).responses.stream(model="served-by-openai", input="hi") as stream:
            for _ in stream:
                pass
            stream.get_final_response()


def test_background_response_polled_to_completion_is_metered_once(mock, legate):
    """`background=True`: answered queued without usage; the SDK polls `retrieve` until the
    response is final, and that poll's usage is metered, once."""
    def response(status, usage=None):
        return {"id": "resp_bgsdk", "object": "response", "created_at": 1, "status": status,
                "background": True, "model": "gpt-backend", "output": [], "usage": usage}
    path = "/v1/responses/resp_bgsdk"
    done = response("completed", {"input_tokens": 40, "output_tokens": 7, "total_tokens": 47,
                                  "input_tokens_details": {"cached_tokens": 0},
                                  "output_tokens_details": {"reasoning_tokens": 0}})
    mock.script({"replies": [
        {"match": {"path": "/v1/responses"}, "body": response("queued")},
        {"match": {"path": path}, "body": response("in_progress")},
        {"match": {"path": path}, "body": done, "times": 2}]})
    c = client(legate)
    started = c.responses.create(model="served-by-openai", input="hi", background=True)
    assert started.status == "queued"
    labels = {"tenant": "default", "provider": "openai", "model": "gpt-backend"}
    assert legate.metric("legate_tokens_total", kind="output", **labels) in (None, 0)
    polled = c.responses.retrieve(started.id)
    while polled.status in ("queued", "in_progress"):
        polled = c.responses.retrieve(started.id)
    assert polled.status == "completed"
    assert legate.metric("legate_tokens_total", kind="input", **labels) == 40
    assert legate.metric("legate_tokens_total", kind="output", **labels) == 7
    assert c.responses.retrieve(started.id).status == "completed"
    assert legate.metric("legate_tokens_total", kind="output", **labels) == 7
    assert [r["path"] for r in mock.requests()] == ["/v1/responses", path, path, path]
