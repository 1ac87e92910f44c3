//! Usage read from responses and streams, normalised, priced in exact pico-dollars, and visible
//! in /metrics and /admin/usage.

use crate::harness;

const PRICES: &str = r#"
[[prices]]
model = "anthropic:claude-priced"
input = "3"
output = "15"
cache_write = "3.75"
cache_read = "0.30"
"#;

const USAGE: &str = r#"{"input_tokens":1000,"output_tokens":200,"cache_read_input_tokens":5000,"cache_creation_input_tokens":100}"#;

// 1000*3 + 200*15 + 5000*0.30 + 100*3.75 micro-USD... per token in pico: exact.
const EXPECTED_PICO: &str = "7875000000";

async fn usage_doc(env: &harness::Env) -> serde_json::Value {
    env.admin_json("/admin/usage").await
}

#[tokio::test]
async fn non_streaming_usage_is_metered_and_priced_exactly() {
    let env = harness::start_with(
        legate::mock::Script::from_json(&format!(r#"{{"default":{{"usage":{USAGE}}}}}"#)).unwrap(),
        PRICES,
    )
    .await;
    let resp = env
        .messages(r#"{"model":"claude-priced","max_tokens":300,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    let labels = |kind| {
        [
            ("tenant", "default"),
            ("model", "claude-priced"),
            ("kind", kind),
        ]
    };
    assert_eq!(
        env.metric("legate_tokens_total", &labels("input")).await,
        Some(1000.0)
    );
    assert_eq!(
        env.metric("legate_tokens_total", &labels("output")).await,
        Some(200.0)
    );
    assert_eq!(
        env.metric("legate_tokens_total", &labels("cache_read"))
            .await,
        Some(5000.0)
    );
    assert_eq!(
        env.metric("legate_tokens_total", &labels("cache_write"))
            .await,
        Some(100.0)
    );
    let cost = env
        .metric("legate_cost_usd_total", &[("model", "claude-priced")])
        .await
        .unwrap();
    assert!((cost - 0.007875).abs() < 1e-12, "{cost}");
    let doc = usage_doc(&env).await;
    let e = &doc["tenants"]["default"]["anthropic:claude-priced"];
    assert_eq!(e["cost_pico_usd"], EXPECTED_PICO);
    assert_eq!(e["cost_usd"], "0.007875");
    assert_eq!(e["input_tokens"], 1000);
    assert_eq!(e["requests"], 1);
}

#[tokio::test]
async fn stream_usage_comes_from_message_start_and_the_final_message_delta() {
    let env = harness::start_with(
        legate::mock::Script::from_json(&format!(r#"{{"default":{{"usage":{USAGE}}}}}"#)).unwrap(),
        PRICES,
    )
    .await;
    let resp = env
        .messages(r#"{"model":"claude-priced","max_tokens":300,"stream":true,"messages":[]}"#)
        .await;
    let text = resp.text().await.unwrap();
    assert!(text.contains("message_stop"));
    let doc = usage_doc(&env).await;
    let e = &doc["tenants"]["default"]["anthropic:claude-priced"];
    assert_eq!(e["input_tokens"], 1000);
    assert_eq!(
        e["output_tokens"], 200,
        "running totals, not a sum of deltas"
    );
    assert_eq!(e["cache_read_tokens"], 5000);
    assert_eq!(e["cache_write_tokens"], 100);
    assert_eq!(e["cost_pico_usd"], EXPECTED_PICO);
    let ttft = env
        .metric(
            "legate_time_to_first_token_seconds_count",
            &[("provider", "anthropic")],
        )
        .await;
    assert_eq!(ttft, Some(1.0));
}

#[tokio::test]
async fn requests_are_counted_with_bounded_labels() {
    let env = harness::start(PRICES).await;
    let _ = env
        .messages(r#"{"model":"claude-priced","max_tokens":1,"messages":[]}"#)
        .await
        .bytes()
        .await;
    let _ = env
        .messages(r#"{"model":"some-unlisted-model","max_tokens":1,"messages":[]}"#)
        .await
        .bytes()
        .await;
    let _ = env.messages("nope").await.bytes().await;
    let count = |model, status| {
        let env = &env;
        async move {
            env.metric(
                "legate_requests_total",
                &[
                    ("api", "anthropic"),
                    ("model", model),
                    ("tenant", "default"),
                    ("status", status),
                ],
            )
            .await
        }
    };
    assert_eq!(count("claude-priced", "200").await, Some(1.0));
    assert_eq!(count("other", "200").await, Some(1.0));
    assert_eq!(count("other", "400").await, Some(1.0));
    let text = env.metrics_text().await;
    assert!(!text.contains("some-unlisted-model"));
    assert!(text.contains("legate_build_info{version=\""));
    assert_eq!(
        env.metric(
            "legate_request_duration_seconds_count",
            &[("api", "anthropic")]
        )
        .await,
        Some(3.0)
    );
    assert_eq!(
        env.metric("legate_upstream_attempts_total", &[("outcome", "ok")])
            .await,
        Some(2.0)
    );
}

/// A served request whose provider reported no usage (a compatible server that ignores
/// `include_usage`, or leaves `usage` out of a whole answer) is still a request in the ledger,
/// with no tokens or cost: it was left out, so /admin/usage read fewer requests than the
/// journal and `legate_requests_total`.
#[tokio::test]
async fn a_request_served_without_reported_usage_counts_in_the_ledger() {
    let events = crate::rawup::chat_stream_hi();
    let stream = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{events}",
        events.len()
    );
    let whole = r#"{"id":"chatcmpl-w","object":"chat.completion","created":1,"model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}"#;
    let whole = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{whole}",
        whole.len()
    );
    let up = crate::rawup::start(move |req| {
        let asked: &[u8] = b"\"stream\":true";
        let reply = if req.body.windows(asked.len()).any(|w| w == asked) {
            stream.clone()
        } else {
            whole.clone()
        };
        async move { crate::rawup::Action::Reply(reply.into_bytes()) }
    })
    .await;
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", "")).await;
    let streamed = env
        .chat(r#"{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(streamed.status(), 200);
    assert!(streamed.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    let answered = env
        .chat(r#"{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(answered.status(), 200);
    let _ = answered.bytes().await.unwrap();
    env.wait_metric("legate_requests_total", &[("status", "200")], 2.0)
        .await;
    let doc = usage_doc(&env).await;
    let entry = &doc["tenants"]["default"]["openai:gpt-x"];
    assert_eq!(entry["requests"], 2, "{doc}");
    assert_eq!(entry["input_tokens"], 0, "{doc}");
    assert_eq!(entry["cost_pico_usd"], "0", "{doc}");
}

/// A caller that leaves before a stream's first content (an agent's cancel while the model
/// thinks over a long prompt) still has what the provider reported metered: the input tokens
/// of its `message_start`, which the provider bills.
#[tokio::test]
async fn a_caller_leaving_before_the_first_content_is_metered_what_was_reported() {
    let start = r#"{"type":"message_start","message":{"id":"msg_r","type":"message","role":"assistant","model":"claude-r","content":[],"stop_reason":null,"usage":{"input_tokens":7,"output_tokens":1}}}"#;
    let event = format!("event: message_start\ndata: {start}\n\n");
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
        event.len()
    );
    // The answer's first event, and then nothing until legate goes away.
    let up = crate::rawup::start(move |_req| {
        let reply = head.clone().into_bytes();
        async move { crate::rawup::Action::ReplyAndHang(reply) }
    })
    .await;
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", "")).await;
    let url = env.url("/v1/messages");
    let caller = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .header("x-api-key", "dummy-client-key")
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(r#"{"model":"claude-r","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
            .send()
            .await
    });
    // The answer's head came (its first event with it, in the same write): then the caller
    // leaves.
    env.wait_metric("legate_upstream_duration_seconds_count", &[], 1.0)
        .await;
    caller.abort();
    env.wait_metric("legate_tokens_total", &[("kind", "input")], 7.0)
        .await;
    env.wait_metric("legate_requests_total", &[("status", "499")], 1.0)
        .await;
}

/// A translated whole answer whose provider reported no usage (an OpenAI-compatible server
/// that leaves it out, or sends null) is metered as unreported: the request keeps its
/// reservation, as the same answer relayed untranslated does. Metered off legate's own
/// translation, whose usage reads zero where none came, it was a free answer with its whole
/// reservation refunded. A usage the translation cannot read (a negative count) is no reason
/// to refuse the answer.
#[tokio::test]
async fn a_translated_answer_without_usage_keeps_its_reservation() {
    for usage in [
        "",
        r#","usage":null"#,
        r#","usage":{"prompt_tokens":-5,"completion_tokens":3}"#,
    ] {
        let body = format!(
            r#"{{"id":"c1","object":"chat.completion","created":1,"model":"gpt-x","choices":[{{"index":0,"message":{{"role":"assistant","content":"hello"}},"finish_reason":"stop"}}]{usage}}}"#
        );
        let env = harness::start_with(
            legate::mock::Script::from_json(&format!(r#"{{"default":{{"body":{body}}}}}"#))
                .unwrap(),
            "[tenants.default]\ntokens_per_minute = 1000\n\n[[models]]\nname = \"gpt-x\"\nchain = [\"openai:gpt-x\"]\n",
        )
        .await;
        let ask =
            r#"{"model":"gpt-x","max_tokens":900,"messages":[{"role":"user","content":"hi"}]}"#;
        let first = env.messages(ask).await;
        assert_eq!(first.status(), 200, "{usage}");
        let answer: serde_json::Value = first.json().await.unwrap();
        assert_eq!(answer["content"][0]["text"], "hello", "{usage}");
        // The reservation (about 905 tokens of 1000) stands: the next one waits.
        assert_eq!(env.messages(ask).await.status(), 429, "{usage}");
        assert_eq!(env.mock.stats().requests, 1, "{usage}");
        assert_eq!(
            env.metric("legate_tokens_total", &[("kind", "input")])
                .await,
            None,
            "{usage}"
        );
    }
}

/// A forwarded token count is no generation: the ledger's requests count generations only
/// (Claude Code counts tokens before most turns, and each count was a request of its model).
#[tokio::test]
async fn a_forwarded_token_count_is_not_a_request_in_the_ledger() {
    let env = harness::start_with(legate::mock::Script::default(), PRICES).await;
    let resp = env
        .http
        .post(env.url("/v1/messages/count_tokens"))
        .header("x-api-key", "caller-key")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(r#"{"model":"claude-priced","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-legate-estimate").is_none());
    let _ = resp.bytes().await.unwrap();
    assert_eq!(env.mock.requests().len(), 1, "forwarded");
    env.wait_metric("legate_requests_total", &[("status", "200")], 1.0)
        .await;
    let doc = usage_doc(&env).await;
    assert_eq!(doc["tenants"], serde_json::json!({}), "{doc}");
}
