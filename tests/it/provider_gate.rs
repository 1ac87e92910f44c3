//! A provider's admission gate as callers and operators see it: a `max_concurrency` lowered by
//! reload holds once the requests beyond it finish, and callers that stop waiting (deadline,
//! disconnect) leave the queue and its gauge at once. The mock never answers, so whatever reaches
//! it stays in flight for the test's length.

use std::time::Duration;

use crate::harness::{self, Env};

const HANG: &str = r#"{"default":{"hang":true}}"#;
const BODY: &str =
    r#"{"model":"claude-t","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;

/// A request sent in the background, with extra headers; its task aborted = its caller gone.
fn send(env: &Env, headers: &[(&'static str, &'static str)]) -> tokio::task::JoinHandle<u16> {
    let mut req = env
        .http
        .post(env.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .body(BODY);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    tokio::spawn(async move { req.send().await.unwrap().status().as_u16() })
}

/// The anthropic provider's (inflight, queued interactive) from `/admin/state`.
async fn gate(env: &Env) -> (u64, u64) {
    let v = env.admin_json("/admin/state").await;
    let p = &v["providers"]["anthropic"];
    (
        p["inflight"].as_u64().unwrap(),
        p["queued"]["interactive"].as_u64().unwrap(),
    )
}

/// Polls `/admin/state` (up to 10 s) until `done` holds for the gate, and returns it then.
async fn until_gate(env: &Env, done: impl Fn((u64, u64)) -> bool) -> (u64, u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let g = gate(env).await;
        if done(g) {
            return g;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gate stayed at {g:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn config(mock: &str, max: usize) -> String {
    harness::config_toml_with(mock, "", &format!("max_concurrency = {max}"), "")
}

#[tokio::test]
async fn a_cap_lowered_by_reload_holds_once_the_requests_beyond_it_finish() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(legate::mock::Script::from_json(HANG).unwrap()).await;
    std::fs::write(&path, config(&mock.base_url(), 3)).unwrap();
    let env = harness::start_file(mock, &path).await;

    let holders: Vec<_> = (0..3).map(|_| send(&env, &[])).collect();
    env.mock.wait_requests(3).await;
    let waiters: Vec<_> = (0..4).map(|_| send(&env, &[])).collect();
    until_gate(&env, |g| g == (3, 4)).await;

    std::fs::write(&path, config(&env.mock.base_url(), 1)).unwrap();
    let reload = env.http.post(env.admin_url("/admin/reload")).send().await;
    assert_eq!(reload.unwrap().status(), 200);
    for h in &holders {
        h.abort();
    }
    // Once the three holders' slots are given up, one waiter has the only slot.
    let (inflight, queued) = until_gate(&env, |(i, q)| i + q == 4).await;
    assert_eq!((inflight, queued), (1, 3));
    env.mock.wait_cancelled(3).await;
    env.mock.wait_requests(4).await;
    assert_eq!(env.mock.stats().inflight, 1);
    assert_eq!(
        env.metric("legate_inflight_requests", &[("provider", "anthropic")])
            .await,
        Some(1.0)
    );
    for w in waiters {
        w.abort();
    }
}

#[tokio::test]
async fn callers_that_stop_waiting_leave_the_queue_and_its_gauge_at_once() {
    let mock = harness::start_mock(legate::mock::Script::from_json(HANG).unwrap()).await;
    let toml = config(&mock.base_url(), 1);
    let env = harness::start_toml(mock, &toml).await;
    let _holder = send(&env, &[]);
    env.mock.wait_requests(1).await;
    let leavers: Vec<_> = (0..2).map(|_| send(&env, &[])).collect();
    until_gate(&env, |g| g == (1, 2)).await;

    let timed: Vec<_> = (0..3)
        .map(|_| send(&env, &[("x-legate-deadline-ms", "300")]))
        .collect();
    for t in timed {
        assert_eq!(t.await.unwrap(), 504);
    }
    // Those three left the queue as they were answered; the slot holder has not finished.
    assert_eq!(gate(&env).await, (1, 2));
    let depth = &[("priority", "interactive")];
    assert_eq!(env.metric("legate_queue_depth", depth).await, Some(2.0));

    for l in leavers {
        l.abort();
    }
    until_gate(&env, |g| g == (1, 0)).await;
    assert_eq!(env.metric("legate_queue_depth", depth).await, Some(0.0));
    assert_eq!(env.mock.stats().inflight, 1);
}

/// A background call the provider's pacer would hold past its deadline is refused at once
/// as shed (529, with the pacer's wait as `retry-after`, counted in `legate_shed_total`), a
/// refusal before any attempt that the SDK may retry, not a 504 telling it not to.
#[tokio::test]
async fn a_pace_longer_than_the_deadline_is_shed_with_its_wait() {
    let script = r#"{"default":{"headers":{"x-ratelimit-limit-requests":"100",
        "x-ratelimit-remaining-requests":"1","x-ratelimit-reset-requests":"60s"}}}"#;
    let env = harness::start_with(legate::mock::Script::from_json(script).unwrap(), "").await;
    let body = r#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(env.chat(body).await.status(), 200);
    let background = || {
        env.http
            .post(env.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-legate-priority", "background")
            .header("x-legate-deadline-ms", "20000")
            .body(body)
            .send()
    };
    // The one call left before the reset goes at once; the next would wait about 60 s.
    assert_eq!(background().await.unwrap().status(), 200);
    let shed = background().await.unwrap();
    assert_eq!(shed.status(), 529);
    let wait: u64 = shed.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((50..=60).contains(&wait), "{wait}");
    assert!(!shed.headers().contains_key("x-should-retry"));
    assert_eq!(env.mock.stats().requests, 2);
    let counted = env
        .metric("legate_shed_total", &[("priority", "background")])
        .await;
    assert_eq!(counted, Some(1.0));
}

/// A background call that wins a half-open breaker's probe is not paced: held in the pacer
/// for the provider's reset (a minute here), it kept every other caller of the target
/// refused with 529 "circuit breakers open", interactive ones included.
#[tokio::test]
async fn a_breakers_probe_is_not_held_by_the_pacer() {
    let script = r#"{"replies":[
        {"headers":{"x-ratelimit-limit-requests":"100","x-ratelimit-remaining-requests":"1",
                    "x-ratelimit-reset-requests":"60s"}},
        {},{"status":529},{"status":529}]}"#;
    let extra = "[retry]\nmax_attempts = 1\n[breaker]\nmin_calls = 2\nfailure_ratio = 0.5\nopen_for = \"200ms\"\n\
        [[models]]\nname = \"gpt-test\"\nchain = [\"openai:gpt-test\"]\n";
    let env = harness::start_with(legate::mock::Script::from_json(script).unwrap(), extra).await;
    let body = r#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
    let call = |priority: &'static str| {
        env.http
            .post(env.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-legate-priority", priority)
            .body(body)
            .send()
    };
    // The pacer's reading (one call left for a minute), and its one free slot taken.
    assert_eq!(call("interactive").await.unwrap().status(), 200);
    assert_eq!(call("background").await.unwrap().status(), 200);
    // Two failures open the breaker.
    for _ in 0..2 {
        assert_eq!(call("interactive").await.unwrap().status(), 529);
    }
    let breaker = [("provider", "openai"), ("model", "gpt-test")];
    assert_eq!(
        env.metric("legate_breaker_state", &breaker).await,
        Some(1.0)
    );
    // Once open_for has passed, a background call is the probe, sent at once.
    let probed = async {
        loop {
            let resp = call("background").await.unwrap();
            if resp.status() == 200 {
                break;
            }
            assert_eq!(resp.status(), 529);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), probed)
        .await
        .expect("the probe was held");
    assert_eq!(
        env.metric("legate_breaker_state", &breaker).await,
        Some(0.0)
    );
    assert_eq!(call("interactive").await.unwrap().status(), 200);
}
