//! The access log of the real binary: one JSON line per finished request on stderr, with every
//! field of SPEC §12, for a served request, a fallback, a local 429, a caller that went away
//! (499) and a translated request; other lines of a request carry its request id; no key ever.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use crate::harness::start_mock;
use crate::harness::{addrs, spawn};

const FIELDS: &[&str] = &[
    "request_id",
    "tenant",
    "api",
    "method",
    "path",
    "model",
    "served_by",
    "attempts",
    "status",
    "error_type",
    "priority",
    "duration_ms",
    "ttft_ms",
    "overhead_ms",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost_pico_usd",
    "client_retry",
    "estimate_error",
];

const PROVIDER_CANARY: &str = "sk-ant-CANARY-access-77c1";
const CLIENT_CANARY: &str = "client-CANARY-access-90ab";

/// Every JSON line of the log so far.
fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The access line of `rid`, waiting (at most 10 s) for the request to be reported.
async fn access(path: &Path, rid: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = lines(path)
            .into_iter()
            .find(|l| l["target"] == "legate::access" && l["request_id"] == rid);
        if let Some(l) = found {
            for f in FIELDS {
                assert!(l.get(*f).is_some(), "field {f} missing: {l}");
            }
            return l;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no access line for {rid}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_request_gets_one_structured_access_line() {
    let mock = start_mock(
        legate::mock::Script::from_json(
            r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":529},
                          {"match":{"model":"claude-slow"},"times":0,"event_gap_ms":200,"content":[{"type":"text","text":"a b c d e f g h"}]}]}"#,
        )
        .unwrap(),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("legate.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[providers.anthropic]
kind = "anthropic"
base_url = "{url}"
api_key_env = "ANTHROPIC_API_KEY"
[providers.openai]
kind = "openai"
base_url = "{url}"
api_key_env = "OPENAI_API_KEY"
[retry]
base_delay = "10ms"
max_delay = "20ms"
max_attempts = 1
[tenants.default]
requests_per_minute = 5
[[models]]
name = "large"
chain = ["anthropic:claude-primary", "anthropic:claude-secondary"]
[[models]]
name = "gpt-via-claude"
chain = ["anthropic:claude-backend"]
"#,
            url = mock.base_url()
        ),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let (mut child, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[
            ("ANTHROPIC_API_KEY", PROVIDER_CANARY),
            ("OPENAI_API_KEY", PROVIDER_CANARY),
        ],
        Some(&log),
    )
    .await;
    let (data, _admin) = addrs(&line);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let post = |path: &str, body: &str| {
        http.post(format!("{data}{path}"))
            .header("x-api-key", CLIENT_CANARY)
            .header("anthropic-version", "2023-06-01")
            .header("x-stainless-retry-count", "2")
            .body(body.to_string())
    };
    let rid = |r: &reqwest::Response| {
        r.headers()["x-legate-request-id"]
            .to_str()
            .unwrap()
            .to_string()
    };

    // Served.
    let r = post("/v1/messages", r#"{"model":"claude-x","max_tokens":9,"messages":[{"role":"user","content":"SECRET-PROMPT"}]}"#)
        .send().await.unwrap();
    assert_eq!(r.status(), 200);
    let served = rid(&r);
    let _ = r.bytes().await.unwrap();
    let l = access(&log, &served).await;
    assert_eq!(l["level"], "INFO");
    assert_eq!(l["api"], "anthropic");
    assert_eq!(l["method"], "POST");
    assert_eq!(l["path"], "/v1/messages");
    assert_eq!(l["model"], "claude-x");
    assert_eq!(l["served_by"], "anthropic:claude-x");
    assert_eq!(l["status"], 200);
    assert_eq!(l["attempts"], 1);
    assert_eq!(l["tenant"], "default");
    assert_eq!(l["priority"], "interactive");
    assert_eq!(l["input_tokens"], 10);
    assert_eq!(l["output_tokens"], 5);
    assert_eq!(l["client_retry"], 2);
    assert!(l["error_type"].is_null());
    assert!(l["duration_ms"].as_f64().unwrap() >= l["overhead_ms"].as_f64().unwrap());
    assert!(l["estimate_error"].is_i64());

    // A fallback.
    let r = post(
        "/v1/messages",
        r#"{"model":"large","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let fallback = rid(&r);
    let _ = r.bytes().await.unwrap();
    let l = access(&log, &fallback).await;
    assert_eq!(l["model"], "large");
    assert_eq!(l["served_by"], "anthropic:claude-secondary");
    assert_eq!(l["attempts"], 2);
    // The fallback's own log line carries the request id.
    assert!(
        lines(&log)
            .iter()
            .any(|x| x["request_id"] == fallback.as_str()
                && x["message"] == "falling back to the next chain step"),
        "the fallback line carries the request id"
    );

    // A caller that goes away mid-stream.
    let r = post("/v1/messages", r#"{"model":"claude-slow","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .send().await.unwrap();
    let gone = rid(&r);
    let mut stream = r.bytes_stream();
    let _ = stream.next().await.unwrap().unwrap();
    drop(stream);
    let l = access(&log, &gone).await;
    assert_eq!(l["status"], 499);
    assert_eq!(l["error_type"], "client_gone");

    // Translated: an OpenAI caller served by an Anthropic step.
    let r = http
        .post(format!("{data}/v1/chat/completions"))
        .header("authorization", format!("Bearer {CLIENT_CANARY}"))
        .body(r#"{"model":"gpt-via-claude","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let translated = rid(&r);
    let _ = r.bytes().await.unwrap();
    let l = access(&log, &translated).await;
    assert_eq!(l["api"], "openai");
    assert_eq!(l["path"], "/v1/chat/completions");
    assert_eq!(l["model"], "gpt-via-claude");
    assert_eq!(l["served_by"], "anthropic:claude-backend");
    assert_eq!(l["status"], 200);

    // The fifth request of the minute fits; the sixth is refused locally.
    let r = post(
        "/v1/messages",
        r#"{"model":"claude-x","max_tokens":9,"messages":[]}"#,
    )
    .send()
    .await
    .unwrap();
    let _ = r.bytes().await.unwrap();
    let r = post(
        "/v1/messages",
        r#"{"model":"claude-x","max_tokens":9,"messages":[]}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 429);
    let limited = rid(&r);
    let _ = r.bytes().await.unwrap();
    let l = access(&log, &limited).await;
    assert_eq!(l["status"], 429);
    assert_eq!(l["error_type"], "rate_limited");
    assert_eq!(l["attempts"], 0);
    assert!(l["served_by"].is_null());

    // One access line per request, and nothing secret anywhere in the log.
    let all = lines(&log);
    for id in [&served, &fallback, &gone, &translated, &limited] {
        let n = all
            .iter()
            .filter(|l| l["target"] == "legate::access" && l["request_id"] == id.as_str())
            .count();
        assert_eq!(n, 1, "{id}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("CANARY"), "a key reached the log");
    assert!(
        !text.contains("SECRET-PROMPT"),
        "prompt text reached the log"
    );
    let _ = child.kill().await;
}
