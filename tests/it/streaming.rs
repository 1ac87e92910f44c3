//! Streams pass through event by event, unbuffered and uncompressed; failures after the first
//! bytes become explicit error events; a caller that leaves cancels the upstream call.

use std::time::Duration;

use futures_util::StreamExt;
use legate::sse::SseParser;
use tokio::time::Instant;

use crate::harness;

const STREAM_BODY: &str = r#"{"model":"claude-s","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// Reads a whole SSE response, noting when each event completed at the client.
async fn read_events(resp: reqwest::Response) -> Vec<(Instant, Option<String>, String)> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else { break };
        let now = Instant::now();
        parser.push(&chunk);
        while let Some(ev) = parser.next_event() {
            out.push((now, ev.event, ev.data));
        }
    }
    out
}

#[tokio::test]
async fn events_spaced_upstream_arrive_spaced_at_the_client() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"event_gap_ms":200,"content":[{"type":"text","text":"one two three four"}]}}"#,
        )
        .unwrap(),
        "",
    )
    .await;
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .header("accept-encoding", "gzip, deflate")
        .body(STREAM_BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("content-encoding").is_none());
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = read_events(resp).await;
    let names: Vec<&str> = events.iter().filter_map(|e| e.1.as_deref()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert!(names.contains(&"ping"), "pings pass through: {names:?}");
    assert!(events.len() >= 6);
    // The preamble (message_start, ping, content_block_start) is held until the first content
    // event, the commit point; from there on every event is forwarded as it comes.
    let first_content = events
        .iter()
        .position(|e| e.1.as_deref() == Some("content_block_delta"))
        .unwrap();
    for pair in events[first_content..].windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= Duration::from_millis(150),
            "events arrived together ({gap:?} apart): {:?} then {:?}",
            pair[0].1,
            pair[1].1
        );
    }
}

#[tokio::test]
async fn a_stream_cut_after_content_ends_with_an_explicit_error_event() {
    let env = harness::start_with(
        legate::mock::Script::from_json(r#"{"default":{"cut_after":5}}"#).unwrap(),
        "",
    )
    .await;
    let resp = env.messages(STREAM_BODY).await;
    assert_eq!(resp.status(), 200);
    let events = read_events(resp).await;
    let names: Vec<&str> = events.iter().filter_map(|e| e.1.as_deref()).collect();
    assert!(!names.contains(&"message_stop"));
    assert_eq!(names.last(), Some(&"error"), "{names:?}");
    let err: serde_json::Value = serde_json::from_str(&events.last().unwrap().2).unwrap();
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "api_error");
}

#[tokio::test]
async fn an_upstream_error_event_passes_through_unchanged() {
    let env = harness::start_with(
        legate::mock::Script::from_json(r#"{"default":{"stream_error_after":4}}"#).unwrap(),
        "",
    )
    .await;
    let events = read_events(env.messages(STREAM_BODY).await).await;
    let errors: Vec<_> = events
        .iter()
        .filter(|e| e.1.as_deref() == Some("error"))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "exactly the provider's error event, not a second one"
    );
    let err: serde_json::Value = serde_json::from_str(&errors[0].2).unwrap();
    assert_eq!(err["error"]["type"], "overloaded_error");
}

#[tokio::test]
async fn a_stalled_stream_hits_the_idle_timeout() {
    let mock = harness::start_mock(
        legate::mock::Script::from_json(r#"{"default":{"hang_after":4}}"#).unwrap(),
    )
    .await;
    let toml = harness::config_toml(&mock.base_url(), "")
        .replace("idle_timeout = \"5s\"", "idle_timeout = \"300ms\"");
    let env = harness::start_toml(mock, &toml).await;
    let events = read_events(env.messages(STREAM_BODY).await).await;
    assert_eq!(events.last().and_then(|e| e.1.as_deref()), Some("error"));
    env.mock.wait_cancelled(1).await;
}

#[tokio::test]
async fn openai_stream_passes_done_and_meters_the_usage_chunk() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"usage":{"input_tokens":11,"output_tokens":7,"cache_read_input_tokens":4}}}"#,
        )
        .unwrap(),
        "",
    )
    .await;
    let body = r#"{"model":"gpt-s","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let events = read_events(env.chat(body).await).await;
    assert_eq!(events.last().map(|e| e.2.as_str()), Some("[DONE]"));
    let labels = |kind| [("provider", "openai"), ("kind", kind)];
    assert_eq!(
        env.metric("legate_tokens_total", &labels("input")).await,
        Some(11.0)
    );
    assert_eq!(
        env.metric("legate_tokens_total", &labels("cache_read"))
            .await,
        Some(4.0)
    );
    assert_eq!(
        env.metric("legate_tokens_total", &labels("output")).await,
        Some(7.0)
    );
}

#[tokio::test]
async fn a_caller_leaving_mid_stream_cancels_the_upstream_and_counts_499() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"event_gap_ms":100,"content":[{"type":"text","text":"a b c d e f g h i j k l m n o p"}]}}"#,
        )
        .unwrap(),
        "",
    )
    .await;
    let resp = env.messages(STREAM_BODY).await;
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(stream);
    env.mock.wait_cancelled(1).await;
    let n = env
        .metric(
            "legate_requests_total",
            &[("api", "anthropic"), ("status", "499")],
        )
        .await;
    assert_eq!(n, Some(1.0));
    assert_eq!(
        env.metric("legate_inflight_requests", &[("provider", "anthropic")])
            .await,
        Some(0.0)
    );
}

#[tokio::test]
async fn a_caller_leaving_before_headers_cancels_the_upstream_and_counts_499() {
    let env = harness::start_with(
        legate::mock::Script::from_json(r#"{"default":{"hang":true}}"#).unwrap(),
        "",
    )
    .await;
    let call = tokio::spawn({
        let http = env.http.clone();
        let url = env.url("/v1/messages");
        async move {
            let _ = http
                .post(url)
                .header("anthropic-version", "2023-06-01")
                .body(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
                .send()
                .await;
        }
    });
    env.mock.wait_requests(1).await;
    call.abort();
    env.mock.wait_cancelled(1).await;
    let n = env
        .metric("legate_requests_total", &[("status", "499")])
        .await;
    assert_eq!(n, Some(1.0));
    // A caller leaving is never an upstream failure.
    let failures = env
        .metric(
            "legate_upstream_attempts_total",
            &[("outcome", "connect_error")],
        )
        .await;
    assert_eq!(failures, None);
}

/// legate (providers' `idle_timeout` `idle`) in front of a provider that answers every
/// request with `events` as one chunk of a chunked body whose last chunk never comes.
async fn held_open(events: String, idle: &str) -> (crate::rawup::RawUpstream, harness::Env) {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n",
        events.len()
    );
    let up = crate::rawup::start(move |_| {
        let head = head.clone().into_bytes();
        async move { crate::rawup::Action::ReplyAndHang(head) }
    })
    .await;
    let toml = harness::config_toml_with(&up.url, "", "", "").replace(
        "idle_timeout = \"5s\"",
        &format!("idle_timeout = \"{idle}\""),
    );
    let env = harness::start_alone(&toml).await;
    (up, env)
}

/// A caller that closes its connection at the stream's final event (the OpenAI SDKs stop at
/// `[DONE]`) has its whole answer: the request is recorded as served (200) and the breaker
/// hears a success, even when the provider's body has not ended behind that event yet.
#[tokio::test]
async fn a_caller_that_leaves_at_done_is_served_not_gone() {
    let (_up, env) = held_open(crate::rawup::chat_stream_hi(), "5s").await;
    let resp = env
        .chat(r#"{"model":"gpt-d","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    while !got.ends_with(b"data: [DONE]\n\n") {
        got.extend_from_slice(&stream.next().await.unwrap().unwrap());
    }
    // The caller is done, and leaves.
    drop(stream);
    env.wait_metric("legate_requests_total", &[("status", "200")], 1.0)
        .await;
    assert_eq!(
        env.metric("legate_requests_total", &[("status", "499")])
            .await,
        None
    );
}

/// A provider that ends its stream with an error event after content, and then holds its
/// body open, failed the request however the connection ends: the caller leaving once it has
/// the error, or legate ending the stream at `idle_timeout`. Both count 502, as a clean end
/// of the body after the error event does.
#[tokio::test]
async fn a_provider_error_event_after_content_counts_502_however_the_stream_ends() {
    let content = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_e\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-e\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
    ]
    .concat();
    let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let chunk = |events: &str| format!("{:x}\r\n{events}\r\n", events.len()).into_bytes();
    for leaves in [true, false] {
        // The content first; the error event once the caller has it (after the commit point),
        // and then the body held open: its last chunk never comes.
        let (go, gate) = tokio::sync::oneshot::channel();
        let gate = std::sync::Mutex::new(Some(gate));
        let mut first = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        first.extend_from_slice(&chunk(&content));
        let second = chunk(error);
        let up = crate::rawup::start(move |_| {
            let action = match gate.lock().unwrap().take() {
                Some(gate) => crate::rawup::Action::ReplyInTwo(first.clone(), gate, second.clone()),
                None => crate::rawup::Action::Close,
            };
            async move { action }
        })
        .await;
        let toml = harness::config_toml_with(&up.url, "", "", "")
            .replace("idle_timeout = \"5s\"", "idle_timeout = \"200ms\"");
        let env = harness::start_alone(&toml).await;
        let resp = env.messages(STREAM_BODY).await;
        assert_eq!(resp.status(), 200);
        let mut stream = resp.bytes_stream();
        let mut got = Vec::new();
        while !got.windows(2).any(|w| w == b"Hi") {
            got.extend_from_slice(&stream.next().await.unwrap().unwrap());
        }
        go.send(()).unwrap();
        if leaves {
            while !got.windows(12).any(|w| w == b"event: error") {
                got.extend_from_slice(&stream.next().await.unwrap().unwrap());
            }
            drop(stream);
        } else {
            while let Some(Ok(chunk)) = stream.next().await {
                got.extend_from_slice(&chunk);
            }
            let text = String::from_utf8(got).unwrap();
            // One error event, the provider's: legate adds none after it.
            assert_eq!(text.matches("event: error").count(), 1, "{text}");
        }
        env.wait_metric("legate_requests_total", &[("status", "502")], 1.0)
            .await;
        assert_eq!(
            env.metric("legate_requests_total", &[("status", "200")])
                .await,
            None,
            "leaves: {leaves}"
        );
    }
}

/// A stream whose final event came, and whose provider then holds its body open, is whole: it
/// ends at its final event, without an error event after it (an SDK reading to the end would
/// raise on it), counted as served, not 502. It ended only at `idle_timeout` (60 s by
/// default), and an SDK's stream helper waited that long for the end.
#[tokio::test]
async fn a_body_held_open_after_the_final_event_ends_the_stream_cleanly() {
    let events = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_h\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-h\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ]
    .concat();
    let (_up, env) = held_open(events, "60s").await;
    let resp = env.messages(STREAM_BODY).await;
    assert_eq!(resp.status(), 200);
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), resp.text())
        .await
        .expect("the stream ends at its final event, not at idle_timeout")
        .unwrap();
    assert!(
        got.ends_with("data: {\"type\":\"message_stop\"}\n\n"),
        "{got}"
    );
    assert!(!got.contains("event: error"), "{got}");
    env.wait_metric("legate_requests_total", &[("status", "200")], 1.0)
        .await;
    assert_eq!(
        env.metric("legate_requests_total", &[("status", "502")])
            .await,
        None
    );
}

#[tokio::test]
async fn a_stream_ended_by_shutdown_is_legates_doing_not_the_providers() {
    // Still open when shutdown_grace runs out: the caller gets an error event, and the request
    // is counted 503 shutting_down, not as the provider's 502 (rolling deploys would read as
    // provider failures), and its breaker hears nothing.
    let mock = harness::start_mock(
        legate::mock::Script::from_json(
            r#"{"default":{"event_gap_ms":300,"content":[{"type":"text","text":"a b c d e f g h i j k l"}]}}"#,
        )
        .unwrap(),
    )
    .await;
    let toml = harness::config_toml(&mock.base_url(), "")
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"200ms\"");
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .messages(r#"{"model":"claude-s","max_tokens":9,"stream":true,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    let harness::Env {
        legate, registry, ..
    } = env;
    let stopping = tokio::spawn(legate.shutdown());
    while let Some(Ok(chunk)) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    stopping.await.unwrap();
    assert!(text.contains("event: error"), "{text}");
    assert!(text.contains("shutdown_grace"), "{text}");
    let metrics = legate::telemetry::render(&registry);
    let count = |status: &str| {
        harness::metric_value(&metrics, "legate_requests_total", &[("status", status)])
    };
    assert_eq!(count("503"), Some(1.0), "{metrics}");
    assert_eq!(count("502"), None);
    assert_eq!(
        harness::metric_value(
            &metrics,
            "legate_breaker_state",
            &[("provider", "anthropic")]
        ),
        None,
        "{metrics}"
    );
}

/// vLLM refuses a streamed request with its error object as the stream's first chunk
/// (`{"object":"error","type":"BadRequestError","code":400}`): the caller gets the refusal's
/// 400, once. It was read as no error at all, the stream as ending before its first content:
/// a 502, retried three times.
#[tokio::test]
async fn a_vllm_error_chunk_before_content_is_its_refusal() {
    let events = "data: {\"object\":\"error\",\"message\":\"max_tokens is too large\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}\n\n";
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{events}",
        events.len()
    );
    let (env, up) = crate::rawup::behind(reply.into_bytes()).await;
    let resp = env
        .chat(r#"{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["message"], "max_tokens is too large", "{v}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A provider that writes its body's end right after its last event, in a write of its own
/// (uvicorn, Go's net/http): the stream waits for that end, and the connection serves the
/// next stream. Ending at the final event without it closed the connection every time.
#[tokio::test]
async fn a_body_end_written_after_the_final_event_keeps_the_connection() {
    let events = crate::rawup::chat_stream_hi();
    let up = crate::rawup::start(move |_| {
        let action = crate::rawup::paced_chunks(&[&events]);
        async move { action }
    })
    .await;
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", "")).await;
    for _ in 0..2 {
        let resp = env
            .chat(r#"{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
            .await;
        assert_eq!(resp.status(), 200);
        assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    }
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A Responses stream that fails sends `error` and then `response.failed`, which the SDKs'
/// stream helpers end on; when the second comes in a write of its own, the caller still gets
/// it. Ending the stream at the error event dropped it.
#[tokio::test]
async fn a_responses_error_event_is_followed_by_its_response_failed() {
    let created = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n";
    let delta = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n";
    let error = "event: error\ndata: {\"type\":\"error\",\"sequence_number\":2,\"code\":\"server_error\",\"message\":\"boom\",\"param\":null}\n\n";
    let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"failed\",\"output\":[],\"error\":{\"code\":\"server_error\",\"message\":\"boom\"}}}\n\n";
    let up = crate::rawup::start(move |_| {
        let action = crate::rawup::paced_chunks(&[&[created, delta].concat(), error, failed]);
        async move { action }
    })
    .await;
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", "")).await;
    let resp = env
        .responses(r#"{"model":"gpt-x","stream":true,"input":"hi"}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let got = resp.text().await.unwrap();
    assert!(got.contains("event: error"), "{got}");
    assert!(got.ends_with(failed), "{got}");
}
