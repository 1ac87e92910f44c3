//! An upstream that echoes the provider key it was sent never hands it to the caller (SPEC
//! §14): not in final or retried error bodies, not in 200 bodies or streams, not in passed-back
//! headers.

use std::sync::Mutex;

use crate::harness::{self, ANTHROPIC_KEY, OPENAI_KEY};
use crate::rawup::{self, Action};

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(ANTHROPIC_KEY) && !text.contains(OPENAI_KEY),
        "{what} carries the key: {text}"
    );
}

async fn check(resp: reqwest::Response, want_status: u16) -> String {
    assert_eq!(resp.status(), want_status);
    for (name, value) in resp.headers() {
        assert_clean(name.as_str(), &String::from_utf8_lossy(value.as_bytes()));
    }
    let echo = resp
        .headers()
        .get("x-echo")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(echo.as_deref(), Some("Bearer [redacted]"));
    let body = resp.text().await.unwrap();
    assert_clean("the body", &body);
    body
}

#[tokio::test]
async fn keys_echoed_in_errors_bodies_streams_and_headers_are_redacted() {
    let k = ANTHROPIC_KEY;
    let script = format!(
        r#"{{"replies":[
            {{"status":401,"error_message":"invalid x-api-key {k}","headers":{{"x-echo":"Bearer {k}"}}}},
            {{"times":2,"status":500,"error_message":"boom for {k}","headers":{{"x-echo":"Bearer {k}"}}}},
            {{"content":[{{"type":"text","text":"you sent {k}"}}],"headers":{{"x-echo":"Bearer {k}"}}}},
            {{"content":[{{"type":"text","text":"{k}{k}{k}"}}],"headers":{{"x-echo":"Bearer {k}"}}}}
        ]}}"#
    );
    let env = harness::start_with(
        legate::mock::Script::from_json(&script).unwrap(),
        "[retry]\nmax_attempts = 2\nbase_delay = \"1ms\"\nmax_delay = \"2ms\"\n",
    )
    .await;
    let body = r#"{"model":"claude-e","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let final_error = check(env.messages(body).await, 401).await;
    assert!(
        final_error.contains("invalid x-api-key [redacted]"),
        "{final_error}"
    );
    let after_retries = check(env.messages(body).await, 500).await;
    assert!(
        after_retries.contains("boom for [redacted]"),
        "{after_retries}"
    );
    let ok = check(env.messages(body).await, 200).await;
    assert!(ok.contains("you sent [redacted]"), "{ok}");
    let stream = r#"{"model":"claude-e","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let events = check(env.messages(stream).await, 200).await;
    assert!(
        events.contains("[redacted]") && events.contains("message_stop"),
        "{events}"
    );
    assert_eq!(env.mock.stats().requests, 5);
}

/// An answer too large to hold whole (over 16 MiB) is forwarded piece by piece; a key its
/// upstream splits across two writes is still found: the caller gets everything before the
/// key's start while the upstream waits, and the key never.
#[tokio::test]
async fn a_key_split_across_chunks_of_a_large_answer_is_redacted() {
    let k = ANTHROPIC_KEY;
    let pad = "x".repeat(17 << 20);
    let body = format!(
        r#"{{"id":"msg_1","type":"message","role":"assistant","model":"claude-r","content":[{{"type":"text","text":"{pad} you sent {k}"}}],"stop_reason":"end_turn","usage":{{"input_tokens":1,"output_tokens":1}}}}"#
    );
    let key_at = body.find(k).unwrap();
    let cut = key_at + k.len() / 2;
    let (go_tx, go_rx) = tokio::sync::oneshot::channel();
    let go = Mutex::new(Some(go_rx));
    let reply = rawup::json_reply(&body);
    let head_len = reply.len() - body.len();
    let up = rawup::start(move |_req| {
        let go = go.lock().unwrap().take().expect("one request");
        let (first, second) = reply.split_at(head_len + cut);
        let action = Action::ReplyInTwo(first.to_vec(), go, second.to_vec());
        async move { action }
    })
    .await;
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", "")).await;
    let req = r#"{"model":"claude-r","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut resp = env.messages(req).await;
    assert_eq!(resp.status(), 200);
    let mut got = Vec::with_capacity(body.len());
    while got.len() < key_at {
        let c = resp.chunk().await.unwrap().expect("more of the body");
        got.extend_from_slice(&c);
    }
    // Up to the key's start, and not a byte of the key while its second half is unsent.
    assert_eq!(got.len(), key_at);
    go_tx.send(()).unwrap();
    while let Some(c) = resp.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert!(
        got == body.replace(k, "[redacted]").as_bytes(),
        "the body differs"
    );
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

const ASK: &str =
    r#"{"model":"claude-c","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

/// legate asks for `accept-encoding: identity`. An answer compressed anyway (an error that
/// echoes the key, gzipped) could be neither metered nor cleared of the key, so it is not
/// passed on: after the retries, 502 `upstream_answer_unusable`, and none of its bytes. The
/// same for a body in a transfer coding besides chunked.
#[tokio::test]
async fn answers_in_a_coding_legate_did_not_ask_for_are_not_passed_on() {
    let opaque = format!("\x1f\x08 compressed bytes around {ANTHROPIC_KEY}");
    let cases = [
        format!(
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n{opaque}",
            opaque.len()
        ),
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: gzip, chunked\r\n\r\n{:x}\r\n{opaque}\r\n0\r\n\r\n",
            opaque.len()
        ),
    ];
    for reply in cases {
        let (env, up) = rawup::behind(reply.into_bytes()).await;
        let resp = env.messages(ASK).await;
        assert_eq!(resp.status(), 502);
        let body = resp.text().await.unwrap();
        assert!(body.contains("compressed or in another coding"), "{body}");
        assert!(!body.contains("compressed bytes"), "{body}");
        assert_clean("the body", &body);
        assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}

/// A header whose name holds the key (an upstream's rate-limit header named after it) is not
/// passed on: names reach the caller lower-cased, so the key is looked for in any case.
#[tokio::test]
async fn a_key_in_a_passed_back_header_name_is_not_passed_on() {
    let body = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-c","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}"#;
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nanthropic-ratelimit-requests-remaining: 7\r\nx-ratelimit-remaining-{ANTHROPIC_KEY}: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (env, _up) = rawup::behind(reply.into_bytes()).await;
    let resp = env.messages(ASK).await;
    assert_eq!(resp.status(), 200);
    let lower = ANTHROPIC_KEY.to_ascii_lowercase();
    for name in resp.headers().keys() {
        assert!(!name.as_str().contains(&lower), "{name} passed on");
    }
    assert_eq!(
        resp.headers()["anthropic-ratelimit-requests-remaining"],
        "7",
        "the other rate-limit headers still are"
    );
}

/// The small endpoints forwarded as they are (a stored response fetched from the provider)
/// are cleared of the key too, in the body and in header values.
#[tokio::test]
async fn a_key_echoed_by_a_forwarded_responses_endpoint_is_redacted() {
    let k = OPENAI_KEY;
    let body = format!(
        r#"{{"error":{{"message":"no response for key {k}","type":"invalid_request_error"}}}}"#
    );
    let reply = format!(
        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nx-echo: Bearer {k}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (env, up) = rawup::behind(reply.into_bytes()).await;
    let resp = env
        .http
        .get(env.url("/v1/responses/resp_elsewhere"))
        .send()
        .await
        .unwrap();
    let text = check(resp, 404).await;
    assert!(text.contains("no response for key [redacted]"), "{text}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}
