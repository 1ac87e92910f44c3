//! Request bodies count against one global bound while they are read and held (SPEC §14:
//! `max_buffered_bytes`): beyond it new requests are shed with 529, and the share comes back
//! when a request is done.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness;

fn body_of(len: usize) -> String {
    let head = r#"{"model":"claude-b","max_tokens":8,"messages":[{"role":"user","content":""#;
    let tail = r#""}]}"#;
    format!("{head}{}{tail}", "a".repeat(len - head.len() - tail.len()))
}

#[tokio::test]
async fn bodies_beyond_max_buffered_bytes_are_shed_with_529_until_the_share_comes_back() {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml_with(
        &mock.base_url(),
        "max_buffered_bytes = 100000\nmax_body_bytes = 100000\n",
        "",
        "",
    );
    let env = harness::start_toml(mock, &toml).await;

    // A slow upload declares 80 kB and sends part of it.
    let big = body_of(80_000);
    let mut slow = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        big.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&big.as_bytes()[..1000]).await.unwrap();

    // Another 30 kB does not fit beside it: 529 overloaded, nothing sent upstream.
    let small = body_of(30_000);
    let shed = async {
        loop {
            let resp = env.messages(small.clone()).await;
            if resp.status() == 529 {
                return resp;
            }
        }
    };
    let resp = tokio::time::timeout(Duration::from_secs(10), shed)
        .await
        .expect("a request beyond the bound is shed");
    assert!(resp.headers().contains_key("retry-after"));
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");
    // Counted as shed, as the admission queue's 529s are.
    let shed = env
        .metric("legate_shed_total", &[("priority", "interactive")])
        .await;
    assert_eq!(shed, Some(1.0));
    let served_before = env.mock.stats().requests;

    // The slow upload completes and is served; its share comes back.
    slow.write_all(&big.as_bytes()[1000..]).await.unwrap();
    let mut answer = Vec::new();
    slow.read_to_end(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    assert_eq!(env.mock.stats().requests, served_before + 1);
    assert_eq!(env.messages(small).await.status(), 200);
    assert_eq!(env.legate.proxy.buffers.used(), 0);
}

/// A whole Anthropic answer of about `len` bytes, with usage.
fn answer_of(len: usize) -> String {
    let text = "z".repeat(len);
    format!(
        r#"{{"id":"msg_b","type":"message","role":"assistant","model":"claude-b","content":[{{"type":"text","text":"{text}"}}],"stop_reason":"end_turn","stop_sequence":null,"usage":{{"input_tokens":5,"output_tokens":7}}}}"#
    )
}

/// Waits (up to 10 s) until the answers legate holds come to `want`.
async fn wait_used(env: &harness::Env, want: impl Fn(usize) -> bool) {
    let buffers = env.legate.proxy.answers.clone();
    let wait = async {
        while !want(buffers.used()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("held bytes stayed at {}", buffers.used()));
}

/// An answer held whole counts against a bound of `max_buffered_bytes` of its own until the
/// caller's connection has written it: a caller that asks for a large answer and does not read
/// it holds that share after its request is done. Meanwhile a translated answer, which must be
/// held, is shed with 529 without a retry; a passthrough answer is passed on as it comes; an
/// error body is replaced by legate's own; request bodies still have the whole bound. Once the
/// caller reads, the share comes back.
#[tokio::test]
async fn answers_held_for_a_caller_count_against_max_buffered_bytes_until_written() {
    // More than the kernel's socket buffers take, so that legate holds part.
    let answer = send_buffer_max() + (2 << 20);
    let up = crate::rawup::start(move |req| {
        let reply = if String::from_utf8_lossy(&req.body).contains("\"fail\"") {
            let body = format!(r#"{{"type":"error","error":{{"type":"invalid_request_error","message":"{}"}}}}"#, "e".repeat(900_000));
            format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        } else {
            crate::rawup::json_reply(&answer_of(answer))
        };
        async move { crate::rawup::Action::Reply(reply) }
    })
    .await;
    let env = room_for_one(&up.url, answer, "xl").await;
    let ask = r#"{"model":"claude-b","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

    // A caller that takes nothing of its answer (a small receive window, never read).
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut idle = sock.connect(env.legate.data_addr).await.unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\ncontent-length: {}\r\n\r\n{ask}",
        ask.len()
    );
    idle.write_all(head.as_bytes()).await.unwrap();
    wait_used(&env, |used| used >= answer).await;
    env.wait_metric(
        "legate_inflight_requests",
        &[("provider", "anthropic")],
        0.0,
    )
    .await;

    // A translated answer cannot be held beside it: shed, the upstream called once for it.
    let xl = r#"{"model":"xl","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = env.chat(xl).await;
    assert_eq!(resp.status(), 529);
    assert!(resp.headers().contains_key("retry-after"));
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    let said = v["error"]["message"].as_str().unwrap();
    assert!(
        said.contains("bodies as server.max_buffered_bytes"),
        "{said}"
    );
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
    // The provider answered: the attempt counts as `ok` (with the idle caller's), not as a
    // call never made.
    let attempts = [
        ("provider", "anthropic"),
        ("model", "claude-b"),
        ("outcome", "ok"),
    ];
    assert_eq!(
        env.metric("legate_upstream_attempts_total", &attempts)
            .await,
        Some(2.0)
    );

    // Request bodies have a bound of their own: a large one is still taken.
    assert_eq!(env.messages(body_of(800_000)).await.status(), 200);

    // A passthrough answer is passed on as it comes, whole.
    let resp = env.messages(ask).await;
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["content"][0]["text"].as_str().map(str::len), Some(answer));

    // An error body too large to hold beside it is replaced by legate's own, status kept.
    let fail =
        r#"{"model":"claude-b","max_tokens":8,"messages":[{"role":"user","content":"fail"}]}"#;
    let resp = env.messages(fail).await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    let said = v["error"]["message"].as_str().unwrap();
    assert!(said.contains("could not read whole"), "{said}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 5);

    // The caller reads its answer: all of it arrives, and its share comes back.
    let mut got = Vec::new();
    let want = head_len_and(answer);
    while got.len() < want {
        let mut buf = vec![0u8; 1 << 16];
        let n = idle.read(&mut buf).await.unwrap();
        assert!(n > 0, "the answer was cut after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    wait_used(&env, |used| used == 0).await;
    let resp = env.chat(xl).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 6);
}

/// legate in front of `url` with room for one answer of `answer` bytes held (and some), and
/// `alias` a model translated to the Anthropic upstream's `claude-b`.
async fn room_for_one(url: &str, answer: usize, alias: &str) -> harness::Env {
    let models = format!("[[models]]\nname = \"{alias}\"\nchain = [\"anthropic:claude-b\"]\n");
    let toml = harness::config_toml_with(
        url,
        &format!(
            "max_buffered_bytes = {0}\nmax_body_bytes = {0}\n",
            answer + 700_000
        ),
        "",
        &models,
    );
    harness::start_alone(&toml).await
}

/// The most a socket's send buffer grows to (`tcp_wmem`'s maximum; 4 MiB if unreadable).
fn send_buffer_max() -> usize {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(4 << 20)
}

/// The least an answer of `len` text bytes takes on the wire, head included.
fn head_len_and(len: usize) -> usize {
    answer_of(len).len() + "HTTP/1.1 200 OK\r\n\r\n".len()
}

/// A translated answer refused for want of memory was still made by the provider: the
/// tenant's reservation stands (the next request of the same size does not fit its minute),
/// as for any answer whose usage is unknown.
#[tokio::test]
async fn a_translated_answer_refused_for_memory_keeps_its_reservation() {
    let up = crate::rawup::start(|_req| async {
        crate::rawup::Action::Reply(crate::rawup::json_reply(&answer_of(200_000)))
    })
    .await;
    let extra = "[[models]]\nname = \"xl\"\nchain = [\"anthropic:claude-b\"]\n[tenants.default]\ntokens_per_minute = 1000\n";
    let toml = harness::config_toml_with(
        &up.url,
        "max_buffered_bytes = 100000\nmax_body_bytes = 100000\n",
        "",
        extra,
    );
    let env = harness::start_alone(&toml).await;
    let xl = r#"{"model":"xl","max_tokens":600,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(env.chat(xl).await.status(), 529);
    assert_eq!(env.chat(xl).await.status(), 429);
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(env.legate.proxy.answers.used(), 0);
}

/// A stored response answered whole counts with the answers held for callers: a caller that
/// asks for a large one and does not read it holds its share, and past the bound the next is
/// refused with 529 instead of being copied once more (one copy per request, without bound,
/// before). Once the caller reads, the share comes back.
#[tokio::test]
async fn a_stored_response_read_back_counts_with_the_answers_held() {
    let answer = send_buffer_max() + (2 << 20);
    let up = crate::rawup::start(move |_| async move {
        crate::rawup::Action::Reply(crate::rawup::json_reply(&answer_of(answer)))
    })
    .await;
    let env = room_for_one(&up.url, answer, "xr").await;
    let resp = env
        .http
        .post(env.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(r#"{"model":"xr","input":"hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    let id = v["id"].as_str().unwrap().to_owned();
    wait_used(&env, |used| used == 0).await;

    // A caller that takes nothing of the stored response it asked for.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut idle = sock.connect(env.legate.data_addr).await.unwrap();
    let head = format!("GET /v1/responses/{id} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    idle.write_all(head.as_bytes()).await.unwrap();
    wait_used(&env, |used| used >= answer).await;

    let get = || env.http.get(env.url(&format!("/v1/responses/{id}"))).send();
    let resp = get().await.unwrap();
    assert_eq!(resp.status(), 529);
    assert!(resp.headers().contains_key("retry-after"));
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "overloaded", "{v}");

    // The caller reads it: all of it arrives, the share comes back, and the next is served.
    let mut got = Vec::new();
    let whole = |got: &[u8]| {
        let text = String::from_utf8_lossy(got);
        let (head, body) = text.split_once("\r\n\r\n")?;
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))?
            .parse()
            .ok()?;
        Some(body.len() >= length)
    };
    while whole(&got) != Some(true) {
        let mut buf = vec![0u8; 1 << 16];
        let n = idle.read(&mut buf).await.unwrap();
        assert!(n > 0, "the answer was cut after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert!(got.len() > answer);
    wait_used(&env, |used| used == 0).await;
    let resp = get().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["id"], id.as_str());
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// With several tenants, no tenant's request bodies hold more than half of
/// `max_buffered_bytes`: one that declares large bodies and never sends them is refused past
/// its half, and another tenant's requests still fit.
#[tokio::test]
async fn one_tenant_cannot_take_the_whole_body_budget() {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let clients = format!(
        "[[clients]]\ntenant = \"team-a\"\nkey_sha256 = \"{}\"\n[[clients]]\ntenant = \"team-b\"\nkey_sha256 = \"{}\"\n",
        harness::sha256_hex(b"key-a"),
        harness::sha256_hex(b"key-b"),
    );
    let toml = harness::config_toml_with(
        &mock.base_url(),
        "max_buffered_bytes = 200000\nmax_body_bytes = 50000\n",
        "",
        &clients,
    );
    let env = harness::start_toml(mock, &toml).await;
    // team-a declares four 45 kB bodies and sends none of their bytes.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut c = tokio::net::TcpStream::connect(env.legate.data_addr)
            .await
            .unwrap();
        let head = "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: key-a\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\ncontent-length: 45000\r\n\r\n";
        c.write_all(head.as_bytes()).await.unwrap();
        held.push(c);
    }
    // Two fit in its half (100 kB); the other two are refused at once.
    let answers = held.iter_mut().map(|c| async move {
        let mut buf = vec![0u8; 64];
        match tokio::time::timeout(Duration::from_secs(3), c.read(&mut buf)).await {
            Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            _ => String::new(),
        }
    });
    let answers = futures_util::future::join_all(answers).await;
    let refused = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 529"))
        .count();
    assert_eq!(refused, 2, "{answers:?}");
    assert_eq!(env.legate.proxy.buffers.used(), 90_000);
    // team-b's body still fits beside them, and is served.
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("x-api-key", "key-b")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(body_of(45_000))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    drop(held);
}
