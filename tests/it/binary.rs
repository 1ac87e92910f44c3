//! The real binary: `legate check` exit codes and messages, `legate serve` with `legate mock`
//! as separate processes, secrets never leaking (logs at debug level, metrics, admin, error
//! bodies), and SIGTERM draining an open stream.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::process::Child;

use crate::harness::{BIN, addrs, sigterm, spawn, spawn_mock};

const PROVIDER_CANARY: &str = "sk-ant-CANARY-9d1e0c7b";
const CLIENT_CANARY: &str = "sk-ant-CANARY-client-51f2";

async fn start_mock(script: Option<&std::path::Path>) -> (Child, String) {
    match script {
        Some(p) => spawn_mock(&["--script", &p.display().to_string()]).await,
        None => spawn_mock(&[]).await,
    }
}

/// A config for the real binary: both providers at `mock_url`, ports chosen by the system.
pub(crate) fn write_config(
    dir: &std::path::Path,
    mock_url: &str,
    extra: &str,
) -> std::path::PathBuf {
    let path = dir.join("legate.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
shutdown_grace = "10s"

[providers.anthropic]
kind = "anthropic"
base_url = "{mock_url}"
api_key_env = "ANTHROPIC_API_KEY"

[providers.openai]
kind = "openai"
base_url = "{mock_url}"
api_key_env = "OPENAI_API_KEY"
{extra}
"#
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn check_accepts_a_valid_config_and_masks_nothing_it_should_not_show() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "http://127.0.0.1:9", "");
    let out = std::process::Command::new(BIN)
        .args(["check", "--config", cfg.to_str().unwrap()])
        .env("ANTHROPIC_API_KEY", PROVIDER_CANARY)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("[providers.anthropic]"));
    assert!(!stdout.contains(PROVIDER_CANARY));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(PROVIDER_CANARY));
}

#[tokio::test]
async fn check_reports_every_problem_with_its_key_path_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "http://127.0.0.1:9",
        "[[models]]\nname = \"large\"\nchain = [\"nowhere:model-x\"]\n",
    );
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "shutdown_grace = \"10s\"",
        "shutdown_grace = \"ten seconds\"\nlisten_backlog = 5",
    );
    std::fs::write(&cfg, text).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server.shutdown_grace"), "{stderr}");
    assert!(stderr.contains("server.listen_backlog"), "{stderr}");
    assert!(stderr.contains("models[0].chain[0]"), "{stderr}");

    // serve refuses the same config before binding anything.
    let out = std::process::Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[tokio::test]
async fn secrets_never_appear_in_logs_metrics_admin_or_error_bodies() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let (_mock, mock_url) = start_mock(None).await;
    let client_hash = hex::encode(sha2::Sha256::digest(CLIENT_CANARY.as_bytes()));
    let cfg = write_config(
        dir.path(),
        &mock_url,
        &format!("[[clients]]\ntenant = \"team-a\"\nkey_sha256 = \"{client_hash}\"\n"),
    );
    let log = dir.path().join("stderr.log");
    let (mut legate, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[
            ("ANTHROPIC_API_KEY", PROVIDER_CANARY),
            ("OPENAI_API_KEY", PROVIDER_CANARY),
            ("LEGATE_LOG", "trace"),
        ],
        Some(&log),
    )
    .await;
    let (data, admin) = addrs(&line);
    let http = reqwest::Client::new();
    let mut seen = String::new();
    let bodies = [
        r#"{"model":"m","max_tokens":1,"messages":[]}"#,
        r#"{"model":"m","max_tokens":1,"stream":true,"messages":[]}"#,
        "{broken",
    ];
    for key in [CLIENT_CANARY, "sk-ant-CANARY-wrong-key"] {
        for body in bodies {
            let resp = http
                .post(format!("{data}/v1/messages"))
                .header("x-api-key", key)
                .header("authorization", format!("Bearer {key}"))
                .header("anthropic-version", "2023-06-01")
                .body(body)
                .send()
                .await
                .unwrap();
            seen.push_str(&format!("{:?}", resp.headers()));
            seen.push_str(&resp.text().await.unwrap());
        }
    }
    for path in [
        "/metrics",
        "/admin/state",
        "/admin/usage",
        "/healthz",
        "/readyz",
    ] {
        seen.push_str(
            &http
                .get(format!("{admin}{path}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
    }
    assert!(seen.contains("legate_requests_total"));
    sigterm(&legate);
    assert!(legate.wait().await.unwrap().success());
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(!logs.is_empty(), "trace logging produced output");
    for (what, text) in [("responses", &seen), ("logs", &logs)] {
        assert!(!text.contains("CANARY"), "a key leaked into {what}");
    }
}

#[tokio::test]
async fn sigterm_drains_an_open_stream_then_exits_0() {
    drains_an_open_stream(1).await;
}

#[tokio::test]
async fn sigterm_drains_an_open_stream_on_another_worker_then_exits_0() {
    drains_an_open_stream(2).await;
}

/// With `workers` above one, a first caller's kept-alive connection holds the first worker, so
/// the stream is served by another.
async fn drains_an_open_stream(workers: usize) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        r#"{"default":{"event_gap_ms":150,"content":[{"type":"text","text":"a b c d e f g h"}]}}"#,
    )
    .unwrap();
    let (_mock, mock_url) = start_mock(Some(&script)).await;
    let cfg = write_config(dir.path(), &mock_url, "");
    let threads = workers.to_string();
    let (mut legate, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[
            ("ANTHROPIC_API_KEY", "k"),
            ("OPENAI_API_KEY", "k"),
            ("TOKIO_WORKER_THREADS", &threads),
        ],
        None,
    )
    .await;
    let (data, admin) = addrs(&line);
    let state = crate::harness::get_json(&format!("{admin}/admin/state")).await;
    assert_eq!(state["runtime"]["worker_threads"], workers);
    let first = reqwest::Client::new();
    if workers > 1 {
        let r = first
            .post(format!("{data}/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .body(r#"{"model":"m","max_tokens":9,"messages":[]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let (mut stream, mut text) = first_of_stream(&data).await;
    sigterm(&legate);
    // Readiness turns false while the stream is still open.
    wait_draining(&admin).await;
    // New connections to the data plane are refused.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let refused = fresh
        .post(format!("{data}/v1/messages"))
        .body(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .send()
        .await;
    assert!(
        refused.is_err(),
        "new connections must be refused while draining"
    );
    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        text.contains("event: message_stop"),
        "the open stream completed: {text}"
    );
    assert!(!text.contains("event: error"));
    let status = legate.wait().await.unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn sighup_reloads_the_config_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_mock, mock_url) = start_mock(None).await;
    let chain = |m: &str| format!("[[models]]\nname = \"large\"\nchain = [\"anthropic:{m}\"]\n");
    let cfg = write_config(dir.path(), &mock_url, &chain("claude-old"));
    let (legate, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[("ANTHROPIC_API_KEY", "k"), ("OPENAI_API_KEY", "k")],
        None,
    )
    .await;
    let (data, admin) = addrs(&line);
    let http = reqwest::Client::new();
    let served_by = || async {
        let r = http
            .post(format!("{data}/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .body(r#"{"model":"large","max_tokens":1,"messages":[]}"#)
            .send()
            .await
            .unwrap();
        r.headers()["x-legate-served-by"]
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(served_by().await, "anthropic:claude-old");
    write_config(dir.path(), &mock_url, &chain("claude-new"));
    let pid = legate.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Wait on the reload counter, not on time (bounded).
    let reloaded = async {
        loop {
            let text = http
                .get(format!("{admin}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let ok = crate::harness::metric_value(
                &text,
                "legate_config_reloads_total",
                &[("result", "ok")],
            );
            if ok == Some(1.0) {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), reloaded)
        .await
        .expect("SIGHUP reloaded the config");
    assert_eq!(served_by().await, "anthropic:claude-new");
}

/// The real binary with `shutdown_grace` 300 ms in front of a mock playing `script`: the temp
/// directory, the mock, legate, its data URL and the mock's URL.
async fn with_short_grace(script: &str) -> (tempfile::TempDir, Child, Child, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    std::fs::write(&path, script).unwrap();
    let (mock, mock_url) = start_mock(Some(&path)).await;
    let cfg = write_config(dir.path(), &mock_url, "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("shutdown_grace = \"10s\"", "shutdown_grace = \"300ms\"");
    std::fs::write(&cfg, text).unwrap();
    let (legate, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[("ANTHROPIC_API_KEY", "k"), ("OPENAI_API_KEY", "k")],
        None,
    )
    .await;
    let (data, _) = addrs(&line);
    (dir, mock, legate, data, mock_url)
}

#[tokio::test]
async fn streams_outliving_shutdown_grace_end_with_an_error_event() {
    let (_dir, _mock, mut legate, data, _) = with_short_grace(
        r#"{"default":{"event_gap_ms":200,"content":[{"type":"text","text":"a b c d e f g h i j k l m n o p"}]}}"#,
    )
    .await;
    let (mut stream, mut text) = first_of_stream(&data).await;
    sigterm(&legate);
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.contains("event: error"), "{text}");
    assert!(!text.contains("event: message_stop"));
    assert_eq!(legate.wait().await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_request_without_an_answer_at_shutdown_grace_gets_a_503() {
    // The provider holds its answer far past the grace: the caller is told legate is going
    // away, in its API's shape, instead of having its connection dropped unanswered.
    let (_dir, _mock, mut legate, data, mock_url) =
        with_short_grace(r#"{"default":{"delay_ms":60000}}"#).await;
    let http = reqwest::Client::new();
    let pending = tokio::spawn({
        let http = http.clone();
        async move {
            http.post(format!("{data}/v1/messages"))
                .header("anthropic-version", "2023-06-01")
                .body(r#"{"model":"m","max_tokens":9,"messages":[]}"#)
                .send()
                .await
        }
    });
    // The request is with the provider (a bounded wait on the mock's count, not on time).
    let reached = async {
        loop {
            let stats: serde_json::Value = http
                .get(format!("{mock_url}/_mock/stats"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if stats["requests"] == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), reached)
        .await
        .expect("the request reached the provider");
    sigterm(&legate);
    let resp = tokio::time::timeout(std::time::Duration::from_secs(10), pending)
        .await
        .expect("answered at the grace")
        .unwrap()
        .expect("an answer, not a dropped connection");
    assert_eq!(resp.status(), 503);
    // An attempt was under way: the SDK must not send it again on its own.
    assert_eq!(resp.headers()["x-should-retry"], "false");
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    // The provider's wait, cut at the grace (300 ms after the signal, which came after the
    // request reached it), is not legate's own time.
    let overhead: f64 = resp.headers()["x-legate-overhead-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(overhead < 300.0, "{overhead} ms");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "api_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{body}"
    );
    assert_eq!(legate.wait().await.unwrap().code(), Some(0));
}

/// A SIGHUP or SIGTERM sent the moment legate says it listens (a config reloader's, a pod
/// deleted while it starts) is handled: the reload happens and serving goes on, and SIGTERM
/// drains and exits 0. Before the handlers were installed ahead of readiness, the default
/// action killed the process in about half the runs.
#[tokio::test]
async fn a_signal_right_after_start_is_handled() {
    let dir = tempfile::tempdir().unwrap();
    let (_mock, mock_url) = start_mock(None).await;
    let cfg = write_config(dir.path(), &mock_url, "");
    let env = [("ANTHROPIC_API_KEY", "k"), ("OPENAI_API_KEY", "k")];
    let serve = ["serve", "--config", cfg.to_str().unwrap()];
    for _ in 0..5 {
        let (mut legate, line) = spawn(&serve, &env, None).await;
        signal_now(&legate, libc::SIGHUP);
        let (_, admin) = addrs(&line);
        let ready = reqwest::get(format!("{admin}/readyz")).await.unwrap();
        assert_eq!(ready.status(), 200);
        let (mut fresh, _) = spawn(&serve, &env, None).await;
        signal_now(&fresh, libc::SIGTERM);
        for child in [&mut fresh, &mut legate] {
            if child.id().is_some() {
                sigterm(child);
            }
            let status = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(status.code(), Some(0), "{status:?}");
        }
    }
}

/// Sends `signal` to `child` at once: `kill(1)`, a process of its own, starts a millisecond
/// or more after the call, well after the moment this is about.
#[expect(unsafe_code, reason = "kill(2) has no safe binding in std")]
fn signal_now(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) takes plain integers and touches no memory of this process.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// A second SIGTERM during the drain (an operator's second Ctrl-C, a second or more after the
/// first) ends it at once: the stream still open is cut and the process exits, where it waited
/// out the whole `shutdown_grace` (a minute here).
#[tokio::test]
async fn a_second_sigterm_during_the_drain_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        r#"{"default":{"event_gap_ms":2000,"content":[{"type":"text","text":"a b c d e f g h i j k l m n o p"}]}}"#,
    )
    .unwrap();
    let (_mock, mock_url) = start_mock(Some(&script)).await;
    let cfg = write_config(dir.path(), &mock_url, "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("shutdown_grace = \"10s\"", "shutdown_grace = \"60s\"");
    std::fs::write(&cfg, text).unwrap();
    let (mut legate, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[("ANTHROPIC_API_KEY", "k"), ("OPENAI_API_KEY", "k")],
        None,
    )
    .await;
    let (data, admin) = addrs(&line);
    let (mut stream, mut text) = first_of_stream(&data).await;
    sigterm(&legate);
    // The first signal is handled (the drain has begun) before the second is sent.
    wait_draining(&admin).await;
    // One within a second of the first is the same stop told twice: sent again until one
    // counts (bounded: the drain alone would take half a minute).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        sigterm(&legate);
        match tokio::time::timeout(Duration::from_millis(250), legate.wait()).await {
            Ok(status) => break status.unwrap(),
            Err(_) => assert!(
                tokio::time::Instant::now() < deadline,
                "a second SIGTERM did not end the drain"
            ),
        }
    };
    assert_eq!(status.code(), Some(0));
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(!text.contains("event: message_stop"), "{text}");
}

/// A streamed `/v1/messages` request to `data`, and the text of its first chunk.
async fn first_of_stream(
    data: &str,
) -> (
    impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    String,
) {
    let resp = reqwest::Client::new()
        .post(format!("{data}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .body(r#"{"model":"m","max_tokens":9,"stream":true,"messages":[]}"#)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();
    (stream, text)
}

/// Waits until `/readyz` on `admin` answers 503: a SIGTERM has been handled.
async fn wait_draining(admin: &str) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    loop {
        let r = http.get(format!("{admin}/readyz")).send().await.unwrap();
        if r.status() == 503 {
            break;
        }
        tokio::task::yield_now().await;
    }
}
