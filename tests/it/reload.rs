//! Reload swaps the whole config atomically: streams in flight finish on the old one, new
//! requests use the new one, an invalid config is refused and counted, and a rotated key file
//! is used by the next requests without a restart.

use std::time::Duration;

use futures_util::StreamExt;

use crate::harness;

fn chain_to(model: &str) -> String {
    format!("[[models]]\nname = \"large\"\nchain = [\"anthropic:{model}\"]\n")
}

const STREAM: &str = r#"{"model":"large","max_tokens":9,"stream":true,"messages":[]}"#;

async fn reload(env: &harness::Env) -> (u16, serde_json::Value) {
    let resp = env
        .http
        .post(env.admin_url("/admin/reload"))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test]
async fn reload_under_a_live_stream_finishes_it_and_routes_the_next_request_anew() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(
        legate::mock::Script::from_json(
            r#"{"default":{"event_gap_ms":60,"content":[{"type":"text","text":"a b c d e f g h"}]}}"#,
        )
        .unwrap(),
    )
    .await;
    std::fs::write(
        &path,
        harness::config_toml(&mock.base_url(), &chain_to("claude-old")),
    )
    .unwrap();
    let env = harness::start_file(mock, &path).await;

    let resp = env.messages(STREAM).await;
    assert_eq!(resp.headers()["x-legate-served-by"], "anthropic:claude-old");
    let mut stream = resp.bytes_stream();
    let mut text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();

    std::fs::write(
        &path,
        harness::config_toml(&env.mock.base_url(), &chain_to("claude-new")),
    )
    .unwrap();
    let (status, v) = reload(&env).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], "ok");

    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        text.contains("event: message_stop"),
        "the old stream completed"
    );
    assert!(!text.contains("event: error"));

    let next = env.messages(STREAM.replace("true", "false")).await;
    assert_eq!(next.headers()["x-legate-served-by"], "anthropic:claude-new");
    assert_eq!(
        env.metric("legate_config_reloads_total", &[("result", "ok")])
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn an_invalid_reload_is_refused_counted_and_the_old_config_stays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    std::fs::write(
        &path,
        harness::config_toml(&mock.base_url(), &chain_to("claude-old")),
    )
    .unwrap();
    let env = harness::start_file(mock, &path).await;
    assert_eq!(
        env.metric("legate_config_reloads_total", &[("result", "error")])
            .await,
        Some(0.0)
    );

    let broken = harness::config_toml(&env.mock.base_url(), &chain_to("claude-new")).replace(
        "first_byte_timeout = \"5s\"",
        "first_byte_timeout = \"whenever\"",
    );
    std::fs::write(&path, broken).unwrap();
    let (status, v) = reload(&env).await;
    assert_eq!(status, 400);
    assert_eq!(v["result"], "error");
    assert!(
        v["errors"]
            .to_string()
            .contains("providers.anthropic.first_byte_timeout"),
        "{v}"
    );
    assert_eq!(
        env.metric("legate_config_reloads_total", &[("result", "error")])
            .await,
        Some(1.0)
    );
    let resp = env.messages(STREAM.replace("true", "false")).await;
    assert_eq!(resp.headers()["x-legate-served-by"], "anthropic:claude-old");
}

#[tokio::test]
async fn a_changed_listen_address_is_reported_as_needing_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml(&mock.base_url(), "");
    std::fs::write(&path, &toml).unwrap();
    let env = harness::start_file(mock, &path).await;
    std::fs::write(
        &path,
        toml.replace(
            "listen = \"127.0.0.1:0\"\nadmin",
            "listen = \"127.0.0.1:1\"\nadmin",
        ),
    )
    .unwrap();
    let (status, v) = reload(&env).await;
    assert_eq!(status, 200);
    assert_eq!(v["restart_required"], serde_json::json!(["server.listen"]));
}

#[tokio::test]
async fn changed_worker_threads_are_reported_as_needing_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml(&mock.base_url(), "");
    std::fs::write(&path, &toml).unwrap();
    let env = harness::start_file(mock, &path).await;
    std::fs::write(
        &path,
        toml.replace(
            "shutdown_grace = \"5s\"",
            "shutdown_grace = \"5s\"\nworker_threads = 3",
        ),
    )
    .unwrap();
    let (status, v) = reload(&env).await;
    assert_eq!(status, 200);
    assert_eq!(
        v["restart_required"],
        serde_json::json!(["server.worker_threads"])
    );
}

#[tokio::test]
async fn a_rotated_key_file_is_used_by_the_next_requests_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("anthropic-key");
    std::fs::write(&key_path, "sk-ant-first-key\n").unwrap();
    let mock = harness::start_mock(
        legate::mock::Script::from_json(r#"{"expect_key":"sk-ant-first-key"}"#).unwrap(),
    )
    .await;
    let toml = harness::config_toml(&mock.base_url(), "").replacen(
        "api_key_env = \"ANTHROPIC_API_KEY\"",
        &format!("api_key_file = \"{}\"", key_path.display()),
        1,
    );
    let env = harness::start_toml(mock, &toml).await;
    let body = r#"{"model":"m","max_tokens":1,"messages":[]}"#;
    assert_eq!(env.messages(body).await.status(), 200);

    // Rotate the way Kubernetes does: a new file swapped in by rename.
    env.script(r#"{"expect_key":"sk-ant-second-key"}"#);
    let staged = dir.path().join("anthropic-key.new");
    std::fs::write(&staged, "sk-ant-second-key\n").unwrap();
    std::fs::rename(&staged, &key_path).unwrap();

    // Bounded wait for the watcher (it re-reads within a second); the poll is the condition.
    let mut status = 0;
    for _ in 0..40 {
        status = env.messages(body).await.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "the rotated key was picked up within 2 s");
    let last = env.mock.requests().pop().unwrap();
    assert_eq!(
        harness::header_values(&last.headers, "x-api-key"),
        vec!["sk-ant-second-key"]
    );
    // The key it replaced is still valid at the provider for a while: an answer echoing it
    // (a request sent just before the rotation) is cleared of it too.
    env.script(
        r#"{"expect_key":"sk-ant-second-key","default":{"content":[{"type":"text","text":"old sk-ant-first-key new sk-ant-second-key"}]}}"#,
    );
    let text = env.messages(body).await.text().await.unwrap();
    assert!(text.contains("old [redacted] new [redacted]"), "{text}");
}

/// A tenant with a request limit only: its spend is kept all the same, shown by `/admin/state`,
/// and a daily budget added by reload counts what was spent before it.
#[tokio::test]
async fn a_budget_added_by_reload_counts_the_spend_already_made_today() {
    // 10 input + 5 output tokens at 3 / 15 USD per Mtok: 105 micro-USD per request.
    let tenant = |budget: &str| {
        format!(
            "[tenants.default]\nrequests_per_minute = 100\n{budget}\n\
             [[prices]]\nmodel = \"anthropic:claude-t\"\ninput = \"3\"\noutput = \"15\"\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    std::fs::write(&path, harness::config_toml(&mock.base_url(), &tenant(""))).unwrap();
    let env = harness::start_file(mock, &path).await;
    let body = r#"{"model":"claude-t","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..2 {
        let resp = env.messages(body).await;
        assert_eq!(resp.status(), 200);
        // Read whole: the answer's usage is settled by then.
        resp.bytes().await.unwrap();
    }
    let state = env.admin_json("/admin/state").await;
    let spent = &state["buckets"]["local"]["default"]["spent_today_pico_usd"];
    assert_eq!(spent, "210000000");

    // Three requests' worth: the two already spent leave room for one more.
    let budget = tenant("daily_budget_usd = \"0.000315\"");
    std::fs::write(&path, harness::config_toml(&env.mock.base_url(), &budget)).unwrap();
    assert_eq!(reload(&env).await.0, 200);
    assert_eq!(env.messages(body).await.status(), 200);
    assert_eq!(env.messages(body).await.status(), 429);
    assert_eq!(env.mock.stats().requests, 3);
}

/// `[responses]` bounds apply on reload: a smaller `max_bytes` evicts what no longer fits at
/// once, as a shorter `ttl` ends what has outlived it. A reload reported them applied (ok, no
/// restart needed) and kept the old ones. The store's kind is made once: a restart.
#[tokio::test]
async fn responses_store_bounds_apply_on_reload_and_its_kind_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml(&mock.base_url(), "");
    let with = |responses: &str| format!("{toml}\n[responses]\n{responses}\n");
    std::fs::write(&path, with("max_bytes = 1000000")).unwrap();
    let env = harness::start_file(mock, &path).await;
    let resp = env
        .http
        .post(env.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-x","input":"hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let store = env.legate.proxy.conversations.clone();
    let held = || store.memory().map(|m| m.bytes());
    assert!(held().is_some_and(|b| b > 100), "{:?}", held());
    std::fs::write(&path, with("max_bytes = 100")).unwrap();
    let (status, v) = reload(&env).await;
    assert_eq!(status, 200);
    assert_eq!(v["restart_required"], serde_json::json!([]));
    assert_eq!(held(), Some(0));
    std::fs::write(
        &path,
        with("store = \"redis\"").replace(
            "[routing]",
            "[ratelimit]\nredis_url = \"redis://127.0.0.1:1\"\n\n[routing]",
        ),
    )
    .unwrap();
    let (status, v) = reload(&env).await;
    assert_eq!(status, 200, "{v}");
    let restart = v["restart_required"].as_array().unwrap();
    assert!(
        restart.contains(&serde_json::json!("responses.store")),
        "{v}"
    );
}

/// A request that waits for its turn at the provider (`max_concurrency` reached) while the key
/// file is rotated goes out with the new key: the key it was made with may have been revoked
/// (the provider's 401 would reach the agent as a refusal that is not retried).
#[tokio::test]
async fn a_request_waiting_for_its_turn_goes_out_with_the_rotated_key() {
    waiting_request_takes_the_rotated_key(false).await;
}

/// The same after a reload that came while it waited: the request is on the old config, whose
/// key watcher was stopped by the reload, so it went out with the key read before the
/// rotation.
#[tokio::test]
async fn a_request_waiting_across_a_reload_goes_out_with_the_rotated_key() {
    waiting_request_takes_the_rotated_key(true).await;
}

async fn waiting_request_takes_the_rotated_key(reload_first: bool) {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("key");
    std::fs::write(&key_path, "sk-ant-first-key\n").unwrap();
    let script = |key: &str| {
        format!(
            r#"{{"expect_key":"{key}","replies":[{{"match":{{"model":"claude-slow"}},"times":0,"delay_ms":3000}}]}}"#
        )
    };
    let mock =
        harness::start_mock(legate::mock::Script::from_json(&script("sk-ant-first-key")).unwrap())
            .await;
    // Both providers read the same file: the OpenAI one tells when the watchers saw it change.
    let key_file = format!("api_key_file = \"{}\"", key_path.display());
    let toml = harness::config_toml(&mock.base_url(), "")
        .replace(
            "api_key_env = \"ANTHROPIC_API_KEY\"",
            &format!("{key_file}\nmax_concurrency = 1"),
        )
        .replace("api_key_env = \"OPENAI_API_KEY\"", &key_file);
    let config = dir.path().join("legate.toml");
    std::fs::write(&config, &toml).unwrap();
    let env = harness::start_file(mock, &config).await;
    let send = |model: &str| {
        let req = env
            .http
            .post(env.url("/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .body(format!(
                r#"{{"model":"{model}","max_tokens":1,"messages":[]}}"#
            ));
        tokio::spawn(async move { req.send().await.unwrap().status().as_u16() })
    };
    let slow = send("claude-slow");
    env.mock.wait_requests(1).await;
    let waiting = send("claude-quick");
    env.wait_metric("legate_queue_depth", &[("priority", "interactive")], 1.0)
        .await;
    if reload_first {
        assert_eq!(reload(&env).await.0, 200);
    }

    env.script(&script("sk-ant-second-key"));
    let staged = dir.path().join("key.new");
    std::fs::write(&staged, "sk-ant-second-key\n").unwrap();
    std::fs::rename(&staged, &key_path).unwrap();
    let chat = r#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
    let seen = async {
        while env.chat(chat).await.status() != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(2), seen)
        .await
        .expect("the rotated key was picked up");

    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(waiting.await.unwrap(), 200);
    let quick = env
        .mock
        .requests()
        .into_iter()
        .find(|r| String::from_utf8_lossy(&r.body).contains("claude-quick"))
        .unwrap();
    assert_eq!(
        harness::header_values(&quick.headers, "x-api-key"),
        vec!["sk-ant-second-key"]
    );
}

/// A reload that points a provider at another endpoint (its `base_url`) starts that provider's
/// breakers closed: the old endpoint's failures say nothing of the new one's health. A reload
/// that keeps the endpoint keeps them as they were.
#[tokio::test]
async fn a_provider_moved_to_another_endpoint_starts_with_closed_breakers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let failing = harness::start_mock(
        legate::mock::Script::from_json(r#"{"replies":[{"times":0,"status":503}]}"#).unwrap(),
    )
    .await;
    let healthy = harness::start_mock(legate::mock::Script::default()).await;
    let breaker = "[retry]\nmax_attempts = 1\n[breaker]\nmin_calls = 2\nfailure_ratio = 0.5\nopen_for = \"300s\"\n";
    let on = |url: &str| harness::config_toml(url, &format!("{breaker}{}", chain_to("claude-x")));
    std::fs::write(&path, on(&failing.base_url())).unwrap();
    let healthy_url = healthy.base_url();
    let env = harness::start_file(failing, &path).await;
    let state = [("provider", "anthropic"), ("model", "claude-x")];
    let plain = STREAM.replace("true", "false");
    for _ in 0..2 {
        assert_eq!(env.messages(plain.clone()).await.status(), 503);
    }
    env.wait_metric("legate_breaker_state", &state, 1.0).await;
    assert_eq!(env.messages(plain.clone()).await.status(), 529);
    // The same endpoint again: still open.
    assert_eq!(reload(&env).await.0, 200);
    assert_eq!(env.messages(plain.clone()).await.status(), 529);
    // Another endpoint: closed, and served there.
    std::fs::write(&path, on(&healthy_url)).unwrap();
    assert_eq!(reload(&env).await.0, 200);
    assert_eq!(env.metric("legate_breaker_state", &state).await, Some(0.0));
    assert_eq!(env.messages(plain).await.status(), 200);
    assert_eq!(env.mock.requests().len(), 2);
    assert_eq!(healthy.requests().len(), 1);
}

/// A reload that removes a provider forgets its breakers: `/admin/state` no longer lists them
/// and `/metrics` no longer exports their state, as if the provider were still configured.
#[tokio::test]
async fn a_removed_providers_breakers_leave_the_admin_state_and_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let failing = harness::start_mock(
        legate::mock::Script::from_json(r#"{"replies":[{"times":0,"status":503}]}"#).unwrap(),
    )
    .await;
    let url = failing.base_url();
    let breaker = "[retry]\nmax_attempts = 1\n[breaker]\nmin_calls = 2\nfailure_ratio = 0.5\nopen_for = \"300s\"\n";
    let spare = format!(
        "[providers.spare]\nkind = \"anthropic\"\nbase_url = \"{url}\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n[[models]]\nname = \"s\"\nchain = [\"spare:claude-s\"]\n"
    );
    std::fs::write(
        &path,
        harness::config_toml(&url, &format!("{breaker}{spare}")),
    )
    .unwrap();
    let env = harness::start_file(failing, &path).await;
    let body = r#"{"model":"s","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..2 {
        assert_eq!(env.messages(body).await.status(), 503);
    }
    let state = [("provider", "spare"), ("model", "claude-s")];
    env.wait_metric("legate_breaker_state", &state, 1.0).await;
    let listed = env.admin_json("/admin/state").await;
    assert!(
        listed["breakers"].to_string().contains("spare:claude-s"),
        "{listed}"
    );
    std::fs::write(&path, harness::config_toml(&url, breaker)).unwrap();
    assert_eq!(reload(&env).await.0, 200);
    let listed = env.admin_json("/admin/state").await;
    assert!(
        !listed["breakers"].to_string().contains("spare"),
        "{listed}"
    );
    assert_eq!(env.metric("legate_breaker_state", &state).await, None);
}
