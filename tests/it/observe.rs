//! Seeing every request, in-process: spans and GenAI metrics received by a test collector,
//! the caller's trace continued to the provider, a dead collector costing requests nothing,
//! and the request journal on the admin plane.

use crate::harness::{self, ANTHROPIC_KEY, Env};
use crate::otlp::{self, Collector, int_attr, str_attr};

const CHAIN: &str = r#"
[retry]
base_delay = "10ms"
max_delay = "20ms"
max_attempts = 2

[[models]]
name = "large"
chain = ["anthropic:claude-primary", "anthropic:claude-secondary"]
"#;

const PRIMARY_DOWN: &str =
    r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":529}]}"#;

const LARGE: &str =
    r#"{"model":"large","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

async fn env(extra: &str, script: &str) -> Env {
    harness::start_with(legate::mock::Script::from_json(script).unwrap(), extra).await
}

#[tokio::test]
async fn spans_continue_the_callers_trace_with_one_child_per_attempt() {
    let collector = Collector::start().await;
    let extra = format!(
        "{CHAIN}\n[telemetry]\notlp_endpoint = \"{}\"\nmetrics_interval = \"1h\"\n",
        collector.url
    );
    let env = env(&extra, PRIMARY_DOWN).await;
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .body(LARGE)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = resp.bytes().await.unwrap();
    collector.wait_for(|r| r.spans.len() >= 4).await;

    let spans = collector.got.lock().unwrap().spans.clone();
    assert!(
        spans
            .iter()
            .all(|s| hex::encode(&s.trace_id) == CALLER_TRACE)
    );
    // Filed under legate's service name (`[telemetry] service_name`, "legate" by default).
    let services = collector.got.lock().unwrap().span_services.clone();
    assert!(
        !services.is_empty() && services.iter().all(|s| s == "legate"),
        "{services:?}"
    );
    let request = spans
        .iter()
        .find(|s| hex::encode(&s.parent_span_id) == CALLER_SPAN)
        .expect("the request span continues the caller's span");
    assert_eq!(request.kind, 2, "SERVER");
    assert_eq!(str_attr(request, "legate.request_id"), Some(rid.as_str()));
    assert_eq!(str_attr(request, "gen_ai.operation.name"), Some("chat"));
    assert_eq!(str_attr(request, "gen_ai.request.model"), Some("large"));
    assert_eq!(
        str_attr(request, "gen_ai.response.model"),
        Some("claude-secondary")
    );
    assert_eq!(str_attr(request, "gen_ai.provider.name"), Some("anthropic"));
    assert!(str_attr(request, "gen_ai.response.id").is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(int_attr(request, "gen_ai.usage.input_tokens"), Some(10));
    assert_eq!(int_attr(request, "gen_ai.usage.output_tokens"), Some(5));
    assert_eq!(str_attr(request, "legate.tenant"), Some("default"));
    assert_eq!(str_attr(request, "server.address"), Some("127.0.0.1"));

    // Three attempts (two on the primary, one on the substitute), each a child of the request.
    let mut children: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id == request.span_id)
        .collect();
    children.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(children.len(), 3);
    for (i, c) in children.iter().enumerate() {
        assert_eq!(c.kind, 3, "CLIENT");
        assert_eq!(int_attr(c, "legate.attempt"), Some(i as i64 + 1));
        assert_eq!(str_attr(c, "gen_ai.operation.name"), Some("chat"));
        assert_eq!(str_attr(c, "gen_ai.provider.name"), Some("anthropic"));
    }
    assert_eq!(
        str_attr(children[0], "gen_ai.request.model"),
        Some("claude-primary")
    );
    assert_eq!(str_attr(children[0], "legate.outcome"), Some("retryable"));
    assert_eq!(str_attr(children[0], "error.type"), Some("529"));
    assert_eq!(int_attr(children[0], "legate.fallback_step"), Some(1));
    assert_eq!(
        str_attr(children[2], "gen_ai.request.model"),
        Some("claude-secondary")
    );
    assert_eq!(str_attr(children[2], "legate.outcome"), Some("ok"));
    assert_eq!(int_attr(children[2], "legate.fallback_step"), Some(2));

    // The provider saw the trace continued, each attempt as its parent.
    let seen: Vec<String> = env
        .mock
        .requests()
        .iter()
        .map(|r| r.header("traceparent").unwrap().to_string())
        .collect();
    let expected: Vec<String> = children
        .iter()
        .map(|c| format!("00-{CALLER_TRACE}-{}-01", hex::encode(&c.span_id)))
        .collect();
    assert_eq!(seen, expected);

    // Metrics are flushed at shutdown.
    let Env { legate, .. } = env;
    legate.shutdown().await;
    collector
        .wait_for(|r| {
            [
                "gen_ai.client.operation.duration",
                "gen_ai.client.token.usage",
            ]
            .iter()
            .all(|n| r.metric_names.iter().any(|m| m == n))
        })
        .await;
    let got = collector.got.lock().unwrap();
    assert!(
        got.content_types
            .iter()
            .all(|c| c == "application/x-protobuf")
    );
}

#[tokio::test]
async fn exported_metrics_carry_the_bounded_model_label_not_the_callers_name() {
    let collector = Collector::start().await;
    let extra = format!(
        "{CHAIN}\n[telemetry]\notlp_endpoint = \"{}\"\nmetrics_interval = \"1h\"\n",
        collector.url
    );
    let env = env(&extra, r#"{"default":{}}"#).await;
    for model in ["invented-1", "invented-2", "large"] {
        let resp = env
            .messages(format!(
                r#"{{"model":"{model}","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
            ))
            .await;
        assert_eq!(resp.status(), 200, "{model}");
        let _ = resp.bytes().await.unwrap();
    }
    let Env { legate, .. } = env;
    legate.shutdown().await;
    collector
        .wait_for(|r| {
            r.metric_names
                .iter()
                .any(|m| m == "gen_ai.client.operation.duration")
        })
        .await;
    let got = collector.got.lock().unwrap();
    let mut models = got.metric_models.clone();
    models.sort();
    models.dedup();
    // Names a caller invents share `other`; a configured alias keeps its name, and its
    // step's configured model is named as the response model.
    assert_eq!(models, ["claude-primary", "large", "other"], "{models:?}");
}

#[tokio::test]
async fn a_stream_reports_time_to_first_chunk() {
    let collector = Collector::start().await;
    let extra = format!("[telemetry]\notlp_endpoint = \"{}\"\n", collector.url);
    let env = env(&extra, r#"{"default":{}}"#).await;
    let resp = env
        .messages(r#"{"model":"claude-x","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    collector.wait_for(|r| r.spans.len() >= 2).await;
    {
        let got = collector.got.lock().unwrap();
        let request = got.spans.iter().find(|s| s.kind == 2).unwrap();
        let reasons = crate::otlp::attr(request, "gen_ai.response.finish_reasons");
        assert!(format!("{reasons:?}").contains("end_turn"), "{reasons:?}");
        // A new trace (no caller traceparent), sent upstream all the same.
        let tp = env.mock.requests()[0]
            .header("traceparent")
            .unwrap()
            .to_string();
        assert!(tp.contains(&hex::encode(&request.trace_id)));
    }
    let Env { legate, .. } = env;
    legate.shutdown().await;
    collector
        .wait_for(|r| {
            r.metric_names
                .iter()
                .any(|m| m == "gen_ai.client.operation.time_to_first_chunk")
        })
        .await;
}

#[tokio::test]
async fn a_dead_collector_drops_and_counts_spans_and_never_holds_a_request() {
    let (_listener, url) = otlp::dead().await;
    let extra = format!(
        "[telemetry]\notlp_endpoint = \"{url}\"\nexport_timeout = \"300ms\"\nqueue_size = 4\n"
    );
    let env = env(&extra, r#"{"default":{}}"#).await;
    const N: usize = 20;
    for _ in 0..N {
        let resp = env
            .messages(r#"{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
            .await;
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await.unwrap();
    }
    // Every request was answered while the collector answered nothing: export never sat on
    // the request path. Every span (request + attempt) ends up dropped and counted.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let dropped = env
            .metric("legate_telemetry_dropped_total", &[("signal", "spans")])
            .await
            .unwrap_or(0.0);
        if dropped as usize == 2 * N {
            break;
        }
        assert!(dropped as usize <= 2 * N);
        assert!(
            tokio::time::Instant::now() < deadline,
            "dropped {dropped} of {}",
            2 * N
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_export_the_collector_refuses_is_dropped_not_tried_again() {
    // A retry would wait out its backoff on the thread that serves requests (the exporter's
    // own sleep): a batch refused with 503 is dropped and counted, sent once.
    let (sent, url) = otlp::unavailable().await;
    let extra = format!("[telemetry]\notlp_endpoint = \"{url}\"\nexport_timeout = \"5s\"\n");
    let env = env(&extra, r#"{"default":{}}"#).await;
    let resp = env
        .messages(
            r#"{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    env.wait_metric(
        "legate_telemetry_dropped_total",
        &[("signal", "spans")],
        2.0,
    )
    .await;
    // The request's span and its attempt's, each sent once.
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_journal_shows_both_steps_of_a_fallback_and_why_the_first_moved_on() {
    let env = env(CHAIN, PRIMARY_DOWN).await;
    let resp = env.messages(LARGE).await;
    assert_eq!(resp.status(), 200);
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = resp.bytes().await.unwrap();
    let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
    assert_eq!(doc["request_id"], rid.as_str());
    assert_eq!(doc["status"], 200);
    assert_eq!(doc["served_by"], "anthropic:claude-secondary");
    assert_eq!(doc["attempts"], 3);
    let steps = doc["attempts_detail"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{doc}");
    assert_eq!(steps[0]["step"], 1);
    assert_eq!(steps[0]["status"], 529);
    assert_eq!(steps[0]["outcome"], "retryable");
    assert_eq!(steps[1]["step"], 1);
    let why = steps[1]["why"].as_str().unwrap();
    assert!(
        why.contains("status 529") && why.contains("2 attempts spent"),
        "{why}"
    );
    assert_eq!(steps[2]["step"], 2);
    assert_eq!(steps[2]["target"], "anthropic:claude-secondary");
    assert_eq!(steps[2]["outcome"], "ok");
    // Listing and filters.
    let list = env
        .admin_json("/admin/requests?status=2xx&tenant=default&limit=5")
        .await;
    assert_eq!(list["requests"][0]["request_id"], rid.as_str());
    let none = env.admin_json("/admin/requests?status=5xx").await;
    assert_eq!(none["requests"].as_array().unwrap().len(), 0);
    let bad = env
        .http
        .get(env.admin_url("/admin/requests?limit=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn the_journal_keeps_only_its_size() {
    let env = env("[journal]\nsize = 3\n", r#"{"default":{}}"#).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let resp = env
            .messages(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
            .await;
        ids.push(
            resp.headers()["x-legate-request-id"]
                .to_str()
                .unwrap()
                .to_string(),
        );
        let _ = resp.bytes().await.unwrap();
    }
    let list = env.admin_json("/admin/requests?limit=100").await;
    assert_eq!(list["held"], 3);
    let listed: Vec<&str> = list["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[4].as_str(), ids[3].as_str(), ids[2].as_str()]);
}

#[tokio::test]
async fn captured_payloads_never_hold_a_key() {
    let env = env(
        "[journal]\ncapture = \"redacted\"\ncapture_bytes = 200\n",
        r#"{"default":{}}"#,
    )
    .await;
    let client_key = "client-CANARY-key-0a1b2c3d";
    let body = format!(
        r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"user","content":"keys: {ANTHROPIC_KEY} and Bearer {client_key}"}}]}}"#
    );
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("x-api-key", client_key)
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await
        .unwrap();
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = resp.bytes().await.unwrap();
    let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
    let request = doc["capture"]["request"].as_str().unwrap();
    assert!(request.starts_with(r#"{"model":"m""#), "{request}");
    assert!(request.contains("[redacted]"), "{request}");
    assert!(
        doc["capture"]["response"]
            .as_str()
            .unwrap()
            .contains("Hello")
    );
    let all = env.admin_json("/admin/requests").await.to_string();
    assert!(!all.contains("CANARY"), "{all}");
    assert!(!all.contains("4f9a1c"), "{all}");
}

#[tokio::test]
async fn an_attempt_cut_short_by_its_callers_leaving_is_in_the_journal() {
    let env = env("", r#"{"default":{"hang":true}}"#).await;
    let client = reqwest::Client::new();
    let url = env.url("/v1/messages");
    let caller = tokio::spawn(async move {
        let _ = client
            .post(url)
            .body(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
            .send()
            .await;
    });
    let reached = async {
        while env.mock.stats().requests < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), reached)
        .await
        .expect("the request reached the provider");
    caller.abort();
    // The journal has the request once legate has seen its caller go (a bounded poll).
    let listed = async {
        loop {
            let list = env.admin_json("/admin/requests?limit=5").await;
            if let Some(r) = list["requests"].as_array().and_then(|r| r.first()) {
                break r["request_id"].as_str().unwrap().to_string();
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    let rid = tokio::time::timeout(std::time::Duration::from_secs(10), listed)
        .await
        .expect("the request is journalled");
    let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
    assert_eq!(doc["status"], 499, "{doc}");
    let steps = doc["attempts_detail"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{doc}");
    assert_eq!(steps[0]["outcome"], "aborted");
    assert_eq!(doc["attempts"], 1, "{doc}");
    assert_eq!(steps[0]["sent"], true);
    assert_eq!(steps[0]["status"], serde_json::Value::Null);
    let why = steps[0]["why"].as_str().unwrap();
    assert!(why.contains("cut short"), "{why}");
}

/// A caller that leaves while legate waits to retry is recorded with the attempt it cost
/// (the record is never stamped with the count, as an answered request's is).
#[tokio::test]
async fn a_caller_gone_during_a_retry_wait_is_recorded_with_its_attempt() {
    let env = env(
        "",
        r#"{"replies":[{"status":529,"headers":{"retry-after":"15"}}]}"#,
    )
    .await;
    let asking = tokio::spawn({
        let req = env
            .http
            .post(env.url("/v1/messages"))
            .body(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#);
        async move { req.send().await }
    });
    // The first attempt was answered 529 (its outcome is counted when it ends): legate now
    // waits out its retry-after, and the caller leaves.
    let outcome = [("outcome", "retryable")];
    env.wait_metric("legate_upstream_attempts_total", &outcome, 1.0)
        .await;
    asking.abort();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let list = loop {
        let list = env.admin_json("/admin/requests?status=499").await;
        if !list["requests"].as_array().unwrap().is_empty() {
            break list;
        }
        assert!(tokio::time::Instant::now() < deadline, "no 499 recorded");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let doc = &list["requests"][0];
    assert_eq!(doc["attempts"], 1, "{doc}");
    assert_eq!(env.mock.stats().requests, 1);
}

/// A model name a header cannot hold (non-ASCII, a control character) still names the step
/// that served it: escaped in `x-legate-served-by`, as it is in the request's record.
#[tokio::test]
async fn a_model_name_a_header_cannot_hold_is_escaped_in_served_by() {
    let env = harness::start("").await;
    let body = serde_json::json!({"model": "f\u{f6}\u{f6}\u{7}", "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}]});
    let resp = env.messages(body.to_string()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:f%C3%B6%C3%B6%07"
    );
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
    assert_eq!(doc["served_by"], "anthropic:f\u{f6}\u{f6}\u{7}", "{doc}");
}
