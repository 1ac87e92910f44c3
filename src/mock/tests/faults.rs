//! Fault injection as a client sees it, and the cancel/complete counting behind it.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{TestResult, anthropic_request, openai_request, parse_sse, post, start, within};

/// Reads body chunks until `events` SSE events have arrived (or the body ends).
async fn read_events(
    response: &mut reqwest::Response,
    events: usize,
) -> Result<String, reqwest::Error> {
    let mut text = String::new();
    while text.matches("\n\n").count() < events {
        match response.chunk().await? {
            Some(chunk) => text.push_str(&String::from_utf8_lossy(&chunk)),
            None => break,
        }
    }
    Ok(text)
}

/// Reads the whole body, returning what arrived and whether it ended in an error.
async fn read_to_end(mut response: reqwest::Response) -> (String, bool) {
    let mut text = String::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(None) => return (text, false),
            Err(_) => return (text, true),
        }
    }
}

#[tokio::test]
async fn delay_holds_the_response_headers_back() -> TestResult {
    let server = start(json!({"replies": [{"delay_ms": 150}]})).await?;
    let sent = Instant::now();
    let response = post(&server, "/v1/messages", &anthropic_request(false)).await?;
    assert!(sent.elapsed() >= Duration::from_millis(150));
    assert_eq!(response.status(), 200);
    Ok(())
}

#[tokio::test]
async fn client_leaving_during_a_hang_counts_as_cancelled() -> TestResult {
    let server = start(json!({"replies": [{"hang": true}]})).await?;
    let url = format!("{}/v1/messages", server.base_url());
    let request = tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(url)
            .body(anthropic_request(false).to_string())
            .send()
            .await;
    });
    within(server.wait_requests(1)).await?;
    assert_eq!(server.stats().inflight, 1);
    request.abort();
    within(server.wait_cancelled(1)).await?;
    let stats = server.stats();
    assert_eq!(
        (stats.completed, stats.cancelled, stats.inflight),
        (0, 1, 0)
    );
    Ok(())
}

#[tokio::test]
async fn client_leaving_mid_stream_counts_as_cancelled() -> TestResult {
    let server = start(json!({"replies": [
        {"hang_after": 2},
        {"event_gap_ms": 100},
        {"hang_after": 0},
    ]}))
    .await?;
    let mut hanging = post(&server, "/v1/messages", &anthropic_request(true)).await?;
    let text = within(read_events(&mut hanging, 2)).await??;
    assert_eq!(parse_sse(&text).len(), 2);
    drop(hanging);
    within(server.wait_cancelled(1)).await?;

    let mut paced = post(
        &server,
        "/v1/chat/completions",
        &openai_request(true, false),
    )
    .await?;
    within(read_events(&mut paced, 1)).await??;
    drop(paced);
    within(server.wait_cancelled(2)).await?;

    // A hang on a non-streaming reply sends half the document, then nothing.
    let mut half = post(&server, "/v1/messages", &anthropic_request(false)).await?;
    let first = within(half.chunk()).await??.ok_or("no first half")?;
    assert!(!first.is_empty() && serde_json::from_slice::<Value>(&first).is_err());
    drop(half);
    within(server.wait_cancelled(3)).await?;
    let stats = server.stats();
    assert_eq!(
        (stats.completed, stats.cancelled, stats.inflight),
        (0, 3, 0)
    );
    Ok(())
}

#[tokio::test]
async fn cut_after_breaks_the_body_in_both_shapes() -> TestResult {
    let server = start(json!({"replies": [
        {"cut_after": 3},
        {"cut_after": 2},
        {"cut_after": 0},
    ]}))
    .await?;
    let anthropic = post(&server, "/v1/messages", &anthropic_request(true)).await?;
    assert_eq!(anthropic.status(), 200);
    let (text, failed) = within(read_to_end(anthropic)).await?;
    assert!(failed, "the client must see a broken body, not a clean end");
    let names: Vec<Option<String>> = parse_sse(&text).into_iter().map(|e| e.event).collect();
    let expected = ["message_start", "ping", "content_block_start"].map(|n| Some(n.to_owned()));
    assert_eq!(names, expected);

    let openai = post(&server, "/v1/chat/completions", &openai_request(true, true)).await?;
    let (text, failed) = within(read_to_end(openai)).await?;
    assert!(failed);
    assert_eq!(parse_sse(&text).len(), 2);
    assert!(!text.contains("[DONE]"));

    let document = post(&server, "/v1/messages", &anthropic_request(false)).await?;
    assert_eq!(document.status(), 200);
    let (_, failed) = within(read_to_end(document)).await?;
    assert!(failed, "a cut document is incomplete");
    within(server.wait_completed(3)).await?;
    assert_eq!(
        server.stats().cancelled,
        0,
        "a scripted cut is not a client cancel"
    );
    Ok(())
}

#[tokio::test]
async fn stream_error_after_sends_an_error_event_and_ends() -> TestResult {
    let server = start(json!({"replies": [
        {"stream_error_after": 3},
        {"stream_error_after": 2, "error_type": "server_error", "error_message": "boom"},
    ]}))
    .await?;
    let anthropic = post(&server, "/v1/messages", &anthropic_request(true)).await?;
    let events = parse_sse(&anthropic.text().await?);
    assert_eq!(events.len(), 4);
    let error = &events[3];
    assert_eq!(error.event.as_deref(), Some("error"));
    assert_eq!(
        error.json(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );

    let openai = post(
        &server,
        "/v1/chat/completions",
        &openai_request(true, false),
    )
    .await?;
    let events = parse_sse(&openai.text().await?);
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].event, None);
    assert_eq!(events[2].json()["error"]["message"], "boom");
    assert_eq!(events[2].json()["error"]["type"], "server_error");
    within(server.wait_completed(2)).await?;
    Ok(())
}

#[tokio::test]
async fn event_gap_spaces_the_events() -> TestResult {
    let gap = Duration::from_millis(40);
    let server = start(json!({"replies": [{"event_gap_ms": 40}]})).await?;
    let sent = Instant::now();
    let mut response = post(&server, "/v1/messages", &anthropic_request(true)).await?;
    let mut text = String::new();
    while let Some(chunk) = within(response.chunk()).await?? {
        text.push_str(&String::from_utf8_lossy(&chunk));
        let arrived = text.matches("\n\n").count() as u32;
        // Event i (0-based) leaves i gaps after the first; it cannot arrive sooner.
        assert!(
            sent.elapsed() >= gap * arrived.saturating_sub(1),
            "event {arrived} early"
        );
    }
    let events = parse_sse(&text);
    assert_eq!(
        events.last().and_then(|e| e.event.as_deref()),
        Some("message_stop")
    );
    assert!(sent.elapsed() >= gap * (events.len() as u32 - 1));
    Ok(())
}
