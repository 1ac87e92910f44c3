//! legate's upstream connections, seen from the provider: one kept-alive connection carries
//! sequential requests, concurrent requests open one each, and those are reused afterwards
//! instead of new ones being opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::harness;
use crate::rawup::{self, Action, RawRequest};

const BODY: &str =
    r#"{"model":"claude-p","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

const MESSAGE: &str = r#"{"id":"msg_p","type":"message","role":"assistant","model":"claude-p","content":[{"type":"text","text":"fine"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":3}}"#;

#[tokio::test]
async fn upstream_connections_are_reused_and_only_concurrency_opens_more() {
    // While `together` is set, the upstream answers nothing until four requests are waiting.
    let together = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(tokio::sync::Barrier::new(4));
    let (t, b) = (together.clone(), barrier.clone());
    let up = rawup::start(move |_req: RawRequest| {
        let wait = t.load(Ordering::SeqCst).then(|| b.clone());
        async move {
            if let Some(b) = wait {
                b.wait().await;
            }
            Action::Reply(rawup::json_reply(MESSAGE))
        }
    })
    .await;
    let toml = harness::config_toml_with(&up.url, "", "", "");
    let env = harness::start_alone(&toml).await;

    for i in 0..10 {
        let resp = env.messages(BODY).await;
        assert_eq!(resp.status(), 200, "request {i}");
        assert!(resp.text().await.unwrap().contains("fine"));
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 10);
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        1,
        "one kept-alive connection"
    );

    together.store(true, Ordering::SeqCst);
    let (a, b, c, d) = tokio::join!(
        env.messages(BODY),
        env.messages(BODY),
        env.messages(BODY),
        env.messages(BODY)
    );
    for resp in [a, b, c, d] {
        assert_eq!(resp.status(), 200);
    }
    together.store(false, Ordering::SeqCst);
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        4,
        "four at once: the kept one and three new"
    );

    for i in 0..10 {
        assert_eq!(env.messages(BODY).await.status(), 200, "request {i} after");
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 24);
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        4,
        "no new connection"
    );
}

#[tokio::test]
async fn each_worker_keeps_its_own_upstream_connections() {
    let up =
        rawup::start(|_req: RawRequest| async { Action::Reply(rawup::json_reply(MESSAGE)) }).await;
    let toml = harness::config_toml_with(&up.url, "worker_threads = 2", "", "");
    let env = harness::start_alone(&toml).await;
    // Two callers, one kept-alive connection each: the second connection goes to the other
    // worker, whose requests do not take the first worker's idle upstream connection.
    let callers = [client(), client()];
    for round in 0..4 {
        for (i, http) in callers.iter().enumerate() {
            let resp = env.messages_via(http, BODY).await;
            assert_eq!(resp.status(), 200, "round {round}, caller {i}");
            assert!(resp.text().await.unwrap().contains("fine"));
        }
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 8);
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        2,
        "one upstream connection per worker, each reused"
    );
    let state = env.admin_json("/admin/state").await;
    assert_eq!(state["runtime"]["worker_threads"], 2);
}

/// A caller with one kept-alive connection.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap()
}

/// The header lines of a request head, in order, without the request line.
fn header_lines(head: &str) -> Vec<String> {
    head.lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_upstream_request_ends_with_its_host_and_carries_the_length_of_the_body_sent() {
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    let up = rawup::start(move |req: RawRequest| {
        seen.lock().unwrap().push((req.head, req.body.len()));
        async { Action::Reply(rawup::json_reply(MESSAGE)) }
    })
    .await;
    let extra =
        "[[models]]\nname = \"longer\"\nchain = [\"anthropic:claude-p-with-a-longer-name\"]\n";
    let toml = harness::config_toml_with(&up.url, "", "", extra);
    let env = harness::start_alone(&toml).await;

    // Sent as it came (the caller's length is the body's), then with a longer model spliced in.
    assert_eq!(env.messages(BODY).await.status(), 200);
    let aliased = BODY.replace("claude-p", "longer");
    assert_eq!(env.messages(aliased).await.status(), 200);

    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2);
    let host = up.url.trim_start_matches("http://");
    let sent = [
        BODY.len(),
        BODY.replace("claude-p", "claude-p-with-a-longer-name")
            .len(),
    ];
    for ((head, body_len), want) in heads.iter().zip(sent) {
        assert_eq!(*body_len, want);
        let lines = header_lines(head);
        let n = lines.len();
        assert!(n >= 2, "{head}");
        assert_eq!(lines[n - 1], format!("host: {host}"), "{head}");
        // legate writes the length (the caller's own value when the body kept its length),
        // hyper adds none of its own: exactly one, the body's.
        let lengths: Vec<&String> = lines
            .iter()
            .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
            .collect();
        assert_eq!(lengths, [&format!("content-length: {want}")], "{head}");
    }
}

#[tokio::test]
async fn a_callers_lines_reach_the_provider_as_the_caller_wrote_them() {
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    let up = rawup::start(move |req: RawRequest| {
        seen.lock().unwrap().push(req.head);
        async { Action::Reply(rawup::json_reply(MESSAGE)) }
    })
    .await;
    let toml = harness::config_toml_with(&up.url, "", "", "");
    let env = harness::start_alone(&toml).await;
    // An SDK's spelling and spacing, between lines that do not go on.
    let lines = "User-Agent: Anthropic/Python 2.14.0\r\nX-Stainless-Lang:python\r\n\
        anthropic-version:  2023-06-01\r\nContent-Type: application/json\r\n";
    let raw = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: client-dummy-key\r\n{lines}\
         Connection: close\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let answer = env.raw_exchange(&raw).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1);
    let head = &heads[0];
    assert!(head.contains(&format!("\r\n{lines}")), "{head}");
    let keys: Vec<String> = header_lines(head)
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().starts_with("x-api-key:"))
        .collect();
    assert_eq!(keys, [format!("x-api-key: {}", harness::ANTHROPIC_KEY)]);
    assert!(!head.contains("client-dummy"), "{head}");
}
