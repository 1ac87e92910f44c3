//! Model names as agents send them: dated snapshots matched by `*` patterns (routing, prices,
//! labels), one model looked up by id, over-long names, and clients that retry on their own.

use serde_json::{Value, json};

use crate::harness;

const PATTERNS: &str = r#"
[[models]]
name = "claude-*"
chain = ["openai:gpt-4o-mini"]

[[models]]
name = "claude-haiku-4-5*"
chain = ["anthropic:*"]

[[models]]
name = "large"
chain = ["anthropic:claude-sonnet-4-5"]

[[prices]]
model = "anthropic:claude-haiku-4-5*"
input = "1"
output = "5"
"#;

fn ask(model: &str) -> String {
    json!({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
}

#[tokio::test]
async fn the_most_specific_pattern_routes_a_dated_snapshot() {
    let env = harness::start(PATTERNS).await;
    let resp = env.messages(ask("claude-haiku-4-5-20251001")).await;
    assert_eq!(resp.status(), 200);
    // `anthropic:*` keeps the caller's model name.
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-haiku-4-5-20251001"
    );
    let resp = env.messages(ask("claude-opus-4-5-20251101")).await;
    assert_eq!(resp.headers()["x-legate-served-by"], "openai:gpt-4o-mini");
    let paths: Vec<String> = env.mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/messages", "/v1/chat/completions"]);
}

#[tokio::test]
async fn a_dated_snapshot_is_priced_and_labelled_by_its_pattern() {
    let env = harness::start(PATTERNS).await;
    let resp = env.messages(ask("claude-haiku-4-5-20251001")).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await;
    // The mock reports 10 input and 5 output tokens: 10 × 1 + 5 × 5 USD per million.
    let cost = env
        .metric(
            "legate_cost_usd_total",
            &[("model", "claude-haiku-4-5*"), ("provider", "anthropic")],
        )
        .await
        .unwrap();
    assert!((cost - 0.000035).abs() < 1e-12, "{cost}");
    let requests = env
        .metric("legate_requests_total", &[("model", "claude-haiku-4-5*")])
        .await;
    assert_eq!(requests, Some(1.0));
    let doc = env.admin_json("/admin/usage").await;
    let spent = &doc["tenants"]["default"]["anthropic:claude-haiku-4-5-20251001"];
    assert_eq!(spent["cost_pico_usd"], "35000000");
}

#[tokio::test]
async fn one_model_is_answered_in_the_callers_shape() {
    let env = harness::start(PATTERNS).await;
    let get = |path: &str, anthropic: bool| {
        let mut req = env.http.get(env.url(path));
        if anthropic {
            req = req.header("anthropic-version", "2023-06-01");
        }
        req.send()
    };
    let resp = get("/v1/models/large", true).await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "model");
    assert_eq!(v["id"], "large");
    assert!(v.get("object").is_none());
    let resp = get("/v1/models/claude-haiku-4-5-20251001", false)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v,
        json!({"id": "claude-haiku-4-5-20251001", "object": "model",
        "created": 0, "owned_by": "legate"})
    );
    let resp = get("/v1/models/gpt-unknown", true).await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "not_found_error");
    let resp = get("/v1/models/gpt-unknown", false).await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(env.mock.requests().is_empty());
}

#[tokio::test]
async fn model_names_longer_than_256_bytes_are_refused() {
    let env = harness::start("").await;
    let resp = env.messages(ask(&"m".repeat(257))).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(env.messages(ask(&"m".repeat(256))).await.status(), 200);
    assert_eq!(env.mock.requests().len(), 1);
}

#[tokio::test]
async fn requests_a_client_retried_itself_are_counted() {
    let env = harness::start("").await;
    for count in ["0", "2", "1"] {
        let resp = env
            .http
            .post(env.url("/v1/chat/completions"))
            .header("x-stainless-retry-count", count)
            .header("content-type", "application/json")
            .body(
                json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let counted = env
        .metric(
            "legate_client_retries_total",
            &[("api", "openai"), ("tenant", "default")],
        )
        .await;
    assert_eq!(counted, Some(2.0));
}
