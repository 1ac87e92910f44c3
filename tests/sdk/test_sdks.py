"""The official SDKs, pointed at legate by base URL, are the users: non-streaming and
streaming, both credential styles, and no retry multiplication."""

import anthropic
import openai
import pytest

from conftest import PROVIDER_KEY


def headers_of(req):
    out = {}
    for name, value in req["headers"]:
        out.setdefault(name, []).append(value)
    return out


def only_upstream_credential(req, name, value):
    h = headers_of(req)
    assert h.get(name) == [value]
    other = "authorization" if name == "x-api-key" else "x-api-key"
    assert other not in h
    assert "dummy" not in str(req["headers"])


def test_anthropic_sdk_bearer_generation_non_streaming(mock, legate):
    mock.script({"default": {"content": [{"type": "text", "text": "Hello from the mock."}],
                             "usage": {"input_tokens": 12, "output_tokens": 4}}})
    client = anthropic.Anthropic(base_url=legate.url, api_key="dummy-client-key")
    msg = client.messages.create(model="claude-sdk", max_tokens=64,
                                 messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == "Hello from the mock."
    assert msg.usage.input_tokens == 12
    reqs = mock.requests()
    assert len(reqs) == 1
    only_upstream_credential(reqs[0], "x-api-key", PROVIDER_KEY)
    assert headers_of(reqs[0])["anthropic-version"] == ["2026-10-21"]


def test_anthropic_sdk_x_api_key_generation_streaming(mock, legate):
    mock.script({"default": {"content": [{"type": "text", "text": "one two three four"}],
                             "event_gap_ms": 20}})
    # The pre-2.0 SDK generation sends X-Api-Key with anthropic-version 2023-06-01.
    client = anthropic.Anthropic(
        base_url=legate.url,
        default_headers={"X-Api-Key": "dummy-client-key", "anthropic-version": "2023-06-01"},
    )
    with client.messages.stream(model="claude-sdk", max_tokens=64,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "one two three four"
    assert final.stop_reason == "end_turn"
    reqs = mock.requests()
    only_upstream_credential(reqs[0], "x-api-key", PROVIDER_KEY)
    assert headers_of(reqs[0])["anthropic-version"] == ["2023-06-01"]


def test_anthropic_sdk_tool_use_round_trip(mock, legate):
    mock.script({"default": {"content": [{"type": "tool_use", "name": "read_file",
                                          "input": {"path": "notes.txt"}}],
                             "stop_reason": "tool_use"}})
    client = anthropic.Anthropic(base_url=legate.url, api_key="dummy-client-key")
    with client.messages.stream(model="claude-sdk", max_tokens=64,
                                messages=[{"role": "user", "content": "read it"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    block = final.content[0]
    assert block.type == "tool_use" and block.name == "read_file"
    assert block.input == {"path": "notes.txt"}


def test_anthropic_sdk_does_not_multiply_upstream_errors(mock, legate):
    mock.script({"default": {"status": 529}})
    client = anthropic.Anthropic(base_url=legate.url, api_key="dummy-client-key")
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.create(model="claude-sdk", max_tokens=8,
                               messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 529
    assert err.value.response.headers["x-should-retry"] == "false"
    assert err.value.response.headers["x-legate-attempts"] == "3"
    # legate's max_attempts (3), not 3 x the SDK's default max_retries=2 on top.
    assert len(mock.requests()) == 3


def test_anthropic_sdk_raises_when_a_stream_breaks_after_content(mock, legate):
    mock.script({"default": {"content": [{"type": "text", "text": "a b c d e f"}],
                             "cut_after": 6}})
    client = anthropic.Anthropic(base_url=legate.url, api_key="dummy-client-key")
    with pytest.raises(anthropic.APIError):
        with client.messages.stream(model="claude-sdk", max_tokens=64,
                                    messages=[{"role": "user", "content": "hi"}]) as stream:
            for _ in stream.text_stream:
                pass
            stream.get_final_message()
    # Content had reached the caller: nothing was retried.
    assert len(mock.requests()) == 1


def test_openai_sdk_raises_when_a_stream_breaks_after_content(mock, legate):
    mock.script({"default": {"content": [{"type": "text", "text": "a b c d e f"}],
                             "cut_after": 4}})
    client = openai.OpenAI(base_url=legate.url + "/v1", api_key="dummy-client-key")
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(
                model="gpt-sdk", stream=True, messages=[{"role": "user", "content": "hi"}]):
            pass
    assert len(mock.requests()) == 1


def test_anthropic_sdk_sees_legate_errors_in_its_shape(mock, legate):
    client = anthropic.Anthropic(base_url=legate.url, api_key="dummy-client-key")
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="claude-sdk", max_tokens=8, messages="not-a-list",
                               extra_body={"max_tokens": "many"})
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert mock.requests() == []


@pytest.mark.parametrize("suffix", ["/v1", ""])
def test_openai_sdk_non_streaming(mock, legate, suffix):
    mock.script({"default": {"content": [{"type": "text", "text": "hi there"}],
                             "usage": {"input_tokens": 9, "output_tokens": 2}}})
    client = openai.OpenAI(base_url=legate.url + suffix, api_key="dummy-client-key")
    out = client.chat.completions.create(model="gpt-sdk",
                                         messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "hi there"
    assert out.usage.prompt_tokens == 9
    reqs = mock.requests()
    assert reqs[0]["path"] == "/v1/chat/completions"
    only_upstream_credential(reqs[0], "authorization", f"Bearer {PROVIDER_KEY}")


def test_openai_sdk_streaming_with_usage(mock, legate):
    mock.script({"default": {"content": [{"type": "text", "text": "streamed words here"}],
                             "usage": {"input_tokens": 5, "output_tokens": 3}}})
    client = openai.OpenAI(base_url=legate.url + "/v1", api_key="dummy-client-key")
    stream = client.chat.completions.create(
        model="gpt-sdk", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hi"}])
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    assert text == "streamed words here"
    assert usage.completion_tokens == 3
    assert legate.metric("legate_tokens_total", provider="openai", kind="output") == 3
    assert legate.metric("legate_tokens_total", provider="openai", kind="input") == 5


@pytest.mark.parametrize("sdk", ["anthropic", "openai"])
def test_an_sdk_timeout_is_answered_504_before_the_sdk_retries(mock, legate, sdk):
    """A client-level timeout shorter than the provider's answer: legate reads it from the
    SDK's own headers and answers 504 (x-should-retry: false) before the SDK gives up, so the
    SDK, at its default max_retries, does not send the call again: one upstream call."""
    mock.script({"default": {"delay_ms": 5000}})
    if sdk == "anthropic":
        client = anthropic.Anthropic(base_url=legate.url, api_key="dummy", timeout=2.0)
        call = lambda: client.messages.create(  # noqa: E731
            model="claude-sdk", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        error = anthropic.APIStatusError
    else:
        client = openai.OpenAI(base_url=legate.url + "/v1", api_key="dummy", timeout=2.0)
        call = lambda: client.chat.completions.create(  # noqa: E731
            model="served-by-openai", messages=[{"role": "user", "content": "hi"}])
        error = openai.APIStatusError
    with pytest.raises(error) as raised:
        call()
    assert raised.value.status_code == 504
    assert len(mock.requests()) == 1
