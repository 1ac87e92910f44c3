//! Anthropic shapes: Message, event stream, errors, count_tokens, models, 404.

use serde_json::{Value, json};

use super::{TestResult, anthropic_request, client, json_of, parse_sse, post, start, within};

#[tokio::test]
async fn message_has_the_anthropic_shape_and_echoes_the_model() -> TestResult {
    let server = start(json!({})).await?;
    let response = post(&server, "/v1/messages", &anthropic_request(false)).await?;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let request_id = response.headers()["request-id"].to_str()?.to_owned();
    assert!(request_id.starts_with("req_mock_"), "{request_id}");
    assert!(response.headers().get("x-request-id").is_none());
    let body = json_of(response).await?;
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["model"], "claude-test");
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(body["content"][0]["type"], "text");
    assert!(
        body["content"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["stop_sequence"], Value::Null);
    assert_eq!(
        body["usage"],
        json!({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
    );
    within(server.wait_completed(1)).await?;
    Ok(())
}

#[tokio::test]
async fn message_carries_scripted_blocks_usage_and_model() -> TestResult {
    let server = start(json!({"replies": [{
        "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Writing."},
                    {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {"path": "a.txt"}}],
        "usage": {"input_tokens": 7, "output_tokens": 9, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 2},
        "model": "served-by-other",
    }]}))
    .await?;
    let body = json_of(post(&server, "/v1/messages", &anthropic_request(false)).await?).await?;
    assert_eq!(body["model"], "served-by-other");
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(
        body["content"][0],
        json!({"type": "thinking", "thinking": "hmm", "signature": "sig"})
    );
    assert_eq!(
        body["content"][2],
        json!({"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {"path": "a.txt"}})
    );
    assert_eq!(body["usage"]["cache_read_input_tokens"], 3);
    assert_eq!(body["usage"]["cache_creation_input_tokens"], 2);
    Ok(())
}

#[tokio::test]
async fn stream_follows_the_documented_event_order() -> TestResult {
    let server = start(json!({"replies": [{
        "content": [{"type": "text", "text": "Hello there, world"},
                    {"type": "tool_use", "name": "write_file", "input": {"path": "a.txt", "n": 1}}],
        "usage": {"input_tokens": 12, "output_tokens": 34, "cache_read_input_tokens": 5},
    }]}))
    .await?;
    let response = post(&server, "/v1/messages", &anthropic_request(true)).await?;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()?
            .starts_with("text/event-stream")
    );
    assert!(response.headers().get("request-id").is_some());
    let events = parse_sse(&response.text().await?);
    for event in &events {
        let name = event.event.as_deref().unwrap_or("<missing>");
        assert_eq!(
            event.json()["type"],
            name,
            "data.type matches the event line"
        );
    }
    let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(["content_block_delta"; 3]);
    expected.extend(["content_block_stop", "content_block_start"]);
    expected.extend(["content_block_delta"; 4]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);

    let start = events[0].json();
    assert_eq!(start["message"]["content"], json!([]));
    assert_eq!(start["message"]["stop_reason"], Value::Null);
    assert_eq!(start["message"]["model"], "claude-test");
    assert_eq!(start["message"]["usage"]["input_tokens"], 12);
    assert_eq!(start["message"]["usage"]["cache_read_input_tokens"], 5);
    assert_eq!(start["message"]["usage"]["output_tokens"], 1);

    let deltas = |index: u64, field: &str| -> String {
        events
            .iter()
            .map(|e| e.json())
            .filter(|d| d["type"] == "content_block_delta" && d["index"] == index)
            .filter_map(|d| d["delta"][field].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(deltas(0, "text"), "Hello there, world");
    let tool_start = events[7].json();
    assert_eq!(tool_start["content_block"]["type"], "tool_use");
    assert_eq!(tool_start["content_block"]["name"], "write_file");
    assert_eq!(tool_start["content_block"]["input"], json!({}));
    assert_eq!(
        events[8].json()["delta"],
        json!({"type": "input_json_delta", "partial_json": ""})
    );
    let input: Value = serde_json::from_str(&deltas(1, "partial_json"))?;
    assert_eq!(input, json!({"path": "a.txt", "n": 1}));

    let delta = events[events.len() - 2].json();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 34);
    within(server.wait_completed(1)).await?;
    Ok(())
}

#[tokio::test]
async fn error_status_gets_the_anthropic_error_body_and_scripted_headers() -> TestResult {
    let server = start(json!({"replies": [{
        "status": 529,
        "headers": {"retry-after": "1", "anthropic-ratelimit-requests-remaining": "9"},
    }]}))
    .await?;
    let response = post(&server, "/v1/messages", &anthropic_request(true)).await?;
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()["anthropic-ratelimit-requests-remaining"],
        "9"
    );
    assert_eq!(response.headers()["content-type"], "application/json");
    let request_id = response.headers()["request-id"].to_str()?.to_owned();
    let body = json_of(response).await?;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "overloaded_error");
    assert_eq!(body["error"]["message"], "Overloaded");
    assert_eq!(body["request_id"], request_id.as_str());
    Ok(())
}

#[tokio::test]
async fn count_tokens_and_models_answer_in_shape() -> TestResult {
    let server =
        start(json!({"replies": [{"match": {"model": "scripted-model"}, "status": 500}]})).await?;
    let request = anthropic_request(false);
    let response = post(&server, "/v1/messages/count_tokens", &request).await?;
    assert_eq!(response.status(), 200);
    let body = json_of(response).await?;
    let expected = request.to_string().len() as u64 / 4;
    assert_eq!(body, json!({"input_tokens": expected}));

    let response = client()
        .get(format!("{}/v1/models", server.base_url()))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let body = json_of(response).await?;
    let ids: Vec<&str> = body["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(
        ids.contains(&"claude-sonnet-4-5") && ids.contains(&"scripted-model"),
        "{ids:?}"
    );
    assert_eq!(body["data"][0]["type"], "model");
    assert_eq!(body["has_more"], false);
    assert_eq!(body["first_id"], "claude-sonnet-4-5");
    assert_eq!(server.stats().requests, 2);
    Ok(())
}

#[tokio::test]
async fn count_tokens_takes_only_replies_naming_its_path() -> TestResult {
    let server = start(json!({"replies": [
        {"status": 500},
        {"match": {"path": "/v1/messages/count_tokens"}, "status": 529},
    ]}))
    .await?;
    let request = anthropic_request(false);
    let first = post(&server, "/v1/messages/count_tokens", &request).await?;
    assert_eq!(first.status().as_u16(), 529);
    assert_eq!(json_of(first).await?["error"]["type"], "overloaded_error");
    let second = post(&server, "/v1/messages/count_tokens", &request).await?;
    assert_eq!(second.status(), 200);
    let message = post(&server, "/v1/messages", &request).await?;
    assert_eq!(
        message.status(),
        500,
        "the unmatched entry was left for a generation call"
    );
    Ok(())
}

#[tokio::test]
async fn unknown_path_and_bad_json_get_anthropic_errors() -> TestResult {
    let server = start(json!({})).await?;
    let response = client()
        .post(format!("{}/v1/messages/batches", server.base_url()))
        .header("anthropic-version", "2023-06-01")
        .body("{}")
        .send()
        .await?;
    assert_eq!(response.status(), 404);
    let body = json_of(response).await?;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "not_found_error");

    let response = client()
        .post(format!("{}/v1/messages", server.base_url()))
        .body("{not json")
        .send()
        .await?;
    assert_eq!(response.status(), 400);
    assert_eq!(
        json_of(response).await?["error"]["type"],
        "invalid_request_error"
    );
    assert_eq!(server.stats().requests, 2);
    Ok(())
}
