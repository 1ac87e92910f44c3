//! Edge paths of the request lifecycle: what a caller leaving, an upstream's odd headers, an
//! unusable chain step or a reload must never break or leak.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness;

const BODY: &str =
    r#"{"model":"claude-r","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn callers_leaving_before_the_answer_leave_no_inflight_count_behind() {
    let env = harness::start_with(
        legate::mock::Script::from_json(r#"{"default":{"delay_ms":2000}}"#).unwrap(),
        "",
    )
    .await;
    for _ in 0..3 {
        let call = tokio::spawn({
            let http = env.http.clone();
            let url = env.url("/v1/messages");
            async move {
                let _ = http.post(url).body(BODY).send().await;
            }
        });
        let seen = env.mock.stats().requests + 1;
        env.mock.wait_requests(seen).await;
        call.abort();
    }
    env.mock.wait_cancelled(3).await;
    env.wait_metric("legate_requests_total", &[("status", "499")], 3.0)
        .await;
    assert_eq!(
        env.metric("legate_inflight_requests", &[("provider", "anthropic")])
            .await,
        Some(0.0)
    );
}

#[tokio::test]
async fn a_caller_leaving_mid_upload_is_a_499_not_a_400() {
    let env = harness::start("").await;
    let mut sock = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    sock.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":\"m\"")
        .await
        .unwrap();
    sock.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = sock.read_to_end(&mut rest).await;
    env.wait_metric("legate_requests_total", &[("status", "499")], 1.0)
        .await;
    assert_eq!(
        env.metric("legate_requests_total", &[("status", "400")])
            .await,
        None
    );
}

#[tokio::test]
async fn absurd_rate_limit_and_retry_headers_do_not_break_requests() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"replies":[{"status":529,"headers":{"retry-after-ms":"1e300"}}],
                "default":{"headers":{"x-ratelimit-limit-requests":"18446744073709551615","x-ratelimit-remaining-requests":"1","x-ratelimit-reset-requests":"99999999999999999999s"}}}"#,
        )
        .unwrap(),
        "[retry]\nmax_retry_after = \"1s\"\n",
    )
    .await;
    // The 529's retry-after is far beyond max_retry_after: no wait, no panic, an answer.
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 529);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    // The pacer reads a nonsensical limit and reset without overflowing.
    for _ in 0..2 {
        let resp = env
            .http
            .post(env.url("/v1/messages"))
            .header("x-legate-priority", "batch")
            .body(BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
}

#[tokio::test]
async fn an_invalid_request_error_event_before_content_is_final_and_never_falls_back() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"stream_error_after":1,"error_type":"invalid_request_error","error_message":"bad block"}}"#,
        )
        .unwrap(),
        "[[models]]\nname = \"large\"\nchain = [\"anthropic:claude-a\", \"anthropic:claude-b\"]\n",
    )
    .await;
    let resp = env
        .messages(r#"{"model":"large","max_tokens":8,"stream":true,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    assert_eq!(resp.headers()["x-legate-served-by"], "anthropic:claude-a");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(env.mock.stats().requests, 1);
    assert_eq!(env.metric("legate_fallbacks_total", &[]).await, None);
}

#[tokio::test]
async fn a_served_stream_without_usage_keeps_its_token_reservation() {
    let env = harness::start_with(
        legate::mock::Script::from_json(
            r#"{"default":{"usage":{"input_tokens":50,"output_tokens":900},"cut_after":3}}"#,
        )
        .unwrap(),
        "[tenants.default]\ntokens_per_minute = 1000\n",
    )
    .await;
    // An OpenAI stream cut after its content, before the usage chunk, reports no usage at
    // all: the reservation (estimate + max_tokens) must stand, not be refunded.
    let body = r#"{"model":"gpt-r","max_tokens":500,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let first = env.chat(body).await;
    assert_eq!(first.status(), 200);
    let _ = first.text().await.unwrap();
    let second = env.chat(body).await;
    assert_eq!(second.status(), 429);
}

#[tokio::test]
async fn a_step_without_a_key_is_skipped_for_the_next_one() {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml(
        &mock.base_url(),
        "[providers.spare]\nkind = \"anthropic\"\nbase_url = \"{MOCK}\"\napi_key_env = \"UNSET_KEY_FOR_TEST\"\n[[models]]\nname = \"large\"\nchain = [\"spare:claude-a\", \"anthropic:claude-b\"]\n",
    );
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .messages(r#"{"model":"large","max_tokens":8,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-served-by"], "anthropic:claude-b");
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
}

#[tokio::test]
async fn a_reload_never_lets_more_than_max_concurrency_through() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(
        legate::mock::Script::from_json(r#"{"default":{"delay_ms":400}}"#).unwrap(),
    )
    .await;
    std::fs::write(
        &path,
        harness::config_toml_with(&mock.base_url(), "", "max_concurrency = 1", ""),
    )
    .unwrap();
    let env = harness::start_file(mock, &path).await;
    let first = tokio::spawn({
        let http = env.http.clone();
        let url = env.url("/v1/messages");
        async move {
            http.post(url)
                .body(BODY)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    env.mock.wait_requests(1).await;
    let reload = env
        .http
        .post(env.admin_url("/admin/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 200);
    let second = tokio::spawn({
        let http = env.http.clone();
        let url = env.url("/v1/messages");
        async move {
            http.post(url)
                .body(BODY)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    // The second call waits in the same gate the first one holds, across the reload.
    let queued = async {
        loop {
            let v: serde_json::Value = env.admin_json("/admin/state").await;
            if v["providers"]["anthropic"]["queued"]["interactive"] == 1 {
                assert_eq!(v["providers"]["anthropic"]["inflight"], 1);
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the second call queued behind the first");
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(second.await.unwrap(), 200);
    assert_eq!(env.mock.stats().requests, 2);
}

/// A provider whose answer head is not HTTP/1.1 (a bad status line, a head past the limit)
/// is not "unreachable": after the retries the caller is told its answer could not be read,
/// 502 `upstream_answer_unusable` naming the reason, not that legate could not connect.
#[tokio::test]
async fn a_malformed_upstream_head_is_named_as_such_not_as_a_connect_failure() {
    let huge = format!(
        "HTTP/1.1 200 OK\r\nx-pad: {}\r\ncontent-length: 0\r\n\r\n",
        "p".repeat(200 << 10)
    );
    let cases = [
        (
            "HTTP/1.1 2000 OK\r\ncontent-length: 0\r\n\r\n".to_string(),
            "malformed",
        ),
        (huge, "too large"),
    ];
    for (reply, why) in cases {
        let (env, up) = crate::rawup::behind(reply.into_bytes()).await;
        let resp = env.messages(BODY).await;
        assert_eq!(resp.status(), 502);
        let v: serde_json::Value = resp.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("response head could not be read"),
            "{message}"
        );
        assert!(message.contains(why), "{message}");
        assert!(!message.contains("could not connect"), "{message}");
        assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}

/// A 204 (with or without a body named), 205 or redirection answers no generation: the caller
/// gets 502 `upstream_answer_unusable` after the retries, never an empty success or a redirection
/// its SDK would follow past legate.
#[tokio::test]
async fn a_success_without_content_or_a_redirection_is_unusable() {
    for reply in [
        "HTTP/1.1 204 No Content\r\n\r\n",
        "HTTP/1.1 204 No Content\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
        "HTTP/1.1 205 Reset Content\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:1/\r\ncontent-length: 0\r\n\r\n",
    ] {
        let (env, up) = crate::rawup::behind(reply.as_bytes().to_vec()).await;
        let resp = env.messages(BODY).await;
        assert_eq!(resp.status(), 502, "{reply}");
        assert!(resp.headers().get("location").is_none());
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["type"], "api_error", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("carries no answer"), "{message}");
        assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}

/// A caller that asked for a stream and got a whole JSON body would read a stream that ended
/// cleanly with nothing in it. The answer is a failure instead: retried, then 502 saying why,
/// and the caller sees an error, never an empty success.
#[tokio::test]
async fn a_whole_body_answering_a_stream_request_is_a_failure_not_an_empty_stream() {
    let message = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-r","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}"#;
    let (env, up) = crate::rawup::behind(crate::rawup::json_reply(message)).await;
    let stream = r#"{"model":"claude-r","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = env.messages(stream).await;
    assert_eq!(resp.status(), 502);
    let v: serde_json::Value = resp.json().await.unwrap();
    let text = v["error"]["message"].as_str().unwrap();
    assert!(text.contains("a stream was asked for"), "{text}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    // Asked without a stream, the same answer is served.
    let whole = env.messages(BODY).await;
    assert_eq!(whole.status(), 200);
    assert!(whole.text().await.unwrap().contains("msg_1"));
}

/// The other way round: an upstream (a gateway that ignores `"stream": false`) answering a
/// request for a whole answer with an event stream. Relayed, it reached the caller as a 200
/// its SDK could not parse as JSON; it is a failure instead, retried, then 502 saying why.
#[tokio::test]
async fn an_event_stream_answering_a_whole_request_is_a_failure_not_relayed() {
    let events = crate::rawup::anthropic_stream("hi");
    let up = crate::rawup::start(move |_req| {
        let reply = crate::rawup::reply_of("text/event-stream", &events);
        async move { crate::rawup::Action::Reply(reply) }
    })
    .await;
    let retry = "[retry]\nbase_delay = \"1ms\"\nmax_delay = \"2ms\"\n";
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", retry)).await;
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "api_error", "{v}");
    let text = v["error"]["message"].as_str().unwrap();
    assert!(text.contains("a whole answer was asked for"), "{text}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    // Asked for as a stream, the same answer is served, event for event.
    let stream = r#"{"model":"claude-r","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let streamed = env.messages(stream).await;
    assert_eq!(streamed.status(), 200);
    let text = streamed.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 4);
}

/// An upstream that answers the first request with `head` and `first`, then writes `chunk`
/// every `every` (at once when zero) until legate lets the connection go or `cap` bytes are
/// written. Resolves with the bytes written.
async fn endless_answer(
    head: &'static str,
    first: Vec<u8>,
    chunk: Vec<u8>,
    every: Duration,
    cap: usize,
) -> (String, tokio::task::JoinHandle<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let writer = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).ends_with('}') {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return 0,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        if sock.write_all(head.as_bytes()).await.is_err() || sock.write_all(&first).await.is_err() {
            return 0;
        }
        let mut written = 0;
        while written < cap {
            if !every.is_zero() {
                tokio::time::sleep(every).await;
            }
            if sock.write_all(&chunk).await.is_err() {
                break;
            }
            written += chunk.len();
        }
        written
    });
    (url, writer)
}

/// legate in front of `url`, the request's deadline 2 s; the caller's answer, read to its end
/// or its break, and how long that took.
async fn read_within_deadline(url: &str, body: &str) -> (u16, Vec<u8>, Duration) {
    let env = harness::start_alone(&harness::config_toml_with(url, "", "", "")).await;
    let started = std::time::Instant::now();
    let mut resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("content-type", "application/json")
        .header("x-legate-deadline-ms", "2000")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(c)) = resp.chunk().await {
            got.extend_from_slice(&c);
        }
    });
    read.await
        .expect("the answer ends or breaks by the deadline");
    (status, got, started.elapsed())
}

/// A whole answer too large to hold (over 16 MiB) is passed on as it comes, its status
/// already sent; the request's deadline still bounds it: a body that never ends is cut there,
/// instead of flowing for as long as the upstream writes.
#[tokio::test]
async fn a_whole_answer_passed_through_is_still_bounded_by_the_deadline() {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    let mut chunk = format!("{:x}\r\n", 1 << 20).into_bytes();
    chunk.extend(std::iter::repeat_n(b'x', 1 << 20));
    chunk.extend_from_slice(b"\r\n");
    let (url, upstream) = endless_answer(head, Vec::new(), chunk, Duration::ZERO, 64 << 30).await;
    let (status, got, took) = read_within_deadline(&url, BODY).await;
    assert_eq!(status, 200);
    assert!(
        got.len() > 16 << 20,
        "passed on past the hold: {}",
        got.len()
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    let written = upstream.await.unwrap();
    assert!(written < 64 << 30, "the upstream was let go: {written}");
}

/// A stream whose preamble (pings before any content) outgrows what legate holds back is
/// committed before its first content; the deadline for that content still holds, and the
/// caller gets an error event then, not pings for as long as the upstream sends them.
#[tokio::test]
async fn a_stream_committed_before_its_content_is_still_held_to_the_deadline() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
    let ping = format!(
        "event: ping\ndata: {{\"type\":\"ping\",\"pad\":\"{}\"}}\n\n",
        "p".repeat(4000)
    );
    // 300 KiB of pings at once (past the 256 KiB held), then one every 50 ms for up to 40 s.
    let burst = ping.repeat(75).into_bytes();
    let every = Duration::from_millis(50);
    let (url, upstream) = endless_answer(head, burst, ping.into_bytes(), every, 800 << 10).await;
    let stream = r#"{"model":"claude-r","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let (status, got, took) = read_within_deadline(&url, stream).await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.contains("request deadline"),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    drop(upstream);
}

/// An error body over the 1 MiB legate reads is not passed on as an empty body under a JSON
/// content type: the status stays, and the body says, in the caller's shape, what happened.
#[tokio::test]
async fn an_error_body_too_large_to_read_is_replaced_by_one_that_says_so() {
    let huge = format!(
        r#"{{"type":"error","error":{{"type":"invalid_request_error","message":"{}"}}}}"#,
        "m".repeat(2 << 20)
    );
    let reply = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{huge}",
        huge.len()
    );
    let (env, up) = crate::rawup::behind(reply.into_bytes()).await;
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let text = v["error"]["message"].as_str().unwrap();
    assert!(text.contains("could not read whole"), "{text}");
    // Named as every error legate writes in the Anthropic shape is.
    assert_eq!(v["request_id"], rid.as_str());
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A 2xx answer that is not JSON (a gateway's HTML page passed on with 200) is no answer: it was
/// passed to the caller as a success labelled `application/json`, which the SDKs then failed
/// to parse, and the breaker counted a success. Now it is an unusable answer on every try, as
/// it already was on a translated step, and the caller gets the 502 that says so.
#[tokio::test]
async fn a_success_answer_that_is_not_json_is_unusable_and_retried() {
    let page = "<html><body><h1>502 Bad Gateway</h1></body></html>";
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{page}",
        page.len()
    );
    let (env, up) = crate::rawup::behind(reply.into_bytes()).await;
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-legate-attempts"], "3");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "api_error");
    let text = v["error"]["message"].as_str().unwrap();
    assert!(text.contains("not JSON"), "{text}");
    assert!(text.contains("text/html"), "{text}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    let unusable = env
        .metric(
            "legate_upstream_attempts_total",
            &[("provider", "anthropic"), ("outcome", "retryable")],
        )
        .await;
    assert_eq!(unusable, Some(3.0));
}

/// The same on the small Responses endpoints forwarded as they are (a stored response fetched
/// from the provider): a 200 HTML page was passed on as the caller's success.
#[tokio::test]
async fn a_forwarded_success_answer_that_is_not_json_is_unusable() {
    let page = "<html><body><h1>502 Bad Gateway</h1></body></html>";
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{page}",
        page.len()
    );
    let (env, up) = crate::rawup::behind(reply.into_bytes()).await;
    let resp = env
        .http
        .get(env.url("/v1/responses/resp_elsewhere"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "server_error");
    let text = v["error"]["message"].as_str().unwrap();
    assert!(text.contains("not JSON"), "{text}");
    assert!(text.contains("text/html"), "{text}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A stored response's events asked for again (`GET …?stream=true`, how an SDK resumes a
/// background response) are an event stream: the provider's replay is passed on. It was
/// refused as a success answer that is not JSON.
#[tokio::test]
async fn a_stored_responses_replayed_stream_is_passed_on() {
    let events = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":0,\"response\":{\"id\":\"resp_bg\",\"status\":\"completed\",\"output\":[]}}\n\n";
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{events}",
        events.len()
    );
    let (env, up) = crate::rawup::behind(reply.into_bytes()).await;
    let get = |query: &'static str| {
        env.http
            .get(env.url(&format!("/v1/responses/resp_bg{query}")))
            .send()
    };
    let resp = get("?stream=true&starting_after=3").await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), events);
    // Not asked for as a stream, the same answer is still no JSON answer.
    assert_eq!(get("").await.unwrap().status(), 502);
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A caller still uploading when `shutdown_grace` runs out gets 503 `shutting_down`, as a
/// request still waiting for its answer does; its read was not told of the shutdown, and the
/// connection was dropped without a word when the process exited.
#[tokio::test]
async fn an_upload_cut_by_shutdown_is_answered_503() {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml_with(&mock.base_url(), "body_read_timeout = \"30s\"\n", "", "")
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"200ms\"");
    let env = harness::start_toml(mock, &toml).await;
    let mut caller = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    let head = "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\ncontent-length: 100\r\nexpect: 100-continue\r\n\r\n";
    caller.write_all(head.as_bytes()).await.unwrap();
    // `100 Continue` comes once the request's body is being read.
    let mut got = vec![0; 25];
    caller.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[..], b"HTTP/1.1 100 Continue\r\n\r\n");
    caller.write_all(b"{\"model\":").await.unwrap();
    let harness::Env {
        legate, registry, ..
    } = env;
    let stopping = tokio::spawn(legate.shutdown());
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), caller.read_to_end(&mut answer))
        .await
        .expect("answered before the body read's own timeout")
        .unwrap();
    stopping.await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("shutting_down") || answer.contains("shutdown"),
        "{answer}"
    );
    let metrics = legate::telemetry::render(&registry);
    assert_eq!(
        harness::metric_value(&metrics, "legate_requests_total", &[("status", "503")]),
        Some(1.0),
        "{metrics}"
    );
}

/// A request still waiting for its turn when `shutdown_grace` runs out is not sent once the
/// requests ahead of it are cut: it is answered 503 as never sent (no `x-should-retry: false`,
/// no attempt), so its SDK sends it again to the replica taking over.
#[tokio::test]
async fn a_request_queued_at_the_end_of_the_grace_is_not_sent() {
    let script = legate::mock::Script::from_json(r#"{"default":{"delay_ms":20000}}"#).unwrap();
    let mock = harness::start_mock(script).await;
    let toml = harness::config_toml_with(&mock.base_url(), "", "max_concurrency = 1\n", "")
        .replace(
            "first_byte_timeout = \"5s\"",
            "first_byte_timeout = \"30s\"",
        )
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"300ms\"");
    let env = harness::start_toml(mock, &toml).await;
    let send = |env: &harness::Env| {
        let req = env
            .http
            .post(env.url("/v1/messages"))
            .body(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#);
        tokio::spawn(async move { req.send().await.unwrap() })
    };
    let first = send(&env);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while env.mock.stats().requests == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = send(&env);
    let queued = [("priority", "interactive")];
    env.wait_metric("legate_queue_depth", &queued, 1.0).await;
    let harness::Env { legate, mock, .. } = env;
    legate.shutdown().await;
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status(), 503);
    assert_eq!(first.headers()["x-legate-attempts"], "1");
    assert_eq!(first.headers()["x-should-retry"], "false");
    assert_eq!(second.status(), 503);
    assert!(second.headers().get("x-legate-attempts").is_none());
    assert!(second.headers().get("x-should-retry").is_none());
    assert_eq!(second.headers()["retry-after"], "1");
    assert_eq!(mock.stats().requests, 1);
}

/// A whole answer delimited by the connection's close (no length, no chunked coding) cannot be
/// told from one cut where the connection broke, except by its JSON: one whose JSON does not
/// end is a cut answer (retried, then 502), not a success relayed with half its body. One whose
/// JSON ends is served.
#[tokio::test]
async fn an_answer_ended_by_its_connection_must_be_whole_json() {
    const MESSAGE: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-r","content":[{"type":"text","text":"fine"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":3}}"#;
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let c = cut.clone();
    let up = crate::rawup::start(move |_req| {
        let body = if c.load(std::sync::atomic::Ordering::SeqCst) {
            &MESSAGE[..40]
        } else {
            MESSAGE
        };
        let reply =
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{body}").into_bytes();
        async move { crate::rawup::Action::ReplyAndClose(reply) }
    })
    .await;
    let retry = "[retry]\nbase_delay = \"1ms\"\nmax_delay = \"2ms\"\n";
    let env = harness::start_alone(&harness::config_toml_with(&up.url, "", "", retry)).await;
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-legate-attempts"], "3");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "api_error", "{v}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    cut.store(false, std::sync::atomic::Ordering::SeqCst);
    let resp = env.messages(BODY).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), MESSAGE);
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 4);
}
