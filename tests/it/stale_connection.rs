//! The keep-alive race (SPEC §6): a request that fails on a reused pooled connection before any
//! byte of its answer is sent once more on a fresh connection at once, and is not an attempt —
//! not in `x-legate-attempts`, not in the retry metrics, not against the breaker. Exactly once,
//! and only then: a fresh connection's failure, or one after part of an answer, stays an
//! ordinary attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::harness::{self, Env};
use crate::rawup::{self, Action, RawRequest};

const BODY: &str =
    r#"{"model":"claude-r","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

const MESSAGE: &str = r#"{"id":"msg_r","type":"message","role":"assistant","model":"claude-r","content":[{"type":"text","text":"fine"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":3}}"#;

/// Caller requests sent before a reused connection is met: the pool may open a second
/// connection while the first is still being handed back, so reuse is waited for, boundedly.
const TRIES: usize = 50;

async fn legate_against(url: &str, max_attempts: u32) -> Env {
    let extra = format!(
        "[retry]\nmax_attempts = {max_attempts}\nbase_delay = \"10ms\"\nmax_delay = \"20ms\"\n"
    );
    let toml = harness::config_toml_with(url, "", "", &extra);
    harness::start_alone(&toml).await
}

/// An upstream that answers every request, except that the first request to arrive on an
/// already used connection gets `fault` instead. `hit` tells whether that happened.
async fn faulty_on_reuse(fault: fn() -> Action) -> (rawup::RawUpstream, Arc<AtomicBool>, Seen) {
    let hit = Arc::new(AtomicBool::new(false));
    let seen = Seen::default();
    let (h, s) = (hit.clone(), seen.clone());
    let up = rawup::start(move |req: RawRequest| {
        s.lock().unwrap().push((req.head.clone(), req.body.clone()));
        let fire = req.on_conn > 0 && !h.swap(true, Ordering::SeqCst);
        async move {
            if fire {
                fault()
            } else {
                Action::Reply(rawup::json_reply(MESSAGE))
            }
        }
    })
    .await;
    (up, hit, seen)
}

/// Every request's head and body, in arrival order.
type Seen = Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

/// Sends requests until one met a reused connection (`hit`), within [`TRIES`]: how many were
/// sent, and the last one's answer.
async fn until_reused(env: &Env, hit: &AtomicBool) -> (usize, reqwest::Response) {
    let mut sent = 0;
    let mut last = None;
    while !hit.load(Ordering::SeqCst) && sent < TRIES {
        last = Some(env.messages(BODY).await);
        sent += 1;
    }
    assert!(
        hit.load(Ordering::SeqCst),
        "no request ever reused a connection"
    );
    (sent, last.expect("a request was sent"))
}

async fn metric_or_zero(env: &Env, name: &str, labels: &[(&str, &str)]) -> f64 {
    env.metric(name, labels).await.unwrap_or(0.0)
}

#[tokio::test]
async fn a_reused_connection_closed_without_an_answer_is_retried_once_and_costs_no_attempt() {
    let (up, hit, seen) = faulty_on_reuse(|| Action::Close).await;
    let env = legate_against(&up.url, 1).await;
    let mut sent = 0;
    while !hit.load(Ordering::SeqCst) && sent < TRIES {
        let resp = env.messages(BODY).await;
        sent += 1;
        assert_eq!(resp.status(), 200, "request {sent}");
        assert_eq!(resp.headers()["x-legate-attempts"], "1", "request {sent}");
        assert!(resp.text().await.unwrap().contains("fine"));
    }
    assert!(
        hit.load(Ordering::SeqCst),
        "no request ever reused a connection"
    );
    // Every caller request reached the upstream once, and the one that met the closed
    // connection once more, on a new connection.
    assert_eq!(up.requests.load(Ordering::SeqCst), sent + 1);
    assert!(up.connections.load(Ordering::SeqCst) >= 2);
    // The request sent again is the very request the closed connection swallowed.
    {
        let seen = seen.lock().unwrap();
        let [.., lost, again] = &seen[..] else {
            panic!("fewer than two requests");
        };
        assert_eq!(lost, again);
        assert!(again.1 == BODY.as_bytes(), "the body sent again differs");
    }
    assert_eq!(metric_or_zero(&env, "legate_retries_total", &[]).await, 0.0);
    let attempts = "legate_upstream_attempts_total";
    assert_eq!(
        metric_or_zero(&env, attempts, &[("outcome", "ok")]).await,
        sent as f64
    );
    assert_eq!(
        metric_or_zero(&env, attempts, &[("outcome", "connect_error")]).await,
        0.0
    );
}

#[tokio::test]
async fn a_reused_connection_reset_after_the_request_is_retried_once_too() {
    let (up, hit, _) = faulty_on_reuse(|| Action::Reset).await;
    let env = legate_against(&up.url, 1).await;
    let mut sent = 0;
    while !hit.load(Ordering::SeqCst) && sent < TRIES {
        let resp = env.messages(BODY).await;
        sent += 1;
        assert_eq!(resp.status(), 200, "request {sent}");
        assert_eq!(resp.headers()["x-legate-attempts"], "1", "request {sent}");
    }
    assert!(
        hit.load(Ordering::SeqCst),
        "no request ever reused a connection"
    );
    assert_eq!(up.requests.load(Ordering::SeqCst), sent + 1);
}

#[tokio::test]
async fn a_reused_connection_that_held_the_request_before_closing_is_an_attempt() {
    // The provider reads the request, works on it longer than the race window (a worker that
    // died mid-generation), and closes without a byte: it may have run it, so it is not sent
    // again unseen; the attempt loop's own retry is the only other send, and is counted.
    let hit = Arc::new(AtomicBool::new(false));
    let h = hit.clone();
    let up = rawup::start(move |req: RawRequest| {
        let fire = req.on_conn > 0 && !h.swap(true, Ordering::SeqCst);
        async move {
            if fire {
                tokio::time::sleep(std::time::Duration::from_millis(400)).await;
                Action::Close
            } else {
                Action::Reply(rawup::json_reply(MESSAGE))
            }
        }
    })
    .await;
    let env = legate_against(&up.url, 2).await;
    let (sent, last) = until_reused(&env, &hit).await;
    assert_eq!(last.status(), 200);
    assert_eq!(last.headers()["x-legate-attempts"], "2");
    // The held request once, and once more as the second attempt: not a hidden third.
    assert_eq!(up.requests.load(Ordering::SeqCst), sent + 1);
    assert_eq!(metric_or_zero(&env, "legate_retries_total", &[]).await, 1.0);
}

#[tokio::test]
async fn the_fresh_connection_is_tried_once_only() {
    // The reused connection closes unanswered, and so does the fresh one after it.
    let fails = Arc::new(AtomicUsize::new(0));
    let seen_reuse = Arc::new(AtomicBool::new(false));
    let (f, s) = (fails.clone(), seen_reuse.clone());
    let up = rawup::start(move |req: RawRequest| {
        let fail = if req.on_conn > 0 && !s.swap(true, Ordering::SeqCst) {
            true
        } else {
            // The request right after the stale one, on its new connection.
            s.load(Ordering::SeqCst) && f.load(Ordering::SeqCst) == 1
        };
        if fail {
            f.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            if fail {
                Action::Close
            } else {
                Action::Reply(rawup::json_reply(MESSAGE))
            }
        }
    })
    .await;
    let env = legate_against(&up.url, 1).await;
    let mut sent = 0;
    let mut last = 200;
    while !seen_reuse.load(Ordering::SeqCst) && sent < TRIES {
        last = env.messages(BODY).await.status().as_u16();
        sent += 1;
    }
    assert!(
        seen_reuse.load(Ordering::SeqCst),
        "no request ever reused a connection"
    );
    assert_eq!(
        last, 502,
        "the fresh connection's failure is an ordinary one"
    );
    assert_eq!(fails.load(Ordering::SeqCst), 2);
    assert_eq!(up.requests.load(Ordering::SeqCst), sent + 1);
}

#[tokio::test]
async fn a_reused_connection_that_sent_part_of_an_answer_is_not_sent_again() {
    let (up, hit, _) = faulty_on_reuse(|| {
        Action::ReplyAndClose(b"HTTP/1.1 200 OK\r\ncontent-type: application/js".to_vec())
    })
    .await;
    let env = legate_against(&up.url, 1).await;
    let mut sent = 0;
    let mut last = 200;
    while !hit.load(Ordering::SeqCst) && sent < TRIES {
        last = env.messages(BODY).await.status().as_u16();
        sent += 1;
    }
    assert!(
        hit.load(Ordering::SeqCst),
        "no request ever reused a connection"
    );
    assert_eq!(last, 502);
    assert_eq!(up.requests.load(Ordering::SeqCst), sent);
}

#[tokio::test]
async fn a_fresh_connection_closed_without_an_answer_is_an_ordinary_attempt() {
    let up = rawup::start(|req: RawRequest| async move {
        if req.conn == 0 {
            Action::Close
        } else {
            Action::Reply(rawup::json_reply(MESSAGE))
        }
    })
    .await;

    // With one attempt allowed, the caller gets the failure; nothing was sent twice.
    let env = legate_against(&up.url, 1).await;
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(up.requests.load(Ordering::SeqCst), 1);
    // The provider had the request: the message does not say legate could not connect.
    let v: serde_json::Value = resp.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("closed or failed after legate began sending the request"),
        "{message}"
    );
    drop(env);

    // With two, the second attempt serves it, and counts as one.
    let up = rawup::start(|req: RawRequest| async move {
        if req.conn == 0 {
            Action::Close
        } else {
            Action::Reply(rawup::json_reply(MESSAGE))
        }
    })
    .await;
    let env = legate_against(&up.url, 2).await;
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "2");
    assert_eq!(up.requests.load(Ordering::SeqCst), 2);
    assert_eq!(metric_or_zero(&env, "legate_retries_total", &[]).await, 1.0);
}

/// The request sent again after the race must go on a fresh connection; when none can be had
/// (the provider went down with the request), the failure is the reused connection's, after
/// sending: the answer and the journal say the request went out, not that legate could not
/// connect.
#[tokio::test]
async fn a_race_whose_fresh_connection_is_refused_reports_the_request_as_sent() {
    let (up, hit, _) = faulty_on_reuse(|| Action::CloseAndStopListening).await;
    let env = legate_against(&up.url, 1).await;
    let (sent, resp) = until_reused(&env, &hit).await;
    assert_eq!(resp.status(), 502);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("after legate began sending the request"),
        "{text}"
    );
    // Each caller request reached the provider once: the one the race met is not sent again.
    assert_eq!(up.requests.load(Ordering::SeqCst), sent);
}
