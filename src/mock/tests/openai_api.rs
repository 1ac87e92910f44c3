//! OpenAI shapes: chat.completion, chunk stream with and without usage, errors, 404.

use serde_json::{Value, json};

use super::{TestResult, client, json_of, openai_request, parse_sse, post, start};
use crate::mock::MockServer;

/// A Chat Completions call to the mock (`stream`, and `include_usage` when streaming).
async fn chat(
    server: &MockServer,
    stream: bool,
    include_usage: bool,
) -> Result<reqwest::Response, reqwest::Error> {
    post(
        server,
        "/v1/chat/completions",
        &openai_request(stream, include_usage),
    )
    .await
}

fn tool_reply() -> Value {
    json!({"replies": [{
        "content": [{"type": "text", "text": "Let me write"},
                    {"type": "tool_use", "name": "write_file", "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "call_x", "name": "read_file", "input": {"path": "b"}}],
        "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 5},
    }]})
}

#[tokio::test]
async fn completion_has_the_openai_shape_and_derived_usage() -> TestResult {
    let server = start(tool_reply()).await?;
    let response = chat(&server, false, false).await?;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert!(
        response.headers()["x-request-id"]
            .to_str()?
            .starts_with("req_mock_")
    );
    assert!(response.headers().get("request-id").is_none());
    let body = json_of(response).await?;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-test");
    assert!(body["created"].as_u64().is_some());
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "Let me write");
    let calls = &choice["message"]["tool_calls"];
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "write_file");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"path":"a.txt"}"#);
    assert_eq!(calls[1]["id"], "call_x");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 45, "completion_tokens": 7, "total_tokens": 52,
               "prompt_tokens_details": {"cached_tokens": 30}})
    );
    Ok(())
}

#[tokio::test]
async fn finish_reason_maps_from_the_stop_reason() -> TestResult {
    let server =
        start(json!({"replies": [{"stop_reason": "max_tokens"}, {"stop_reason": "end_turn"}]}))
            .await?;
    for expected in ["length", "stop"] {
        let body = json_of(chat(&server, false, false).await?).await?;
        assert_eq!(body["choices"][0]["finish_reason"], expected);
    }
    Ok(())
}

#[tokio::test]
async fn stream_with_usage_ends_with_a_usage_chunk_then_done() -> TestResult {
    let server = start(tool_reply()).await?;
    let response = chat(&server, true, true).await?;
    assert!(
        response.headers()["content-type"]
            .to_str()?
            .starts_with("text/event-stream")
    );
    let events = parse_sse(&response.text().await?);
    assert!(
        events.iter().all(|e| e.event.is_none()),
        "OpenAI streams have data lines only"
    );
    let (done, chunks) = events.split_last().ok_or("empty stream")?;
    assert_eq!(done.data, "[DONE]");
    let chunks: Vec<Value> = chunks.iter().map(|e| e.json()).collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "gpt-test")
    );
    let (usage, choices) = chunks.split_last().ok_or("no usage chunk")?;
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 45);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 30);
    assert!(
        choices
            .iter()
            .all(|c| c["usage"] == Value::Null && c.get("usage").is_some())
    );

    let deltas: Vec<&Value> = choices.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(
        *deltas[0],
        json!({"role": "assistant"}),
        "first chunk is role only"
    );
    let text: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(text, "Let me write");
    let calls: Vec<&Value> = deltas
        .iter()
        .filter_map(|d| d["tool_calls"].get(0))
        .collect();
    let first_of = |index: u64| calls.iter().find(|c| c["index"] == index).copied();
    let first = first_of(0).ok_or("no first tool call")?;
    assert!(first["id"].as_str().is_some_and(|id| !id.is_empty()));
    assert_eq!(first["function"]["name"], "write_file");
    assert_eq!(first_of(1).ok_or("no second tool call")?["id"], "call_x");
    let args = |index: u64| -> String {
        calls
            .iter()
            .filter(|c| c["index"] == index)
            .filter_map(|c| c["function"]["arguments"].as_str())
            .collect()
    };
    assert_eq!(
        serde_json::from_str::<Value>(&args(0))?,
        json!({"path": "a.txt"})
    );
    assert_eq!(
        serde_json::from_str::<Value>(&args(1))?,
        json!({"path": "b"})
    );
    let last = choices.last().ok_or("no finish chunk")?;
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    assert!(
        choices[..choices.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
    Ok(())
}

#[tokio::test]
async fn stream_without_usage_option_has_no_usage() -> TestResult {
    let server = start(json!({})).await?;
    let response = chat(&server, true, false).await?;
    let events = parse_sse(&response.text().await?);
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| e.json())
        .collect();
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(
        chunks
            .last()
            .map(|c| c["choices"][0]["finish_reason"].clone()),
        Some(json!("stop"))
    );
    Ok(())
}

#[tokio::test]
async fn error_status_gets_the_openai_error_body() -> TestResult {
    let server = start(json!({"replies": [
        {"status": 429, "headers": {"x-ratelimit-remaining-requests": "0", "retry-after": "2"}},
        {"status": 429, "error_type": "insufficient_quota", "error_message": "You exceeded your quota."},
    ]}))
    .await?;
    let response = chat(&server, false, false).await?;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["x-ratelimit-remaining-requests"], "0");
    assert!(response.headers().get("x-request-id").is_some());
    let body = json_of(response).await?;
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["param"], Value::Null);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert!(body.get("type").is_none(), "not the Anthropic envelope");

    let body = json_of(chat(&server, false, false).await?).await?;
    assert_eq!(
        body,
        json!({"error": {"message": "You exceeded your quota.", "type": "insufficient_quota",
                         "param": null, "code": "insufficient_quota"}})
    );
    Ok(())
}

#[tokio::test]
async fn unknown_openai_path_gets_an_openai_404() -> TestResult {
    let server = start(json!({})).await?;
    let response = client()
        .post(format!("{}/v1/embeddings", server.base_url()))
        .body("{}")
        .send()
        .await?;
    assert_eq!(response.status(), 404);
    assert!(response.headers().get("x-request-id").is_some());
    let body = json_of(response).await?;
    assert_eq!(body["error"]["type"], "not_found_error");
    Ok(())
}
