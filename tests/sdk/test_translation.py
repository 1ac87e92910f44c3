"""Each official SDK served by a provider of the other API through legate's translation:
streaming and not, with tools."""

import json

import anthropic
import openai

TOOL_REPLY = {"default": {
    "content": [{"type": "text", "text": "Reading."},
                {"type": "tool_use", "name": "read_file", "input": {"path": "a.txt", "n": [1, 2]}}],
    "stop_reason": "tool_use", "usage": {"input_tokens": 30, "output_tokens": 12}}}

TOOLS = [{"name": "read_file", "description": "Read a file",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def test_anthropic_sdk_served_by_an_openai_provider(mock, legate):
    mock.script(TOOL_REPLY)
    client = anthropic.Anthropic(base_url=legate.url, api_key="dummy-client-key")
    msg = client.messages.create(model="served-by-openai", max_tokens=64, tools=TOOLS,
                                 messages=[{"role": "user", "content": "read a.txt"}])
    assert msg.stop_reason == "tool_use"
    assert msg.content[0].text == "Reading."
    assert msg.content[1].name == "read_file" and msg.content[1].input == {"path": "a.txt", "n": [1, 2]}
    assert msg.usage.input_tokens == 30
    assert mock.requests()[0]["path"] == "/v1/chat/completions"

    with client.messages.stream(model="served-by-openai", max_tokens=64, tools=TOOLS,
                                messages=[{"role": "user", "content": "read a.txt"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Reading."
    assert final.stop_reason == "tool_use"
    assert final.content[-1].input == {"path": "a.txt", "n": [1, 2]}


def test_openai_sdk_served_by_an_anthropic_provider(mock, legate):
    mock.script(TOOL_REPLY)
    client = openai.OpenAI(base_url=legate.url + "/v1", api_key="dummy-client-key")
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    out = client.chat.completions.create(model="served-by-anthropic", tools=tools,
                                         messages=[{"role": "user", "content": "read a.txt"}])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"path": "a.txt", "n": [1, 2]}
    assert out.usage.prompt_tokens == 30
    assert mock.requests()[0]["path"] == "/v1/messages"

    args, finish = "", None
    for chunk in client.chat.completions.create(model="served-by-anthropic", tools=tools, stream=True,
                                                messages=[{"role": "user", "content": "read a.txt"}]):
        if chunk.choices:
            delta = chunk.choices[0].delta
            if delta.tool_calls:
                args += delta.tool_calls[0].function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert json.loads(args) == {"path": "a.txt", "n": [1, 2]}
