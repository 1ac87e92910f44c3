//! The failure policy, end to end against scripted upstreams: exact attempt counts, waits,
//! fallbacks, breakers, and streams that fail before or after their commit point.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use crate::harness::{self, Env};

const BODY: &str = r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;

/// A chain "large": claude-primary, then claude-secondary; quick retries.
const CHAIN: &str = r#"
[retry]
base_delay = "10ms"
max_delay = "40ms"

[[models]]
name = "large"
chain = ["anthropic:claude-primary", { target = "anthropic:claude-secondary", max_tokens = 64 }]
"#;

fn large(stream: bool) -> String {
    format!(
        r#"{{"model":"large","max_tokens":500,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

fn count_for(env: &Env, model: &str) -> usize {
    let needle = format!("\"model\":\"{model}\"");
    env.mock
        .requests()
        .iter()
        .filter(|r| std::str::from_utf8(&r.body).unwrap().contains(&needle))
        .count()
}

/// `body` to /v1/messages with `x-legate-deadline-ms: ms`.
async fn within(env: &Env, ms: &str, body: String) -> reqwest::Response {
    env.http
        .post(env.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("x-legate-deadline-ms", ms)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn with_script(extra: &str, script: &str) -> Env {
    harness::start_with(legate::mock::Script::from_json(script).unwrap(), extra).await
}

#[tokio::test]
async fn overloaded_twice_then_ok_is_one_success_in_three_attempts() {
    let env = with_script(
        "[retry]\nbase_delay = \"10ms\"\nmax_delay = \"20ms\"\n",
        r#"{"replies":[{"status":529},{"status":529}]}"#,
    )
    .await;
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "3");
    assert_eq!(env.mock.stats().requests, 3);
    let retries = env
        .metric("legate_retries_total", &[("provider", "anthropic")])
        .await;
    assert_eq!(retries, Some(2.0));
    let bodies: Vec<_> = env.mock.requests().into_iter().map(|r| r.body).collect();
    assert!(
        bodies.iter().all(|b| b.as_ref() == BODY.as_bytes()),
        "every retry resends the same bytes"
    );
}

#[tokio::test]
async fn retry_after_is_honoured_before_the_next_attempt() {
    let env = with_script(
        "[retry]\nbase_delay = \"10ms\"\nmax_delay = \"20ms\"\n",
        r#"{"replies":[{"status":529,"headers":{"retry-after":"1"}}]}"#,
    )
    .await;
    let started = Instant::now();
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 200);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(env.mock.stats().requests, 2);
}

#[tokio::test]
async fn final_client_errors_are_returned_unchanged_after_one_attempt() {
    for status in [400, 401, 413] {
        let env = with_script(
            "",
            &format!(
                r#"{{"replies":[{{"status":{status},"error_message":"scripted {status}"}}]}}"#
            ),
        )
        .await;
        let resp = env.messages(BODY).await;
        assert_eq!(resp.status(), status);
        assert_eq!(resp.headers()["x-legate-attempts"], "1");
        assert_eq!(resp.headers()["x-should-retry"], "false");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["message"], format!("scripted {status}"));
        assert_eq!(env.mock.stats().requests, 1, "status {status}");
    }
}

#[tokio::test]
async fn a_failing_primary_is_served_by_the_secondary() {
    let env = with_script(
        CHAIN,
        r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":529}]}"#,
    )
    .await;
    let resp = env.messages(large(false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-secondary"
    );
    assert_eq!(resp.headers()["x-legate-attempts"], "4");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["model"], "claude-secondary");
    assert_eq!(count_for(&env, "claude-primary"), 3);
    assert_eq!(count_for(&env, "claude-secondary"), 1);
    // The substitute got the request fitted: max_tokens capped by the step, nothing else changed.
    let sent = env.mock.requests().pop().unwrap().body;
    let expected = large(false)
        .replace("\"large\"", "\"claude-secondary\"")
        .replace("500", "64");
    assert_eq!(std::str::from_utf8(&sent).unwrap(), expected);
    let fallbacks = env
        .metric(
            "legate_fallbacks_total",
            &[
                ("model", "large"),
                ("from", "anthropic:claude-primary"),
                ("to", "anthropic:claude-secondary"),
            ],
        )
        .await;
    assert_eq!(fallbacks, Some(1.0));
}

#[tokio::test]
async fn fallback_off_returns_the_primarys_error() {
    let env = with_script(
        CHAIN,
        r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":529}]}"#,
    )
    .await;
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("x-legate-fallback", "off")
        .body(large(false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 529);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-primary"
    );
    assert_eq!(resp.headers()["x-should-retry"], "false");
    assert_eq!(count_for(&env, "claude-secondary"), 0);
}

#[tokio::test]
async fn a_content_policy_refusal_never_falls_back() {
    let env = with_script(
        CHAIN,
        r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":400,"error_message":"content policy"}]}"#,
    )
    .await;
    let resp = env.messages(large(false)).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(count_for(&env, "claude-primary"), 1);
    assert_eq!(count_for(&env, "claude-secondary"), 0);
}

#[tokio::test]
async fn a_hanging_primary_times_out_and_falls_back_within_the_deadline() {
    let env = with_script(
        &format!("{CHAIN}\n"),
        r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"hang":true}]}"#,
    )
    .await;
    drop(env.legate);
    let toml = harness::config_toml(&env.mock.base_url(), CHAIN)
        .replace(
            "first_byte_timeout = \"5s\"",
            "first_byte_timeout = \"200ms\"",
        )
        .replace("[retry]\n", "[retry]\nmax_attempts = 1\n");
    let env = harness::start_toml(env.mock, &toml).await;
    let started = Instant::now();
    let resp = within(&env, "3000", large(false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-secondary"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    env.mock.wait_cancelled(1).await;
}

const BREAKER: &str = r#"
[retry]
max_attempts = 1

[breaker]
min_calls = 2
failure_ratio = 0.5
open_for = "1s"

[[models]]
name = "large"
chain = ["anthropic:claude-primary", "anthropic:claude-secondary"]
"#;

#[tokio::test]
async fn the_breaker_opens_rests_the_primary_and_admits_one_probe() {
    let env = with_script(
        BREAKER,
        r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":503}]}"#,
    )
    .await;
    for _ in 0..2 {
        let resp = env.messages(large(false)).await;
        assert_eq!(
            resp.headers()["x-legate-served-by"],
            "anthropic:claude-secondary"
        );
    }
    assert_eq!(count_for(&env, "claude-primary"), 2);
    assert_eq!(breaker_state(&env).await, Some(1.0), "open");
    for _ in 0..5 {
        let resp = env.messages(large(false)).await;
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(
        count_for(&env, "claude-primary"),
        2,
        "an open breaker sends nothing upstream"
    );
    let refused = env
        .metric(
            "legate_upstream_attempts_total",
            &[("model", "claude-primary"), ("outcome", "breaker_open")],
        )
        .await;
    assert_eq!(refused, Some(5.0));

    // The primary recovers, slowly: the probe is still in flight while 20 callers arrive.
    env.script(r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"delay_ms":300}]}"#);
    // The time under test: open_for must pass before a probe is allowed. Waited for on the
    // breaker's own report (`/admin/state`), not for a fixed time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = env.admin_json("/admin/state").await;
        let primary = state["breakers"]
            .as_array()
            .and_then(|all| {
                all.iter().find(|b| {
                    b["upstream"]
                        .as_str()
                        .is_some_and(|u| u.contains("claude-primary"))
                })
            })
            .cloned()
            .expect("the primary's breaker is listed");
        assert_eq!(primary["state"], "open", "{primary}");
        if primary["probe_in_ms"] == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "open_for never passed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = (0..20).map(|_| {
        let http = env.http.clone();
        let url = env.url("/v1/messages");
        async move {
            http.post(url)
                .header("anthropic-version", "2023-06-01")
                .body(large(false))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let statuses = futures_util::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(
        count_for(&env, "claude-primary"),
        3,
        "exactly one probe among 20 callers"
    );
    assert_eq!(
        breaker_state(&env).await,
        Some(0.0),
        "the successful probe closed it"
    );
    let resp = env.messages(large(false)).await;
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-primary"
    );
}

#[tokio::test]
async fn a_run_of_client_errors_never_opens_the_breaker() {
    let env = with_script(
        BREAKER,
        r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"status":400}]}"#,
    )
    .await;
    for _ in 0..10 {
        assert_eq!(env.messages(large(false)).await.status(), 400);
    }
    assert_eq!(count_for(&env, "claude-primary"), 10);
    let state = env
        .metric("legate_breaker_state", &[("model", "claude-primary")])
        .await;
    assert_eq!(state, Some(0.0));
}

#[tokio::test]
async fn every_breaker_open_is_529_with_retry_after_and_no_upstream_call() {
    let env = with_script(
        "[retry]\nmax_attempts = 1\n[breaker]\nmin_calls = 2\nopen_for = \"30s\"\n[[models]]\nname = \"solo\"\nchain = [\"anthropic:claude-solo\"]\n",
        r#"{"replies":[{"match":{"model":"claude-solo"},"times":0,"status":500}]}"#,
    )
    .await;
    let body = BODY.replace("\"m\"", "\"solo\"");
    for _ in 0..2 {
        assert_eq!(env.messages(body.clone()).await.status(), 500);
    }
    let resp = env.messages(body).await;
    assert_eq!(resp.status(), 529);
    let secs: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29..=30).contains(&secs), "{secs}");
    assert!(resp.headers().get("retry-after-ms").is_some());
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(env.mock.stats().requests, 2);
}

async fn breaker_state(env: &Env) -> Option<f64> {
    env.metric("legate_breaker_state", &[("model", "claude-primary")])
        .await
}

/// Event names of a streamed answer, in order.
async fn event_names(resp: reqwest::Response) -> Vec<String> {
    let mut parser = legate::sse::SseParser::new();
    let mut names = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        parser.push(&chunk);
        while let Some(ev) = parser.next_event() {
            names.push(ev.event.unwrap_or_default());
        }
    }
    names
}

#[tokio::test]
async fn a_stream_failing_before_content_is_retried_into_one_clean_stream() {
    for fault in [
        r#""stream_error_after":2"#,
        r#""cut_after":2"#,
        r#""status":529"#,
    ] {
        let env = with_script(
            "[retry]\nbase_delay = \"10ms\"\nmax_delay = \"20ms\"\n",
            &format!(r#"{{"replies":[{{{fault}}}]}}"#),
        )
        .await;
        let resp = env
            .messages(BODY.replace("\"max_tokens\":5", "\"max_tokens\":5,\"stream\":true"))
            .await;
        assert_eq!(resp.status(), 200, "{fault}");
        assert_eq!(resp.headers()["x-legate-attempts"], "2", "{fault}");
        let names = event_names(resp).await;
        assert_eq!(
            names.iter().filter(|n| *n == "message_start").count(),
            1,
            "{fault}: {names:?}"
        );
        assert!(!names.contains(&"error".to_string()), "{fault}: {names:?}");
        assert_eq!(
            names.last().map(String::as_str),
            Some("message_stop"),
            "{fault}"
        );
        assert_eq!(env.mock.stats().requests, 2);
    }
}

#[tokio::test]
async fn a_stream_failing_before_content_falls_back_to_the_next_step() {
    let env = with_script(
        CHAIN,
        r#"{"replies":[{"match":{"model":"claude-primary"},"times":0,"stream_error_after":2}]}"#,
    )
    .await;
    let resp = env.messages(large(true)).await;
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-secondary"
    );
    let names = event_names(resp).await;
    assert_eq!(names.iter().filter(|n| *n == "message_start").count(), 1);
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
}

#[tokio::test]
async fn a_stream_failing_after_content_is_never_retried_and_counts_against_the_breaker() {
    let env = with_script(
        "[breaker]\nmin_calls = 1\nfailure_ratio = 1.0\n",
        r#"{"replies":[{"cut_after":5}]}"#,
    )
    .await;
    let resp = env
        .messages(BODY.replace("\"max_tokens\":5", "\"max_tokens\":5,\"stream\":true"))
        .await;
    let names = event_names(resp).await;
    assert_eq!(names.last().map(String::as_str), Some("error"));
    assert!(!names.contains(&"message_stop".to_string()));
    assert_eq!(env.mock.stats().requests, 1);
    let state = env
        .metric("legate_breaker_state", &[("provider", "anthropic")])
        .await;
    // The model "m" is not configured, so it has no gauge series; the breaker still counted:
    // the next call is refused without reaching the upstream.
    assert_eq!(state, None);
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 529);
    assert_eq!(env.mock.stats().requests, 1);
}

#[tokio::test]
async fn a_stream_failing_after_content_is_a_502_in_the_counts_however_it_fails() {
    // Cut by the connection, or ended by the provider's own error event: either way the
    // caller's stream failed after its 200 head, and the request counts as 502.
    for fault in [r#""cut_after":5"#, r#""stream_error_after":5"#] {
        let env = with_script("", &format!(r#"{{"replies":[{{{fault}}}]}}"#)).await;
        let resp = env
            .messages(BODY.replace("\"max_tokens\":5", "\"max_tokens\":5,\"stream\":true"))
            .await;
        assert_eq!(resp.status(), 200, "{fault}");
        let rid = resp.headers()["x-legate-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        let names = event_names(resp).await;
        assert_eq!(names.last().map(String::as_str), Some("error"), "{fault}");
        let text = env.metrics_text().await;
        let counted = |status| {
            harness::metric_value(
                &text,
                "legate_requests_total",
                &[("api", "anthropic"), ("status", status)],
            )
        };
        assert_eq!(counted("502"), Some(1.0), "{fault}");
        assert_eq!(counted("200"), None, "{fault}");
        let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
        assert_eq!(doc["status"], 502, "{fault}: {doc}");
    }
}

#[tokio::test]
async fn chaos_every_call_succeeds_and_retries_stay_within_the_budget() {
    // Primary fails 30% of its calls, mixing overloads, outages and cuts before content.
    let faults = [r#""status":529"#, r#""status":503"#, r#""cut_after":1"#];
    let replies: Vec<String> = (0..3000)
        .map(|i| {
            let fault = if i % 10 % 3 == 1 {
                faults[i % 3]
            } else {
                r#""status":200"#
            };
            format!(r#"{{"match":{{"model":"claude-primary"}},{fault}}}"#)
        })
        .collect();
    let script = format!(r#"{{"replies":[{}]}}"#, replies.join(","));
    let env = with_script(
        "[retry]\nbase_delay = \"5ms\"\nmax_delay = \"20ms\"\n[breaker]\nmin_calls = 50\nfailure_ratio = 0.6\n[[models]]\nname = \"large\"\nchain = [\"anthropic:claude-primary\", \"anthropic:claude-secondary\"]\n",
        &script,
    )
    .await;
    const TOTAL: usize = 1000;
    let started = std::time::Instant::now();
    let results = futures_util::stream::iter(0..TOTAL)
        .map(|i| {
            let http = env.http.clone();
            let url = env.url("/v1/messages");
            async move {
                let resp = http
                    .post(url)
                    .header("anthropic-version", "2023-06-01")
                    .body(large(i % 2 == 0))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap_or_default();
                let complete = if i % 2 == 0 {
                    text.contains("event: message_stop") && !text.contains("event: error")
                } else {
                    serde_json::from_str::<serde_json::Value>(&text).is_ok()
                };
                (status, complete)
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let ok = results.iter().filter(|(s, c)| *s == 200 && *c).count();
    assert_eq!(ok, TOTAL, "every call succeeded, whole");
    let retries = env.metric("legate_retries_total", &[]).await.unwrap_or(0.0);
    // The budget holds per window of ten whole-second slots: at most 0.2 × the window's
    // requests plus the floor's 100. A run touching k second-slots splits into ⌈k/10⌉ such
    // windows, so over the run: 0.2 of 1000 requests plus 100 per window. A slow machine
    // stretches the run and so the floor's share (retries can bunch up at a window's start).
    let slots = started.elapsed().as_secs_f64().ceil() + 1.0;
    let allowed = 200.0 + 100.0 * (slots / 10.0).ceil();
    assert!(retries <= allowed, "{retries} retries, {allowed} allowed");
    assert!(retries > 0.0, "the chaos exercised retries");
    // Every attempt legate counted reached the mock, except those its breaker refused.
    let attempts = env
        .metric("legate_upstream_attempts_total", &[])
        .await
        .unwrap_or(0.0);
    let refused = env
        .metric(
            "legate_upstream_attempts_total",
            &[("outcome", "breaker_open")],
        )
        .await
        .unwrap_or(0.0);
    assert_eq!(env.mock.stats().requests as f64, attempts - refused);
    // Extra upstream load beyond one call per request: retries (budgeted) and fallbacks.
    let fallbacks = env
        .metric("legate_fallbacks_total", &[])
        .await
        .unwrap_or(0.0);
    assert!(attempts - refused <= TOTAL as f64 + retries + fallbacks);
}

/// A `provider:*` step sends the caller's model name: its fallbacks are labelled by the
/// pattern it matched, as every other series is, so made-up names add no series.
#[tokio::test]
async fn fallbacks_from_a_star_step_are_labelled_by_the_pattern() {
    let env = with_script(
        "[retry]\nbase_delay = \"10ms\"\nmax_delay = \"40ms\"\nmax_attempts = 1\n\
         [[models]]\nname = \"claude-*\"\nchain = [\"anthropic:*\", \"anthropic:claude-spare\"]\n",
        r#"{"replies":[
            {"match":{"model":"claude-made-up-1"},"times":0,"status":529},
            {"match":{"model":"claude-made-up-2"},"times":0,"status":529}]}"#,
    )
    .await;
    for name in ["claude-made-up-1", "claude-made-up-2"] {
        let body = BODY.replace("\"m\"", &format!("\"{name}\""));
        let resp = env.messages(body).await;
        assert_eq!(resp.status(), 200, "{name}");
        assert_eq!(
            resp.headers()["x-legate-served-by"],
            "anthropic:claude-spare"
        );
    }
    let labels = [
        ("model", "claude-*"),
        ("from", "anthropic:claude-*"),
        ("to", "anthropic:claude-spare"),
    ];
    assert_eq!(
        env.metric("legate_fallbacks_total", &labels).await,
        Some(2.0)
    );
    let text = env.metrics_text().await;
    assert!(!text.contains("made-up"), "{text}");
}

/// A caller's deadline shorter than the model's time to its first content ends the caller's
/// streams in 504s, and says nothing about the provider: the breaker stays closed for every
/// other caller (it opened after two such streams, and a plain request was passed over).
#[tokio::test]
async fn a_callers_short_deadline_does_not_open_the_breaker() {
    let env = with_script(
        BREAKER,
        r#"{"replies":[{"match":{"model":"claude-primary","stream":true},"times":0,"event_gap_ms":400}]}"#,
    )
    .await;
    for _ in 0..3 {
        let resp = within(&env, "150", large(true)).await;
        assert_eq!(resp.status(), 504);
    }
    assert_eq!(count_for(&env, "claude-primary"), 3);
    let resp = env.messages(large(false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-primary"
    );
    let state = env
        .metric(
            "legate_breaker_state",
            &[("provider", "anthropic"), ("model", "claude-primary")],
        )
        .await;
    assert_eq!(state, Some(0.0));
}

/// An official SDK's own timeout (`x-stainless-timeout` or `x-stainless-read-timeout`, seconds)
/// shortens the deadline: legate answers 504, which the SDK does not retry, before the SDK's
/// timer fires and it retries on its own. `NOT_GIVEN` (a Python SDK without a timeout on the
/// call), a longer timeout and what is no number change nothing.
#[tokio::test]
async fn an_sdks_own_timeout_shortens_the_deadline() {
    let env = with_script(
        "",
        r#"{"replies":[{"match":{"model":"claude-slow"},"times":0,"delay_ms":5000}]}"#,
    )
    .await;
    let send = |model: &str, timeout: &str| {
        let (header, timeout) = timeout
            .split_once('=')
            .unwrap_or(("x-stainless-timeout", timeout));
        env.http
            .post(env.url("/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .header(header, timeout)
            .timeout(std::time::Duration::from_secs(4))
            .body(format!(
                r#"{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":"hi"}}]}}"#
            ))
            .send()
    };
    let resp = send("claude-slow", "1").await.unwrap();
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let resp = send("claude-slow", "x-stainless-read-timeout=1.5")
        .await
        .unwrap();
    assert_eq!(resp.status(), 504);
    assert_eq!(env.mock.stats().requests, 2, "one attempt each");
    for timeout in [
        "NOT_GIVEN",
        "600.0",
        "x-stainless-read-timeout=600",
        "-1",
        "nan",
    ] {
        let resp = send("claude-x", timeout).await.unwrap();
        assert_eq!(resp.status(), 200, "{timeout}");
    }
}

/// A deadline already passed sends nothing: not the first step, not a later one.
#[tokio::test]
async fn nothing_is_sent_once_the_deadline_has_passed() {
    let env = with_script(CHAIN, r#"{"replies":[]}"#).await;
    let resp = within(&env, "0", large(false)).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(env.mock.stats().requests, 0);
    // The same request with time left is served.
    assert_eq!(env.messages(large(false)).await.status(), 200);
    assert_eq!(env.mock.stats().requests, 1);
}

/// A request legate refuses itself before sending anything (here its deadline had passed;
/// shed with 529 and every breaker open alike) gives back what it took from
/// `requests_per_minute`: an SDK retrying such refusals would otherwise spend its tenant's
/// requests on answers that never reached a provider.
#[tokio::test]
async fn a_request_refused_before_sending_spends_no_requests_per_minute() {
    let env = with_script(
        &format!("{CHAIN}\n[tenants.default]\nrequests_per_minute = 2\n"),
        r#"{"replies":[]}"#,
    )
    .await;
    for _ in 0..3 {
        let resp = within(&env, "0", large(false)).await;
        assert_eq!(resp.status(), 504);
    }
    for _ in 0..2 {
        assert_eq!(env.messages(large(false)).await.status(), 200);
    }
    assert_eq!(env.messages(large(false)).await.status(), 429);
    assert_eq!(env.mock.stats().requests, 2);
}

/// A provider with no key is refused by legate before anything is sent: the 500 gives back
/// what it took from `requests_per_minute`, as the other refusals before sending do.
#[tokio::test]
async fn a_provider_without_a_key_spends_no_requests_per_minute() {
    let env = with_script(
        "[tenants.default]\nrequests_per_minute = 2\n\n\
         [providers.keyless]\nkind = \"anthropic\"\nbase_url = \"{MOCK}\"\n\
         api_key_env = \"LEGATE_TEST_KEY_NEVER_SET\"\n\n\
         [[models]]\nname = \"keyless\"\nchain = [\"keyless:claude-x\"]\n",
        r#"{"replies":[]}"#,
    )
    .await;
    let body = r#"{"model":"keyless","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..3 {
        let resp = env.messages(body).await;
        assert_eq!(resp.status(), 500);
        let err: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["type"], "api_error", "{err}");
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("no API key")),
            "{err}"
        );
    }
    for _ in 0..2 {
        assert_eq!(env.messages(large(false)).await.status(), 200);
    }
    assert_eq!(env.messages(large(false)).await.status(), 429);
    assert_eq!(env.mock.stats().requests, 2);
}
