//! Responses shapes: the response object, the semantic stream with sequence numbers, the
//! failure script (error + response.failed, a missing terminal event) and the small endpoints.

use reqwest::Method;
use serde_json::{Value, json};

use super::{TestResult, client, json_of, parse_sse, post, start};

fn request(stream: bool) -> Value {
    json!({"model": "gpt-test", "input": "hi", "stream": stream})
}

fn tool_reply(extra: Value) -> Value {
    let mut reply = json!({
        "content": [{"type": "text", "text": "Let me run it"},
                    {"type": "tool_use", "id": "call_x", "name": "shell", "input": {"cmd": "ls"}}],
        "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 30},
    });
    if let (Some(r), Value::Object(extra)) = (reply.as_object_mut(), extra) {
        r.extend(extra);
    }
    json!({"replies": [reply]})
}

#[tokio::test]
async fn response_object_has_items_and_usage() -> TestResult {
    let server = start(tool_reply(json!({}))).await?;
    let response = post(&server, "/v1/responses", &request(false)).await?;
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("x-request-id"));
    let body = json_of(response).await?;
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["output"][0]["type"], "message");
    assert_eq!(body["output"][0]["content"][0]["text"], "Let me run it");
    assert_eq!(body["output"][1]["type"], "function_call");
    assert_eq!(body["output"][1]["call_id"], "call_x");
    assert_eq!(body["output"][1]["arguments"], r#"{"cmd":"ls"}"#);
    assert_eq!(body["usage"]["input_tokens"], 40);
    assert_eq!(body["usage"]["input_tokens_details"]["cached_tokens"], 30);
    assert_eq!(body["usage"]["output_tokens"], 7);
    assert_eq!(body["usage"]["total_tokens"], 47);
    Ok(())
}

#[tokio::test]
async fn stream_is_semantic_events_numbered_in_order() -> TestResult {
    let server = start(tool_reply(json!({}))).await?;
    let response = post(&server, "/v1/responses", &request(true)).await?;
    let events = parse_sse(&response.text().await?);
    let types: Vec<String> = events
        .iter()
        .map(|e| e.json()["type"].as_str().unwrap_or("").to_owned())
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.event.as_deref(), Some(types[i].as_str()));
        assert_eq!(e.json()["sequence_number"], i);
    }
    assert_eq!(types[0], "response.created");
    assert_eq!(types[1], "response.in_progress");
    assert!(types.contains(&"response.output_text.delta".to_owned()));
    assert!(types.contains(&"response.function_call_arguments.delta".to_owned()));
    let args: String = events
        .iter()
        .filter(|e| e.json()["type"] == "response.function_call_arguments.delta")
        .map(|e| e.json()["delta"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(args, r#"{"cmd":"ls"}"#);
    let last = events.last().map(Event::json).unwrap_or_default();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["usage"]["output_tokens"], 7);
    assert!(!events.iter().any(|e| e.data.contains("[DONE]")));
    Ok(())
}

use super::Event;

#[tokio::test]
async fn stream_error_is_an_error_event_then_response_failed() -> TestResult {
    let server = start(tool_reply(json!({"stream_error_after": 3}))).await?;
    let response = post(&server, "/v1/responses", &request(true)).await?;
    let events = parse_sse(&response.text().await?);
    assert_eq!(events.len(), 5);
    assert_eq!(events[3].event.as_deref(), Some("error"));
    assert_eq!(events[3].json()["code"], "server_error");
    assert_eq!(events[3].json()["sequence_number"], 3);
    assert_eq!(events[4].json()["type"], "response.failed");
    assert_eq!(events[4].json()["sequence_number"], 4);
    assert_eq!(events[4].json()["response"]["status"], "failed");
    Ok(())
}

#[tokio::test]
async fn drop_terminal_ends_cleanly_without_completed() -> TestResult {
    let server = start(tool_reply(json!({"drop_terminal": true}))).await?;
    let response = post(&server, "/v1/responses", &request(true)).await?;
    let events = parse_sse(&response.text().await?);
    let last = events.last().map(Event::json).unwrap_or_default();
    assert_eq!(last["type"], "response.output_item.done");
    Ok(())
}

#[tokio::test]
async fn max_tokens_is_an_incomplete_response() -> TestResult {
    let server = start(json!({"replies": [{"stop_reason": "max_tokens"}]})).await?;
    let body = json_of(post(&server, "/v1/responses", &request(false)).await?).await?;
    assert_eq!(body["status"], "incomplete");
    assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
    Ok(())
}

#[tokio::test]
async fn errors_use_the_openai_envelope() -> TestResult {
    let server = start(json!({"replies": [{"status": 429}]})).await?;
    let response = post(&server, "/v1/responses", &request(false)).await?;
    assert_eq!(response.status(), 429);
    let body = json_of(response).await?;
    assert_eq!(body["error"]["type"], "rate_limit_error");
    Ok(())
}

#[tokio::test]
async fn stored_response_endpoints_answer() -> TestResult {
    let server = start(json!({})).await?;
    let base = server.base_url();
    for (method, path, key, want) in [
        (Method::GET, "", "id", json!("resp_9")),
        (Method::GET, "", "object", json!("response")),
        (Method::DELETE, "", "deleted", json!(true)),
        (Method::POST, "/cancel", "status", json!("cancelled")),
        (Method::GET, "/input_items", "object", json!("list")),
    ] {
        let url = format!("{base}/v1/responses/resp_9{path}");
        let got = json_of(client().request(method.clone(), url).send().await?).await?;
        assert_eq!(got[key], want, "{method} {path}");
    }
    let count =
        json_of(post(&server, "/v1/responses/input_tokens", &request(false)).await?).await?;
    assert_eq!(count["object"], "response.input_tokens");
    Ok(())
}
