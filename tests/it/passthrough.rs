//! What reaches the provider is exactly what the caller sent (bytes, headers), with one
//! provider credential and never the caller's; what comes back carries the provider's headers.

use crate::harness::{self, ANTHROPIC_KEY, OPENAI_KEY, header_values, sha256_hex};

/// Unknown fields, odd key order, escapes and whitespace that a re-serialiser would change.
const ODD_BODY: &str = "{ \"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 \\\"q\\\" \\n\"}],\n  \"zz_future_field\": {\"b\":1,\"a\":[1.50, 2e3]},\"max_tokens\" :64, \"model\":\"claude-test\",\"metadata\":{\"user_id\":null} }";

#[tokio::test]
async fn body_is_forwarded_byte_for_byte_with_one_provider_credential() {
    let env = harness::start("").await;
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("x-api-key", "client-dummy-key")
        .header("authorization", "Bearer client-dummy-token")
        .header("anthropic-version", "2026-10-21")
        .header("anthropic-beta", "feature-a,feature-b")
        .header("x-stainless-retry-count", "0")
        .header("user-agent", "Anthropic/Python 2.14.0")
        .header("content-type", "application/json")
        .header("x-legate-priority", "batch")
        .body(ODD_BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(r.body_sha256, sha256_hex(ODD_BODY.as_bytes()));
    assert_eq!(r.body.as_ref(), ODD_BODY.as_bytes());
    assert_eq!(header_values(&r.headers, "x-api-key"), vec![ANTHROPIC_KEY]);
    assert!(header_values(&r.headers, "authorization").is_empty());
    assert_eq!(
        header_values(&r.headers, "anthropic-version"),
        vec!["2026-10-21"]
    );
    assert_eq!(
        header_values(&r.headers, "anthropic-beta"),
        vec!["feature-a,feature-b"]
    );
    assert_eq!(
        header_values(&r.headers, "x-stainless-retry-count"),
        vec!["0"]
    );
    assert_eq!(
        header_values(&r.headers, "user-agent"),
        vec!["Anthropic/Python 2.14.0"]
    );
    assert!(header_values(&r.headers, "x-legate-priority").is_empty());
    let all = format!("{:?}", r.headers);
    assert!(
        !all.contains("client-dummy"),
        "caller credential leaked upstream: {all}"
    );
}

#[tokio::test]
async fn openai_calls_get_exactly_one_bearer_credential() {
    let env = harness::start("").await;
    let body = r#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
    let resp = env.chat(body).await;
    assert_eq!(resp.status(), 200);
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].body.as_ref(), body.as_bytes());
    assert_eq!(
        header_values(&reqs[0].headers, "authorization"),
        vec![format!("Bearer {OPENAI_KEY}").as_str()]
    );
    assert!(header_values(&reqs[0].headers, "x-api-key").is_empty());
}

#[tokio::test]
async fn paths_without_v1_and_with_doubled_v1_reach_the_canonical_upstream_path() {
    let env = harness::start("").await;
    let body = r#"{"model":"gpt-test","messages":[]}"#;
    for path in ["/chat/completions", "/v1/v1/chat/completions"] {
        let resp = env
            .http
            .post(env.url(path))
            .header("authorization", "Bearer x")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let paths: Vec<String> = env.mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, vec!["/v1/chat/completions", "/v1/chat/completions"]);
}

#[tokio::test]
async fn alias_is_resolved_by_splicing_only_the_model_value() {
    let env = harness::start(
        r#"
[[models]]
name = "large"
chain = ["anthropic:claude-real-model"]
"#,
    )
    .await;
    let sent = ODD_BODY.replace("claude-test", "large");
    let resp = env.messages(sent.clone()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-legate-served-by"],
        "anthropic:claude-real-model"
    );
    let got = env.mock.requests().remove(0).body;
    let expected = sent.replace("\"large\"", "\"claude-real-model\"");
    assert_eq!(std::str::from_utf8(&got).unwrap(), expected);
}

#[tokio::test]
async fn provider_headers_pass_back_on_success_and_error() {
    let env = harness::start("").await;
    env.script(
        r#"{"replies":[
            {"headers":{"anthropic-ratelimit-requests-remaining":"41","anthropic-ratelimit-brand-new-limit":"7"}},
            {"status":400,"headers":{"retry-after":"3","anthropic-ratelimit-tokens-remaining":"0","x-ratelimit-remaining-requests":"0"}}
        ]}"#,
    );
    let body = r#"{"model":"m","max_tokens":5,"messages":[]}"#;
    let ok = env.messages(body).await;
    assert_eq!(ok.status(), 200);
    let h = ok.headers();
    assert_eq!(h["anthropic-ratelimit-requests-remaining"], "41");
    assert_eq!(h["anthropic-ratelimit-brand-new-limit"], "7");
    assert!(h["request-id"].to_str().unwrap().starts_with("req_mock_"));
    assert!(
        h["x-legate-request-id"]
            .to_str()
            .unwrap()
            .starts_with("lgt_")
    );
    assert_eq!(h["x-legate-served-by"], "anthropic:m");
    assert_eq!(h["x-legate-attempts"], "1");
    let overhead: f64 = h["x-legate-overhead-ms"].to_str().unwrap().parse().unwrap();
    assert!(overhead >= 0.0);
    assert!(h.get("x-should-retry").is_none());

    let err = env.messages(body).await;
    assert_eq!(err.status(), 400);
    let h = err.headers().clone();
    assert_eq!(h["retry-after"], "3");
    assert_eq!(h["anthropic-ratelimit-tokens-remaining"], "0");
    assert_eq!(h["x-ratelimit-remaining-requests"], "0");
    assert_eq!(h["x-should-retry"], "false");
    assert!(h["request-id"].to_str().unwrap().starts_with("req_mock_"));
    let v: serde_json::Value = err.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn admin_and_health_endpoints_never_touch_the_upstream() {
    let env = harness::start("").await;
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/admin/state",
        "/admin/usage",
    ] {
        let resp = env.http.get(env.admin_url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let models = env.http.get(env.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 200);
    assert_eq!(env.mock.stats().requests, 0);
}

#[tokio::test]
async fn models_lists_configured_names_and_aliases() {
    let env = harness::start(
        r#"
[[models]]
name = "large"
chain = ["anthropic:claude-a", { target = "anthropic:claude-b", max_tokens = 100 }]
"#,
    )
    .await;
    let v: serde_json::Value = env
        .http
        .get(env.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["large", "claude-a", "claude-b"]);
    assert_eq!(v["has_more"], false);
}

/// The model list is one path for both APIs: it is counted under the API whose shape the
/// caller's headers name (an Anthropic SDK sends `anthropic-version`, an OpenAI one does not),
/// as one model is, and its errors come in that shape.
#[tokio::test]
async fn the_model_list_is_counted_under_the_callers_api() {
    let env = harness::start("").await;
    let openai = env.http.get(env.url("/v1/models")).send().await.unwrap();
    assert_eq!(openai.status(), 200);
    env.wait_metric("legate_requests_total", &[("api", "openai")], 1.0)
        .await;
    let anthropic = env
        .http
        .get(env.url("/v1/models"))
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(anthropic.status(), 200);
    env.wait_metric("legate_requests_total", &[("api", "anthropic")], 1.0)
        .await;
    assert_eq!(
        env.metric("legate_requests_total", &[("api", "openai")])
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn head_on_the_model_paths_is_get_without_the_body() {
    let env = harness::start(
        r#"
[[models]]
name = "large"
chain = ["anthropic:claude-a"]
"#,
    )
    .await;
    for path in ["/v1/models", "/v1/models/large"] {
        let get = env.http.get(env.url(path)).send().await.unwrap();
        assert_eq!(get.status(), 200, "GET {path}");
        let length = get.bytes().await.unwrap().len();
        let head = env.http.head(env.url(path)).send().await.unwrap();
        assert_eq!(head.status(), 200, "HEAD {path}");
        assert_eq!(
            head.headers()["content-length"],
            length.to_string().as_str()
        );
        assert_eq!(head.headers()["content-type"], "application/json");
    }
    assert_eq!(env.mock.stats().requests, 0);
}

#[tokio::test]
async fn count_tokens_is_forwarded_to_the_anthropic_provider() {
    let env = harness::start("").await;
    let body = r#"{"model":"claude-x","messages":[{"role":"user","content":"count me"}]}"#;
    let resp = env
        .http
        .post(env.url("/v1/messages/count_tokens"))
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert!(v["input_tokens"].as_u64().is_some());
    let r = env.mock.requests().remove(0);
    assert_eq!(r.path, "/v1/messages/count_tokens");
    assert_eq!(r.body.as_ref(), body.as_bytes());
}

#[tokio::test]
async fn a_provider_without_a_key_source_gets_no_credential() {
    // A local vLLM / Ollama server: no api_key_env, no api_key_file.
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml(&mock.base_url(), "")
        .replace("api_key_env = \"OPENAI_API_KEY\"\n", "");
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .chat(r#"{"model":"llama3:8b","messages":[{"role":"user","content":"hi"}]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    let r = env.mock.requests().remove(0);
    assert!(header_values(&r.headers, "authorization").is_empty());
    assert!(header_values(&r.headers, "x-api-key").is_empty());
}

/// The wait for a caller's slow upload is the caller's time: `x-legate-overhead-ms` (and the
/// overhead metric and the journal) counted it as legate's own, so a slow upload read as a slow
/// legate.
#[tokio::test]
async fn a_slow_upload_is_not_counted_as_legates_overhead() {
    use futures_util::StreamExt;
    let env = harness::start("").await;
    let (first, rest) = r#"{"model":"m","max_tokens":5,"messages":[]}"#.split_at(10);
    let parts = futures_util::stream::iter([first, rest]).then(|part| async move {
        if !part.starts_with('{') {
            // The caller's own pacing: the rest of its body a second later.
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        Ok::<_, std::io::Error>(bytes::Bytes::from(part))
    });
    let resp = env.messages(reqwest::Body::wrap_stream(parts)).await;
    assert_eq!(resp.status(), 200);
    let overhead: f64 = resp.headers()["x-legate-overhead-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(overhead < 500.0, "{overhead} ms");
}

/// Header maps are emptied and reused between the requests a worker serves
/// (`src/header_maps.rs`): nothing of one request's head, or of its answer's, may show in the
/// next one's, on the same keep-alive connection, in either direction.
#[tokio::test]
async fn one_requests_headers_never_reach_the_next_on_the_same_connection() {
    let env = harness::start("").await;
    env.script(
        r#"{"replies":[
            {"headers":{"x-first-answer":"1","anthropic-ratelimit-requests-remaining":"41"}},
            {},
            {"headers":{"x-third-answer":"3"}}
        ]}"#,
    );
    let send = |model: &str, beta: Option<&str>, only_first: bool| {
        let mut req = env
            .http
            .post(env.url("/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"model":"{model}","max_tokens":5,"messages":[]}}"#
            ));
        if let Some(beta) = beta {
            req = req.header("anthropic-beta", beta);
        }
        if only_first {
            req = req.header("x-first-only", "yes");
        }
        req.send()
    };
    let first = send("m1", Some("first-beta"), true).await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-first-answer"], "1");
    assert_eq!(first.headers()["x-legate-served-by"], "anthropic:m1");
    let second = send("m2", None, false).await.unwrap();
    assert_eq!(second.status(), 200);
    let h = second.headers();
    assert!(h.get("x-first-answer").is_none(), "{h:?}");
    assert!(h.get("anthropic-ratelimit-requests-remaining").is_none());
    assert_eq!(h["x-legate-served-by"], "anthropic:m2");
    assert_eq!(h.get_all("x-legate-request-id").iter().count(), 1);
    let third = send("m1", Some("third-beta"), false).await.unwrap();
    assert_eq!(third.status(), 200);
    let h = third.headers();
    assert_eq!(h["x-third-answer"], "3");
    assert!(h.get("x-first-answer").is_none());
    assert_eq!(h["x-legate-served-by"], "anthropic:m1");

    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 3);
    let seen = |i: usize, name: &str| header_values(&reqs[i].headers, name);
    assert_eq!(seen(0, "anthropic-beta"), vec!["first-beta"]);
    assert_eq!(seen(0, "x-first-only"), vec!["yes"]);
    assert!(seen(1, "anthropic-beta").is_empty());
    assert!(seen(1, "x-first-only").is_empty());
    assert_eq!(seen(2, "anthropic-beta"), vec!["third-beta"]);
    assert!(seen(2, "x-first-only").is_empty());
    for i in 0..3 {
        assert_eq!(seen(i, "x-api-key"), vec![ANTHROPIC_KEY]);
        assert_eq!(seen(i, "anthropic-version"), vec!["2023-06-01"]);
    }
}

/// Sends `head` and a small JSON body (its length added) on a connection of its own, and
/// returns the answer's text.
async fn raw_call(env: &harness::Env, head: &str) -> String {
    let body = r#"{"model":"claude-test","max_tokens":1,"messages":[]}"#;
    let raw = format!("{head}Content-Length: {}\r\n\r\n{body}", body.len());
    env.raw_exchange(&raw).await
}

#[tokio::test]
async fn an_sdks_lines_reach_the_provider_once_each_but_never_a_credential_or_a_hop() {
    let env = harness::start("").await;
    // As an SDK writes them (its case, its spacing), with the lines that must not go on
    // between them: the caller's credentials in two spellings, hop-by-hop lines, legate's own.
    // The mock records names lower-cased and values trimmed, so this pins the set of lines
    // and their count; `upstream_pool` pins the bytes as written.
    let head = "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\
        Accept-Encoding: gzip, deflate\r\nConnection: close\r\nUser-Agent: Anthropic/Python 2.14.0\r\n\
        X-Stainless-Lang:python\r\nanthropic-version:  2023-06-01\r\nX-API-KEY: client-dummy-key\r\n\
        X-Legate-Priority: batch\r\nTE: trailers\r\nX-Stainless-Retry-Count: 0\r\n\
        authorization: Bearer client-dummy-token\r\nContent-Type: application/json\r\n";
    let answer = raw_call(&env, head).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 1);
    let mut got: Vec<(&str, &str)> = reqs[0]
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .filter(|(n, _)| *n != "host")
        .collect();
    got.sort();
    let mut want = vec![
        ("accept", "application/json"),
        ("accept-encoding", "identity"),
        ("anthropic-version", "2023-06-01"),
        ("content-length", "52"),
        ("content-type", "application/json"),
        ("user-agent", "Anthropic/Python 2.14.0"),
        ("x-api-key", ANTHROPIC_KEY),
        ("x-stainless-lang", "python"),
        ("x-stainless-retry-count", "0"),
    ];
    want.sort();
    assert_eq!(got, want, "each line once, and only these");
    assert_eq!(header_values(&reqs[0].headers, "host").len(), 1);

    // A `Connection` line naming a line: that line stays on this hop; the rest goes on.
    let head = "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close, X-Hop\r\n\
        X-Hop: secret\r\nX-Stainless-Lang: python\r\nx-api-key: client-dummy-key\r\n";
    let answer = raw_call(&env, head).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let reqs = env.mock.requests();
    assert_eq!(reqs.len(), 2);
    assert!(header_values(&reqs[1].headers, "x-hop").is_empty());
    assert_eq!(
        header_values(&reqs[1].headers, "x-stainless-lang"),
        vec!["python"]
    );
    assert_eq!(
        header_values(&reqs[1].headers, "x-api-key"),
        vec![ANTHROPIC_KEY]
    );
}
