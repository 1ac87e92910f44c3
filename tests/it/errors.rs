//! Bad input gets the documented error in the caller's API shape, nothing reaches the
//! provider, and the process keeps serving.

use crate::harness;

async fn json(resp: reqwest::Response) -> serde_json::Value {
    resp.json().await.expect("error bodies are JSON")
}

#[tokio::test]
async fn malformed_json_is_400_in_each_api_shape() {
    let env = harness::start("").await;
    let a = env.messages("{not json").await;
    assert_eq!(a.status(), 400);
    assert!(a.headers().get("x-should-retry").is_none());
    let v = json(a).await;
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["request_id"].as_str().unwrap().starts_with("lgt_"));

    let o = env.chat("[1,2").await;
    assert_eq!(o.status(), 400);
    let v = json(o).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["param"].is_null());
    assert!(v["error"]["message"].as_str().unwrap().contains("JSON"));
    assert_eq!(env.mock.stats().requests, 0);

    // Still serving.
    let ok = env
        .messages(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn missing_required_fields_are_named() {
    let env = harness::start("").await;
    let v = json(env.messages(r#"{"model":"m","messages":[]}"#).await).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens")
    );
    let v = json(env.chat(r#"{"messages":[]}"#).await).await;
    assert!(v["error"]["message"].as_str().unwrap().contains("model"));
    // An empty name is no name: no step is chosen for it, nothing is sent.
    let empty = env
        .messages(r#"{"model":"","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(empty.status(), 400);
    let v = json(empty).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`model` is empty")
    );
    let empty = env.chat(r#"{"model":"","messages":[]}"#).await;
    assert_eq!(empty.status(), 400);
    assert_eq!(env.mock.stats().requests, 0);
}

#[tokio::test]
async fn oversize_bodies_are_413_declared_or_streamed() {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml_with(&mock.base_url(), "max_body_bytes = 1000", "", "");
    let env = harness::start_toml(mock, &toml).await;
    let big = format!(
        r#"{{"model":"m","max_tokens":1,"messages":[],"pad":"{}"}}"#,
        "x".repeat(2000)
    );

    let declared = env.messages(big.clone()).await;
    assert_eq!(declared.status(), 413);
    // The body came whole with its head, so the HTTP/1 connection has nothing left to read
    // and stays open (one refused before its body arrived is read after the answer: see
    // `a_refused_upload_is_read_to_its_end_and_its_connection_serves_the_next_request`).
    assert!(declared.headers().get("connection").is_none());
    let v = json(declared).await;
    assert_eq!(v["error"]["type"], "request_too_large");

    // Chunked: no Content-Length, the limit must still hold while reading.
    let chunks: Vec<Result<String, std::io::Error>> =
        vec![Ok(big[..900].to_string()), Ok(big[900..].to_string())];
    let streamed = env
        .http
        .post(env.url("/v1/chat/completions"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 413);
    // The rest of the body is read after the answer: the connection stays open.
    assert!(streamed.headers().get("connection").is_none());
    let v = json(streamed).await;
    assert_eq!(v["error"]["code"], "request_too_large");
    assert_eq!(env.mock.stats().requests, 0);
}

#[tokio::test]
async fn unknown_paths_are_404_in_the_callers_shape() {
    let env = harness::start("").await;
    let a = env
        .http
        .post(env.url("/v1/messages/batches"))
        .header("anthropic-version", "2023-06-01")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 404);
    // Refused without reading its body, which came whole with the head: the HTTP/1 connection
    // has nothing left to read and stays open.
    assert!(a.headers().get("connection").is_none());
    let v = json(a).await;
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "not_found_error");

    let o = env
        .http
        .post(env.url("/v1/embeddings"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(o.status(), 404);
    let v = json(o).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "unknown_url");
    assert_eq!(env.mock.stats().requests, 0);
}

/// Writes a request's head and then its whole body before reading anything, as Node's
/// `fetch` does, and reads the answer: legate must take the body for this to end.
async fn upload_then_read(
    sock: &mut tokio::net::TcpStream,
    head: &str,
    body: &[u8],
) -> (String, Vec<u8>) {
    use tokio::io::AsyncWriteExt;
    let send = async {
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.write_all(body).await.unwrap();
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), send)
        .await
        .expect("legate reads the whole upload");
    let mut buf = Vec::new();
    let (head, body) = harness::read_message(sock, &mut buf)
        .await
        .expect("an answer");
    assert!(buf.is_empty(), "nothing after the answer");
    (head.to_ascii_lowercase(), body)
}

#[tokio::test]
async fn a_refused_upload_is_read_to_its_end_and_its_connection_serves_the_next_request() {
    let key_hash = harness::sha256_hex(b"team-a-secret");
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let clients = format!("[[clients]]\ntenant = \"team-a\"\nkey_sha256 = \"{key_hash}\"\n");
    let toml =
        harness::config_toml_with(&mock.base_url(), "max_body_bytes = 1000000", "", &clients);
    let env = harness::start_toml(mock, &toml).await;
    let mut sock = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    // Refused from its headers (a wrong key, an unknown route) or its declared size, each
    // before its body was read: far more than the sockets hold, so the upload only ends if
    // legate reads it.
    let big = vec![b'x'; 8 << 20];
    for (head, status) in [
        (
            "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: wrong\r\n",
            "401",
        ),
        (
            "POST /v1/nope HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: team-a-secret\r\n",
            "404",
        ),
        (
            "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: team-a-secret\r\n",
            "413",
        ),
    ] {
        let head = format!("{head}content-length: {}\r\n\r\n", big.len());
        let (answer, body) = upload_then_read(&mut sock, &head, &big).await;
        assert!(
            answer.starts_with(&format!("http/1.1 {status} ")),
            "{answer}"
        );
        assert!(!answer.contains("\r\nconnection:"), "{answer}");
        assert!(!body.is_empty());
    }
    // A chunked upload over the limit, refused while it was read: the rest is read too.
    let mut chunked = Vec::new();
    for _ in 0..64 {
        chunked.extend_from_slice(format!("{:x}\r\n", 1 << 16).as_bytes());
        chunked.extend_from_slice(&[b'y'; 1 << 16]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let head = "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: team-a-secret\r\ntransfer-encoding: chunked\r\n\r\n";
    let (answer, _) = upload_then_read(&mut sock, head, &chunked).await;
    assert!(answer.starts_with("http/1.1 413 "), "{answer}");
    assert!(!answer.contains("\r\nconnection:"), "{answer}");

    // The same connection then carries a request that is served.
    let ok = r#"{"model":"m","max_tokens":1,"messages":[]}"#;
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: team-a-secret\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        ok.len()
    );
    let (answer, _) = upload_then_read(&mut sock, &head, ok.as_bytes()).await;
    assert!(answer.starts_with("http/1.1 200 "), "{answer}");
    assert_eq!(env.mock.stats().requests, 1);
    assert_eq!(env.legate.proxy.buffers.used(), 0);
}

#[tokio::test]
async fn a_refused_upload_beyond_what_is_read_after_it_closes_the_connection_and_says_so() {
    let env = harness::start("").await;
    // A declared rest beyond what legate reads after a refusal (128 MiB): the answer says the
    // connection closes, and it does (the exchange ends only when it is closed).
    let head = format!(
        "POST /v1/nope HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n",
        legate::server::REFUSED_BODY_MAX + 1
    );
    let text = env.raw_exchange(&head).await.to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 404"), "{text}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");

    // Without a body, or once the body was read, the connection stays open.
    let bare = env.http.get(env.url("/v1/nope")).send().await.unwrap();
    assert_eq!(bare.status(), 404);
    assert!(bare.headers().get("connection").is_none());
    let read = env.messages("{not json").await;
    assert_eq!(read.status(), 400);
    assert!(read.headers().get("connection").is_none());
    let ok = env
        .messages(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(ok.status(), 200);
    assert!(ok.headers().get("connection").is_none());
    assert_eq!(env.mock.stats().requests, 1);
}

#[tokio::test]
async fn unknown_client_keys_are_401_when_clients_are_configured() {
    use sha2::Digest;
    let key_hash = hex::encode(sha2::Sha256::digest(b"team-a-secret"));
    let env = harness::start(&format!(
        "[[clients]]\ntenant = \"team-a\"\nkey_sha256 = \"{key_hash}\"\n"
    ))
    .await;
    let body = r#"{"model":"m","max_tokens":1,"messages":[]}"#;
    let bad = env.messages(body).await;
    assert_eq!(bad.status(), 401);
    assert_eq!(json(bad).await["error"]["type"], "authentication_error");
    let bad_openai = env.chat(r#"{"model":"m","messages":[]}"#).await;
    assert_eq!(bad_openai.status(), 401);
    assert_eq!(json(bad_openai).await["error"]["code"], "invalid_api_key");
    assert_eq!(env.mock.stats().requests, 0);

    for (name, value) in [
        ("x-api-key", "team-a-secret"),
        ("authorization", "Bearer team-a-secret"),
    ] {
        let ok = env
            .http
            .post(env.url("/v1/messages"))
            .header(name, value)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200, "{name}");
    }
    let n = env
        .metric(
            "legate_requests_total",
            &[("tenant", "team-a"), ("status", "200")],
        )
        .await;
    assert_eq!(n, Some(2.0));
    // The journal names the tenant of each, as the metric does.
    let listed = env.admin_json("/admin/requests?tenant=team-a").await;
    let listed = listed["requests"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|r| r["tenant"] == "team-a"), "{listed:?}");
    let reqs = env.mock.requests();
    assert!(
        reqs.iter()
            .all(|r| !format!("{:?}", r.headers).contains("team-a-secret"))
    );
}

#[tokio::test]
async fn unreachable_upstream_is_502_without_sdk_retries() {
    // A port that was just free: nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap();
    drop(free);
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml(&format!("http://{addr}"), "");
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .messages(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    assert_eq!(resp.headers()["x-legate-attempts"], "3");
    assert_eq!(json(resp).await["error"]["type"], "api_error");
    let n = env
        .metric(
            "legate_upstream_attempts_total",
            &[("outcome", "connect_error")],
        )
        .await;
    assert_eq!(n, Some(3.0), "max_attempts connection attempts, then 502");
}

#[tokio::test]
async fn first_byte_timeout_is_504_and_cancels_the_upstream_call() {
    let mock = harness::start_mock(
        legate::mock::Script::from_json(r#"{"default":{"hang":true}}"#).unwrap(),
    )
    .await;
    let toml = harness::config_toml_with(&mock.base_url(), "", "", "").replace(
        "first_byte_timeout = \"5s\"",
        "first_byte_timeout = \"200ms\"",
    );
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .messages(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    // Each timed-out attempt is cancelled upstream, not left hanging.
    env.mock.wait_cancelled(3).await;
    let n = env
        .metric("legate_upstream_attempts_total", &[("outcome", "timeout")])
        .await;
    assert_eq!(n, Some(3.0));
}

#[tokio::test]
async fn an_admin_path_asked_with_another_method_is_405_with_the_one_it_takes() {
    let env = harness::start("").await;
    for (method, path, allow) in [
        ("GET", "/admin/reload", "POST"),
        ("POST", "/metrics", "GET, HEAD"),
        ("DELETE", "/admin/requests/lgt_1", "GET, HEAD"),
    ] {
        let resp = env
            .http
            .request(method.parse().unwrap(), env.admin_url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method} {path}");
        assert_eq!(resp.headers()["allow"], allow);
    }
    assert_eq!(
        env.metric("legate_config_reloads_total", &[("result", "ok")])
            .await,
        Some(0.0)
    );
    // HEAD is GET without the body.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let resp = env.http.head(env.admin_url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "HEAD {path}");
        let declared: usize = resp.headers()["content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(declared > 0, "HEAD {path}");
    }
    let unknown = env
        .http
        .get(env.admin_url("/admin/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
}

/// Writes `head` on a connection of its own and reads until legate closes it.
async fn raw_exchange(env: &harness::Env, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    sock.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A head the connection refuses before any route could see it is still a request: answered
/// in the caller's shape under a request id, logged in the journal, and counted.
#[tokio::test]
async fn a_refused_head_is_answered_recorded_and_counted() {
    let env = harness::start("").await;
    let heads: [(&str, u16); 3] = [
        (
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
            400,
        ),
        ("POST /v1/chat/completions HTTP/1.2\r\nhost: x\r\n\r\n", 505),
        (
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            501,
        ),
    ];
    for (head, status) in heads {
        let answer = raw_exchange(&env, head).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{answer}"
        );
        let rid = answer
            .lines()
            .find_map(|l| l.strip_prefix("x-legate-request-id: "))
            .unwrap_or_else(|| panic!("no request id: {answer}"));
        let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
        assert_eq!(doc["status"], status, "{doc}");
        assert_eq!(doc["error_type"], "bad_head", "{doc}");
        assert_eq!(doc["method"], "POST", "{doc}");
        assert_eq!(doc["attempts"], 0, "{doc}");
        let code = status.to_string();
        assert_eq!(
            env.metric("legate_requests_total", &[("status", code.as_str())])
                .await,
            Some(1.0),
            "{status}"
        );
    }
    assert_eq!(env.mock.stats().requests, 0);
}

/// A method is any token the caller chooses: a 60,000-character one is answered (404) with
/// its message, its journal entry and its access-log line kept to a bounded part of it.
#[tokio::test]
async fn a_huge_method_is_repeated_and_recorded_only_in_part() {
    let env = harness::start("").await;
    let method = "X".repeat(60_000);
    let head = format!(
        "{method} /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    let answer = raw_exchange(&env, &head).await;
    assert!(
        answer.starts_with("HTTP/1.1 404 "),
        "{}",
        &answer[..200.min(answer.len())]
    );
    assert!(answer.len() < 2_000, "{} bytes", answer.len());
    let rid = answer
        .lines()
        .find_map(|l| l.strip_prefix("x-legate-request-id: "))
        .unwrap_or_else(|| panic!("no request id: {answer}"));
    let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
    assert_eq!(doc["method"], "X".repeat(16), "{doc}");
}
