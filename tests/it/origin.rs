//! Browser requests from web pages are refused on both planes (SPEC §14), and IPv4-mapped
//! loopback addresses count as loopback.

use crate::harness;

const BODY: &str =
    r#"{"model":"claude-o","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn a_foreign_origin_is_refused_on_both_planes_and_spends_nothing() {
    let env = harness::start("").await;
    // A "simple" cross-site request: no preflight, so it reaches legate as is.
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("origin", "https://evil.example")
        .header("content-type", "text/plain")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "permission_error");
    let chat = env
        .http
        .post(env.url("/v1/chat/completions"))
        .header("origin", "null")
        .body(r#"{"model":"gpt-o","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 403);
    assert_eq!(env.mock.stats().requests, 0);

    for (method, path) in [("POST", "/admin/reload"), ("GET", "/admin/state")] {
        let resp = env
            .http
            .request(method.parse().unwrap(), env.admin_url(path))
            .header("origin", "https://evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{method} {path}");
    }
    assert_eq!(
        env.metric("legate_config_reloads_total", &[("result", "ok")])
            .await,
        Some(0.0)
    );

    // A page served from this host (a local dev UI) and SDKs (no Origin) are served.
    let local = env
        .http
        .post(env.url("/v1/messages"))
        .header("origin", "http://localhost:3000")
        .header("content-type", "application/json")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(local.status(), 200);
    assert_eq!(env.messages(BODY).await.status(), 200);
}

#[tokio::test]
async fn an_ipv4_mapped_loopback_admin_address_is_local() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml(&mock.base_url(), "").replace(
        "admin_listen = \"127.0.0.1:0\"",
        "admin_listen = \"[::ffff:127.0.0.1]:0\"",
    );
    std::fs::write(&path, &toml).unwrap();
    let cfg = legate::config::load_str(&toml, &harness::test_env_vars()).unwrap();
    let warnings = legate::config::warnings(&cfg);
    assert!(
        !warnings
            .iter()
            .any(|w| w.contains("reachable from other hosts")),
        "{warnings:?}"
    );
    let env = harness::start_file(mock, &path).await;
    let resp = env
        .http
        .post(env.admin_url("/admin/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

#[tokio::test]
async fn a_loopback_admin_plane_refuses_a_host_naming_another_machine() {
    // After DNS rebinding a page's reads are same-origin: no Origin, only its own name in
    // `Host`. The journal (captured prompts) and a reload must not answer it.
    let env = harness::start("").await;
    let port = env.legate.admin_addr.port();
    for (method, path) in [
        ("GET", "/admin/requests?limit=1"),
        ("POST", "/admin/reload"),
        ("GET", "/healthz"),
    ] {
        let resp = env
            .http
            .request(method.parse().unwrap(), env.admin_url(path))
            .header("host", format!("evil.example:{port}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{method} {path}");
    }
    assert_eq!(
        env.metric("legate_config_reloads_total", &[("result", "ok")])
            .await,
        Some(0.0)
    );
    // This machine's names are served.
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let resp = env
            .http
            .get(env.admin_url("/healthz"))
            .header("host", host.as_str())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{host}");
    }
}
