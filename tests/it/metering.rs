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
