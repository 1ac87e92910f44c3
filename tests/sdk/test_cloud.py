"""The official SDKs through legate to the cloud platforms, played by `legate mock --cloud`:
Bedrock (web identity via STS, SigV4, binary event stream), Vertex AI (metadata server) and
Azure OpenAI (Entra workload identity). The SDKs speak plain Anthropic and OpenAI to legate,
JSON and streams, with a tool call."""

import json

import anthropic
import openai
import pytest

from conftest import Legate, Mock, _spawn, _stop

BEDROCK_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
TOOL_REPLY = {"default": {"content": [{"type": "text", "text": "Let me check."},
                                      {"type": "tool_use", "name": "get_weather",
                                       "input": {"city": "Paris"}}],
                          "stop_reason": "tool_use"}}


@pytest.fixture
def cloud_mock():
    proc, line = _spawn(["mock", "--cloud", "--listen", "127.0.0.1:0"])
    url = next(w for w in line.split() if w.startswith("http://"))
    yield Mock(url)
    _stop(proc)


@pytest.fixture
def cloud_legate(cloud_mock, tmp_path):
    m = cloud_mock.url
    token = tmp_path / "projected-token"
    token.write_text("projected-service-account-token")
    cfg = tmp_path / "legate.toml"
    cfg.write_text(f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
base_url = "{m}"

[providers.openai]
base_url = "{m}"

[providers.bedrock]
kind = "bedrock"
region = "us-east-1"
base_url = "{m}"
sts_endpoint = "{m}/sts"

[providers.vertex]
kind = "vertex"
project = "proj"
region = "us-east5"
base_url = "{m}"
metadata_url = "{m}"

[providers.azure]
kind = "azure-openai"
base_url = "{m}"
token_url = "{m}/tenant/oauth2/v2.0/token"

[routing]
anthropic = "anthropic"
openai = "azure"

[[models]]
name = "claude-on-bedrock"
chain = ["bedrock:{BEDROCK_MODEL}"]

[[models]]
name = "claude-on-vertex"
chain = ["vertex:{VERTEX_MODEL}"]

[[models]]
name = "gpt-on-azure"
chain = ["azure:gpt-4o"]
""")
    proc, line = _spawn(["serve", "--config", str(cfg)], env={
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
        "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/legate",
        "AZURE_FEDERATED_TOKEN_FILE": str(token),
        "AZURE_CLIENT_ID": "client",
        "AZURE_TENANT_ID": "tenant",
    })
    words = [w.strip("()") for w in line.split()]
    urls = [w for w in words if w.startswith("http://")]
    yield Legate(urls[0], urls[1])
    _stop(proc)


def platform_requests(mock, prefix):
    return [r for r in mock.requests() if r["path"].startswith(prefix)]


@pytest.mark.parametrize("model,prefix", [("claude-on-bedrock", "/model/"),
                                          ("claude-on-vertex", "/v1/projects/")])
def test_anthropic_sdk_json_and_stream_with_a_tool_call(cloud_mock, cloud_legate, model, prefix):
    cloud_mock.script(TOOL_REPLY)
    client = anthropic.Anthropic(base_url=cloud_legate.url, api_key="unused")
    msg = client.messages.create(model=model, max_tokens=64, tools=[TOOL],
                                 messages=[{"role": "user", "content": "weather in Paris?"}])
    assert msg.stop_reason == "tool_use"
    assert msg.content[1].name == "get_weather" and msg.content[1].input == {"city": "Paris"}
    with client.messages.stream(model=model, max_tokens=64, tools=[TOOL],
                                messages=[{"role": "user", "content": "weather?"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].text == "Let me check."
    assert final.content[1].input == {"city": "Paris"}
    reqs = platform_requests(cloud_mock, prefix)
    assert len(reqs) == 2
    body = json.loads(reqs[1]["body"]) if isinstance(reqs[1]["body"], str) else reqs[1]["body"]
    assert "model" not in body and body["anthropic_version"]


def test_openai_sdk_json_and_stream_with_a_tool_call_on_azure_and_bedrock(cloud_mock, cloud_legate):
    cloud_mock.script(TOOL_REPLY)
    client = openai.OpenAI(base_url=cloud_legate.url + "/v1", api_key="unused")
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": TOOL["input_schema"]}}]
    for model in ["gpt-on-azure", "claude-on-bedrock"]:
        resp = client.chat.completions.create(model=model, tools=tools,
                                              messages=[{"role": "user", "content": "weather?"}])
        call = resp.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        chunks = list(client.chat.completions.create(
            model=model, tools=tools, stream=True,
            messages=[{"role": "user", "content": "weather?"}]))
        args = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                       for c in chunks if c.choices and c.choices[0].delta.tool_calls)
        assert json.loads(args) == {"city": "Paris"}
    assert len(platform_requests(cloud_mock, "/openai/deployments/")) == 2
    assert len(platform_requests(cloud_mock, "/model/")) == 2
    assert cloud_legate.metric("legate_credential_refreshes_total", result="error") is None


def test_openai_sdk_responses_on_azure_v1_with_a_function_call_retrieve_and_delete(cloud_mock,
                                                                                   cloud_legate):
    cloud_mock.script(TOOL_REPLY)
    client = openai.OpenAI(base_url=cloud_legate.url + "/v1", api_key="unused", max_retries=0)
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOL["input_schema"]}]
    resp = client.responses.create(model="gpt-on-azure", input="weather?", tools=tools)
    call = next(i for i in resp.output if i.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    with client.responses.stream(model="gpt-on-azure", input="weather?", tools=tools) as stream:
        final = stream.get_final_response()
    call = next(i for i in final.output if i.type == "function_call")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert final.usage.output_tokens > 0
    assert client.responses.retrieve(resp.id).id == resp.id
    client.responses.delete(resp.id)
    reqs = platform_requests(cloud_mock, "/openai/v1/responses")
    assert [(r["method"], r["path"]) for r in reqs] == [
        ("POST", "/openai/v1/responses"), ("POST", "/openai/v1/responses"),
        ("GET", f"/openai/v1/responses/{resp.id}"), ("DELETE", f"/openai/v1/responses/{resp.id}")]
    assert all(dict(r["headers"])["authorization"].startswith("Bearer entra-") for r in reqs)
    assert platform_requests(cloud_mock, "/openai/deployments/") == []
