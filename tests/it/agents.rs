//! What real agents send through a cross-provider alias (Claude Code, agent frameworks): system
//! entries mid-conversation, count_tokens, structured output, `?beta=true`, large max_tokens, and
//! tool calls whose arguments a model got wrong.

use futures_util::StreamExt;
use legate::mock::Script;
use serde_json::{Value, json};

use crate::harness;

const CHAINS: &str = r#"
[retry]
base_delay = "10ms"
max_delay = "20ms"

[[models]]
name = "xgpt"
chain = ["openai:gpt-4o-mini"]

[[models]]
name = "via-anthropic"
chain = ["anthropic:claude-haiku-4-5"]

[[models]]
name = "shaky"
chain = ["openai:gpt-bad", "openai:gpt-good"]

[[models]]
name = "bad-only"
chain = ["openai:gpt-bad"]
"#;

/// Every reply for `gpt-bad` calls a tool with arguments that are a JSON string, not an object.
const BAD_TOOL: &str = r#"{"replies":[{"match":{"model":"gpt-bad"},"times":0,
    "content":[{"type":"tool_use","id":"call_1","name":"write_file","input":"{\"path\": \"a"}]}]}"#;

fn sent(req: &legate::mock::RecordedRequest) -> Value {
    serde_json::from_slice(&req.body).unwrap()
}

/// (event name, data) of a streamed answer.
async fn events(resp: reqwest::Response) -> Vec<(String, Value)> {
    let mut parser = legate::sse::SseParser::new();
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        parser.push(&chunk);
        while let Some(ev) = parser.next_event() {
            let data = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
            out.push((ev.event.unwrap_or_default(), data));
        }
    }
    out
}

#[tokio::test]
async fn system_entries_inside_messages_reach_an_openai_step_in_place() {
    let env = harness::start(CHAINS).await;
    let body = json!({"model": "xgpt", "max_tokens": 100, "system": "You are terse.",
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "The user is on a slow link."},
        {"role": "user", "content": "ls"}
    ]});
    let resp = env.messages(body.to_string()).await;
    assert_eq!(resp.status(), 200);
    let up = sent(&env.mock.requests()[0]);
    let roles: Vec<&str> = up["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "system", "user"]);
    assert_eq!(up["messages"][3]["content"], "The user is on a slow link.");
}

#[tokio::test]
async fn system_messages_after_the_first_turn_stay_in_place_on_an_anthropic_step() {
    let env = harness::start(CHAINS).await;
    let body = json!({"model": "via-anthropic", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Now answer in French."},
        {"role": "user", "content": "again"}
    ]});
    assert_eq!(env.chat(body.to_string()).await.status(), 200);
    let up = sent(&env.mock.requests()[0]);
    assert_eq!(up["system"], "Be brief.");
    assert_eq!(
        up["messages"][1],
        json!({"role": "system", "content": "Now answer in French."})
    );
}

/// `POST /v1/messages/count_tokens{query}` with `body`.
async fn count_tokens(env: &harness::Env, query: &str, body: &Value) -> reqwest::Response {
    env.http
        .post(env.url(&format!("/v1/messages/count_tokens{query}")))
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn count_tokens_through_a_cross_provider_alias_is_estimated_locally() {
    let env = harness::start(CHAINS).await;
    let body = json!({"model": "xgpt", "system": "You are terse.",
        "messages": [{"role": "user", "content": "Hello world"}]});
    let resp = count_tokens(&env, "?beta=true", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-estimate"], "true");
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-4o-mini");
    let v: Value = resp.json().await.unwrap();
    // system (3 + 1 + 4) + user (3 + 1 + 2) + 3 priming, in gpt-4o-mini's own encoding.
    assert_eq!(v, json!({"input_tokens": 17}));
    assert!(env.mock.requests().is_empty(), "no upstream call");
}

#[tokio::test]
async fn count_tokens_of_a_request_the_translated_step_cannot_take_is_still_an_estimate() {
    let chains = format!(
        "{CHAINS}\n[[models]]\nname = \"gpt-then-claude\"\nchain = [\"openai:gpt-4o-mini\", \"anthropic:claude-haiku-4-5\"]\n"
    );
    let env = harness::start(&chains).await;
    // A forced server tool and a Files-API image: neither can go to an OpenAI step.
    for body in [
        json!({"model": "xgpt", "messages": [{"role": "user", "content": "hello"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "tool", "name": "web_search"}}),
        json!({"model": "xgpt", "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}]}),
    ] {
        let resp = count_tokens(&env, "", &body).await;
        assert_eq!(resp.status(), 200, "{body}");
        assert_eq!(resp.headers()["x-legate-estimate"], "true");
        let v: Value = resp.json().await.unwrap();
        assert!(v["input_tokens"].as_u64().is_some_and(|n| n > 0), "{v}");
    }
    assert!(env.mock.requests().is_empty(), "no upstream call");
    // With a later step that can take it, the count goes there, as the request would.
    let body = json!({"model": "gpt-then-claude", "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "tool", "name": "web_search"}});
    let resp = count_tokens(&env, "", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-haiku-4-5"
    );
    assert!(resp.headers().get("x-legate-estimate").is_none());
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/v1/messages/count_tokens");
}

#[tokio::test]
async fn max_tokens_is_capped_at_the_output_limit_of_a_model_legate_chose() {
    let env = harness::start(&format!(
        "{CHAINS}\n[[models]]\nname = \"local\"\nchain = [\"openai:llama-3.1-8b\"]\n\n[[limits]]\nmodel = \"llama-3.1*\"\nmax_output_tokens = 2048\n"
    ))
    .await;
    let ask = |model: &str| {
        json!({"model": model, "max_tokens": 32000,
            "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
    };
    for model in ["xgpt", "local"] {
        assert_eq!(env.messages(ask(model)).await.status(), 200);
    }
    // Claude Code's 32000 fits neither gpt-4o-mini (built-in table) nor the configured limit.
    let reqs = env.mock.requests();
    assert_eq!(sent(&reqs[0])["max_completion_tokens"], 16384);
    assert_eq!(sent(&reqs[1])["max_completion_tokens"], 2048);
    // A caller naming a provider's model itself is sent what it asked for.
    let own = env.messages(ask("claude-haiku-4-5-20251001")).await;
    assert_eq!(own.status(), 200);
    assert_eq!(sent(&env.mock.requests()[2])["max_tokens"], 32000);
}

#[tokio::test]
async fn structured_output_is_carried_or_the_step_is_not_used() {
    let env = harness::start(CHAINS).await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"], "additionalProperties": false});
    let body = json!({"model": "xgpt", "max_tokens": 50,
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
        "messages": [{"role": "user", "content": "count"}]});
    assert_eq!(env.messages(body.to_string()).await.status(), 200);
    let up = sent(&env.mock.requests()[0]);
    assert_eq!(up["response_format"]["type"], "json_schema");
    assert_eq!(up["response_format"]["json_schema"]["schema"], schema);
    // JSON without a schema has no Anthropic counterpart: refused, never served as free text.
    let body = json!({"model": "via-anthropic", "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": "count"}]});
    let resp = env.chat(body.to_string()).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("json_object")
    );
    assert_eq!(env.mock.requests().len(), 1, "nothing sent for the refusal");
}

#[tokio::test]
async fn the_query_string_reaches_only_a_provider_of_the_callers_api() {
    let env = harness::start(CHAINS).await;
    for model in ["xgpt", "claude-haiku-4-5"] {
        let body = json!({"model": model, "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]});
        let resp = env
            .http
            .post(env.url("/v1/messages?beta=true"))
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let paths: Vec<String> = env.mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/chat/completions", "/v1/messages?beta=true"]);
}

#[tokio::test]
async fn broken_tool_arguments_are_retried_then_fall_back_streaming_and_not() {
    for stream in [false, true] {
        // One legate per mode: the failures would otherwise open gpt-bad's breaker.
        let env = harness::start_with(Script::from_json(BAD_TOOL).unwrap(), CHAINS).await;
        let body = json!({"model": "shaky", "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": "write it"}]});
        let resp = env.messages(body.to_string()).await;
        assert_eq!(resp.status(), 200, "stream: {stream}");
        assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-good");
        assert_eq!(resp.headers()["x-legate-attempts"], "4");
        if stream {
            let evs = events(resp).await;
            assert_eq!(evs.last().unwrap().0, "message_stop");
            assert!(evs.iter().all(|(n, _)| n != "error"));
        } else {
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["content"][0]["type"], "text");
        }
        let models: Vec<String> = env
            .mock
            .requests()
            .iter()
            .map(|r| sent(r)["model"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(models, ["gpt-bad", "gpt-bad", "gpt-bad", "gpt-good"]);
    }
}

#[tokio::test]
async fn broken_tool_arguments_are_named_as_such_when_nothing_else_can_answer() {
    let env = harness::start_with(Script::from_json(BAD_TOOL).unwrap(), CHAINS).await;
    let body = json!({"model": "bad-only", "max_tokens": 100,
        "messages": [{"role": "user", "content": "write it"}]});
    let resp = env.messages(body.to_string()).await;
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tool `write_file`") && message.contains("not a JSON object"),
        "{message}"
    );
    assert!(!message.contains("broke off"), "{message}");
}

#[tokio::test]
async fn broken_tool_arguments_after_the_commit_point_end_in_an_error_event() {
    let script = r#"{"replies":[{"match":{"model":"gpt-bad"},"times":0,"event_gap_ms":30,
        "content":[{"type":"text","text":"Writing it now."},
                   {"type":"tool_use","id":"call_1","name":"write_file","input":"{\"path\": \"a"}]}]}"#;
    let env = harness::start_with(Script::from_json(script).unwrap(), CHAINS).await;
    let body = json!({"model": "shaky", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "write it"}]});
    let resp = env.messages(body.to_string()).await;
    assert_eq!(resp.status(), 200);
    let evs = events(resp).await;
    let (last, data) = evs.last().unwrap();
    assert_eq!(last, "error");
    assert!(
        data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a JSON object")
    );
    assert!(evs.iter().all(|(n, _)| n != "message_stop"));
    assert_eq!(
        env.mock.requests().len(),
        1,
        "nothing is retried after the commit point"
    );
}
