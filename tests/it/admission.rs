//! Admission control: tenant request and token limits with reservation and settlement, daily
//! budgets in exact pico-dollars, the priority queue that sheds batch work first, and pacing on
//! the provider's rate-limit headers.

use std::time::Duration;

use tokio::time::Instant;

use crate::harness::{self, Env};

const BODY: &str =
    r#"{"model":"claude-t","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

async fn json(resp: reqwest::Response) -> serde_json::Value {
    resp.json().await.unwrap()
}

#[tokio::test]
async fn the_request_past_the_per_minute_limit_is_refused_in_each_api_shape() {
    let env = harness::start("[tenants.default]\nrequests_per_minute = 3\n").await;
    for _ in 0..3 {
        assert_eq!(env.messages(BODY).await.status(), 200);
    }
    let refused = env.messages(BODY).await;
    assert_eq!(refused.status(), 429);
    let h = refused.headers().clone();
    assert!(
        h.get("x-should-retry").is_none(),
        "a local refusal may be retried by the SDK later"
    );
    let secs: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    let ms: u64 = h["retry-after-ms"].to_str().unwrap().parse().unwrap();
    // One request per 20 s at 3/min.
    assert!((19_000..=20_000).contains(&ms), "{ms}");
    assert_eq!(secs, ms.div_ceil(1000));
    let v = json(refused).await;
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");

    let o = env.chat(r#"{"model":"gpt-t","messages":[]}"#).await;
    assert_eq!(o.status(), 429);
    assert!(o.headers().get("retry-after").is_some());
    let v = json(o).await;
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(
        env.mock.stats().requests,
        3,
        "refusals never reach the provider"
    );
    let n = env
        .metric(
            "legate_ratelimit_rejections_total",
            &[("tenant", "default"), ("limit", "requests")],
        )
        .await;
    assert_eq!(n, Some(2.0));
}

#[tokio::test]
async fn a_reservation_that_can_never_fit_is_a_400() {
    let env = harness::start("[tenants.default]\ntokens_per_minute = 1000\n").await;
    let resp = env
        .messages(r#"{"model":"claude-t","max_tokens":5000,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 400);
    let v = json(resp).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1000 tokens per minute")
    );
    assert_eq!(env.mock.stats().requests, 0);
    // A refusal by the tenant's tokens limit, counted with the 429s.
    let refused = env
        .metric(
            "legate_ratelimit_rejections_total",
            &[("tenant", "default"), ("limit", "tokens")],
        )
        .await;
    assert_eq!(refused, Some(1.0));
}

/// An image's base64 counts in the estimate as what the provider bills for an image (1,600
/// tokens at most), not as text: a 200 KB image was 50,000 tokens, past a tenant's whole
/// minute, and a 400 for ever. A text prompt that size still can never fit (a 400). An OpenAI
/// caller that sends no `max_tokens` to a tenant whose minute is below
/// `default_output_reservation` is served (it was a 400 naming a `max_tokens` it never sent).
#[tokio::test]
async fn an_image_is_estimated_as_an_image_and_text_as_text() {
    let env = harness::start("[tenants.default]\ntokens_per_minute = 10000\n").await;
    let image = "iVBORw0KGgo".repeat(20_000);
    let body = format!(
        r#"{{"model":"claude-t","max_tokens":10,"messages":[{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data": "{image}"}}}}]}}]}}"#
    );
    let first = env.messages(body).await;
    assert_eq!(first.status(), 200);
    let _ = first.bytes().await.unwrap();
    let text = "hello ".repeat(40_000);
    let body = format!(
        r#"{{"model":"claude-t","max_tokens":10,"messages":[{{"role":"user","content":"{text}"}}]}}"#
    );
    let refused = env.messages(body).await;
    assert_eq!(refused.status(), 400);
    assert_eq!(env.mock.stats().requests, 1);

    let env = harness::start("[tenants.default]\ntokens_per_minute = 2000\n").await;
    let chat = env
        .chat(r#"{"model":"gpt-t","messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(chat.status(), 200);
    assert_eq!(env.mock.stats().requests, 1);
}

async fn settles(stream: bool) {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"usage":{"input_tokens":10,"output_tokens":5}}}"#,
        )
        .unwrap(),
        "[tenants.default]\ntokens_per_minute = 1000\n",
    )
    .await;
    let body = format!(
        r#"{{"model":"claude-t","max_tokens":900,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let first = env.messages(body.clone()).await;
    assert_eq!(first.status(), 200);
    let _ = first.bytes().await.unwrap();
    // Without settlement the bucket would hold ~100 tokens and this would be refused; the
    // refund of the unused reservation makes it fit.
    let second = env.messages(body).await;
    assert_eq!(second.status(), 200, "stream={stream}");
    let ratio = env
        .metric(
            "legate_token_estimate_ratio_count",
            &[("provider", "anthropic")],
        )
        .await;
    assert!(
        ratio.unwrap_or(0.0) >= 1.0,
        "the estimate's error is exported"
    );
}

#[tokio::test]
async fn settlement_refunds_the_unused_reservation() {
    settles(false).await;
}

#[tokio::test]
async fn a_streams_usage_is_settled_too() {
    settles(true).await;
}

#[tokio::test]
async fn the_daily_budget_refuses_at_the_exact_pico_dollar() {
    // 10 input + 5 output tokens at 3 / 15 USD per Mtok = 105 micro-USD per request.
    let prices = "[[prices]]\nmodel = \"anthropic:claude-t\"\ninput = \"3\"\noutput = \"15\"\n";
    let script = r#"{"default":{"usage":{"input_tokens":10,"output_tokens":5}}}"#;
    // One pico-dollar short of two requests: the second still fits, the third does not.
    let env = harness::start_with(
        legate::mock::Script::from_json(script).unwrap(),
        &format!("[tenants.default]\ndaily_budget_usd = \"0.000209999999\"\n{prices}"),
    )
    .await;
    assert_eq!(env.messages(BODY).await.status(), 200);
    assert_eq!(env.messages(BODY).await.status(), 200);
    let refused = env.messages(BODY).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(json(refused).await["error"]["type"], "rate_limit_error");
    let n = env
        .metric("legate_ratelimit_rejections_total", &[("limit", "budget")])
        .await;
    assert_eq!(n, Some(1.0));

    // Exactly two requests' worth: spent == budget refuses the third as well.
    let env = harness::start_with(
        legate::mock::Script::from_json(script).unwrap(),
        &format!("[tenants.default]\ndaily_budget_usd = \"0.00021\"\n{prices}"),
    )
    .await;
    assert_eq!(env.messages(BODY).await.status(), 200);
    assert_eq!(env.messages(BODY).await.status(), 200);
    assert_eq!(env.messages(BODY).await.status(), 429);
}

/// Waits (up to 10 s) until the mock has received `n` requests: a poll of the count itself.
async fn until_mock_saw(env: &Env, n: u64) {
    let wait = async {
        while env.mock.stats().requests < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("the mock never saw {n} requests"));
}

#[tokio::test]
async fn requests_in_flight_hold_their_cost_against_the_daily_budget() {
    // BODY asks for 100 output tokens at 15 USD per Mtok: each request holds about 1.5 milli-USD
    // (its estimated input too, at 3 USD per Mtok) while in flight. Two fit in 4, three do not.
    let prices = "[[prices]]\nmodel = \"anthropic:claude-t\"\ninput = \"3\"\noutput = \"15\"\n";
    let env = harness::start_with(
        legate::mock::Script::from_json(r#"{"default":{"hang":true}}"#).unwrap(),
        &format!("[tenants.default]\ndaily_budget_usd = \"0.004\"\n{prices}"),
    )
    .await;
    // Two requests the provider never answers, sent one after the other.
    let mut held = Vec::new();
    for n in 1..=2 {
        let client = reqwest::Client::new();
        let url = env.url("/v1/messages");
        held.push(tokio::spawn(async move {
            let _ = client.post(url).body(BODY).send().await;
        }));
        until_mock_saw(&env, n).await;
    }
    // Bounded: admitted, it would hang like the others.
    let refused = tokio::time::timeout(Duration::from_secs(10), env.messages(BODY))
        .await
        .expect("the third request is refused at once, not sent");
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let v = json(refused).await;
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("held by its requests in flight"),
        "{message}"
    );
    assert_eq!(
        env.mock.stats().requests,
        2,
        "the refusal reached no provider"
    );
    let n = env
        .metric("legate_ratelimit_rejections_total", &[("limit", "budget")])
        .await;
    assert_eq!(n, Some(1.0));
    let state = env.admin_json("/admin/state").await;
    let hold: u128 = state["buckets"]["local"]["default"]["held_pico_usd"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((3_000_000_000..3_100_000_000).contains(&hold), "{hold}");

    // Their callers give up: what they held is released, and nothing was spent.
    for h in held {
        h.abort();
    }
    let released = async {
        loop {
            let state = env.admin_json("/admin/state").await;
            if state["buckets"]["local"]["default"]["held_pico_usd"] == "0" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), released)
        .await
        .expect("the holds are released once their callers are gone");
    env.script(r#"{"default":{"usage":{"input_tokens":10,"output_tokens":100}}}"#);
    assert_eq!(env.messages(BODY).await.status(), 200);
}

#[tokio::test]
async fn each_client_key_gets_its_own_tenants_limits() {
    use sha2::Digest;
    let h = |k: &str| hex::encode(sha2::Sha256::digest(k.as_bytes()));
    let env = harness::start(&format!(
        "[[clients]]\ntenant = \"team-a\"\nkey_sha256 = \"{}\"\n[[clients]]\ntenant = \"team-b\"\nkey_sha256 = \"{}\"\n[tenants.team-a]\nrequests_per_minute = 1\n[tenants.team-b]\nrequests_per_minute = 5\n",
        h("key-a"),
        h("key-b")
    ))
    .await;
    let send = |key: &'static str| {
        let http = env.http.clone();
        let url = env.url("/v1/messages");
        async move {
            http.post(url)
                .header("x-api-key", key)
                .body(BODY)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(send("key-a").await, 200);
    assert_eq!(send("key-a").await, 429);
    for _ in 0..3 {
        assert_eq!(send("key-b").await, 200);
    }
    let n = env
        .metric("legate_ratelimit_rejections_total", &[("tenant", "team-a")])
        .await;
    assert_eq!(n, Some(1.0));
}

async fn queued(env: &Env, priority: &str) -> u64 {
    let v: serde_json::Value = env.admin_json("/admin/state").await;
    v["providers"]["anthropic"]["queued"][priority]
        .as_u64()
        .unwrap()
}

async fn wait_queued(env: &Env, priority: &str, n: u64) {
    let wait = async {
        while queued(env, priority).await < n {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("requests queued");
}

fn send_with_priority(env: &Env, priority: &'static str) -> tokio::task::JoinHandle<u16> {
    let http = env.http.clone();
    let url = env.url("/v1/messages");
    tokio::spawn(async move {
        http.post(url)
            .header("anthropic-version", "2023-06-01")
            .header("x-legate-priority", priority)
            .body(BODY)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    })
}

#[tokio::test]
async fn a_full_queue_sheds_batch_first_and_serves_every_interactive_call() {
    let mock = harness::start_mock(
        legate::mock::Script::from_json(r#"{"default":{"delay_ms":300}}"#).unwrap(),
    )
    .await;
    let toml = harness::config_toml_with(
        &mock.base_url(),
        "",
        "max_concurrency = 1",
        "[shedding]\nqueue_limit = 2\n",
    );
    let env = harness::start_toml(mock, &toml).await;

    let holder = send_with_priority(&env, "interactive");
    env.mock.wait_requests(1).await;
    let b1 = send_with_priority(&env, "batch");
    wait_queued(&env, "batch", 1).await;
    let b2 = send_with_priority(&env, "batch");
    wait_queued(&env, "batch", 2).await;
    // The queue is full: a third batch call is shed at once.
    let b3 = send_with_priority(&env, "batch").await.unwrap();
    assert_eq!(b3, 529);
    // An interactive call displaces the newest batch call instead of being shed.
    let i1 = send_with_priority(&env, "interactive");
    assert_eq!(b2.await.unwrap(), 529);
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(i1.await.unwrap(), 200);
    assert_eq!(b1.await.unwrap(), 200);
    assert_eq!(env.mock.stats().requests, 3);
    assert_eq!(
        env.metric("legate_shed_total", &[("priority", "batch")])
            .await,
        Some(2.0)
    );
    assert_eq!(env.metric("legate_queue_depth", &[]).await, Some(0.0));
}

#[tokio::test]
async fn a_low_upstream_rate_limit_spaces_batch_calls_but_not_interactive_ones() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"headers":{"x-ratelimit-limit-requests":"100","x-ratelimit-remaining-requests":"4","x-ratelimit-reset-requests":"2s"}}}"#,
        )
        .unwrap(),
        "",
    )
    .await;
    // The first answer tells legate that 4% of the limit is left, resetting in 2 s.
    assert_eq!(send_with_priority(&env, "interactive").await.unwrap(), 200);
    let ratio = env
        .metric(
            "legate_upstream_ratelimit_remaining_ratio",
            &[("provider", "anthropic"), ("kind", "requests")],
        )
        .await;
    assert_eq!(ratio, Some(0.04));

    let started = Instant::now();
    let batch: Vec<_> = (0..3)
        .map(|_| {
            let h = send_with_priority(&env, "batch");
            async move {
                let s = h.await.unwrap();
                (s, started.elapsed())
            }
        })
        .collect();
    let interactive = async {
        let s = send_with_priority(&env, "interactive").await.unwrap();
        (s, started.elapsed())
    };
    let (batch, interactive) = tokio::join!(futures_util::future::join_all(batch), interactive);
    let mut times: Vec<Duration> = batch
        .iter()
        .map(|(s, t)| {
            assert_eq!(*s, 200);
            *t
        })
        .collect();
    times.sort();
    assert_eq!(interactive.0, 200);
    // 4 calls left over ~2 s: batch calls go out spaced apart (about 500 ms, less once part of
    // the reset window has passed), never all at once; measured between the calls themselves so
    // a slow start of the test does not count.
    assert!(
        times[2] - times[0] >= Duration::from_millis(600),
        "{times:?}"
    );
    assert!(
        interactive.1 < times[1],
        "interactive {:?} waited behind batch {times:?}",
        interactive.1
    );
}

/// A provider reporting absurd usage (2^64 − 1 output tokens) is counted for the output the
/// request asked for at most (`max_tokens`; 2^24 tokens when it named none): no provider
/// writes more. Counted as 2^24, one report cost more than many a daily budget and left the
/// tenant locked out (of its budget until midnight, of its tokens for a minute); now the next
/// request is served.
#[tokio::test]
async fn absurd_reported_usage_is_bounded_and_cannot_lock_a_tenant_out() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"usage":{"input_tokens":10,"output_tokens":18446744073709551615}}}"#,
        )
        .unwrap(),
        "[tenants.default]\ntokens_per_minute = 1000\n",
    )
    .await;
    let body =
        r#"{"model":"claude-t","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let first = env.messages(body).await;
    assert_eq!(first.status(), 200);
    let _ = first.bytes().await.unwrap();
    assert_eq!(
        env.metric("legate_tokens_total", &[("kind", "output")])
            .await,
        Some(100.0)
    );
    let second = env.messages(body).await;
    assert_eq!(second.status(), 200);
    let _ = second.bytes().await.unwrap();
    assert_eq!(env.mock.stats().requests, 2);
}

/// Batch calls the pacer holds back (the provider's rate limit is low) wait in places of the
/// queue: `legate_queue_depth` counts them and `queue_limit` bounds them, a call past it shed
/// at once. They were invisible (depth 0) and unbounded, every one of them waiting its slot.
#[tokio::test]
async fn calls_held_by_the_pacer_count_as_queued_and_are_bounded() {
    let mock = harness::start_mock(
        legate::mock::Script::from_json(
            r#"{"default":{"headers":{"x-ratelimit-limit-requests":"100","x-ratelimit-remaining-requests":"4","x-ratelimit-reset-requests":"30s"}}}"#,
        )
        .unwrap(),
    )
    .await;
    let toml = harness::config_toml_with(&mock.base_url(), "", "", "[shedding]\nqueue_limit = 2\n");
    let env = harness::start_toml(mock, &toml).await;
    // The first answer tells legate that 4 calls are left until the reset, 30 s away; the
    // first batch call takes the first slot at once.
    assert_eq!(send_with_priority(&env, "interactive").await.unwrap(), 200);
    assert_eq!(send_with_priority(&env, "batch").await.unwrap(), 200);
    // The next two wait for their slots (7.5 s and 15 s away), holding both places.
    let _held = [
        send_with_priority(&env, "batch"),
        send_with_priority(&env, "batch"),
    ];
    wait_queued(&env, "batch", 2).await;
    assert_eq!(send_with_priority(&env, "batch").await.unwrap(), 529);
    assert_eq!(
        env.metric("legate_shed_total", &[("priority", "batch")])
            .await,
        Some(1.0)
    );
    assert_eq!(env.mock.stats().requests, 2);
}

/// A caller that leaves a stream after its first content has seen only `message_start`'s
/// usage (the input and one output token). The provider bills what it generated all the
/// same, so the request keeps its whole reservation: settled with the part alone, a caller
/// leaving every stream early passed any tokens-per-minute limit.
#[tokio::test]
async fn a_stream_left_before_its_final_usage_keeps_its_reservation() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"event_gap_ms":300,"usage":{"input_tokens":10,"output_tokens":800},
                "content":[{"type":"text","text":"a b c d e f g h"}]}}"#,
        )
        .unwrap(),
        "[tenants.default]\ntokens_per_minute = 1000\n",
    )
    .await;
    let body = r#"{"model":"claude-t","max_tokens":900,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    // Over a socket of its own, read up to the first content, then closed.
    let mut sock = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut sock, head.as_bytes())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("text_delta") {
        let n = tokio::io::AsyncReadExt::read(&mut sock, &mut buf)
            .await
            .unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    drop(sock);
    env.wait_metric("legate_requests_total", &[("status", "499")], 1.0)
        .await;
    // About 900 of the 1,000 tokens stay taken: another such request does not fit.
    let refused = env.messages(body).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(env.mock.stats().requests, 1);
}
