//! An upstream that echoes the provider key it was sent never hands it to the caller (SPEC
//! §14): not in final or retried error bodies, not in 200 bodies or streams, not in passed-back
//! headers.

use crate::harness::{self, ANTHROPIC_KEY, OPENAI_KEY};

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
