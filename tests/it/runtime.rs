//! `server.worker_threads` (and `TOKIO_WORKER_THREADS`, which overrides it) reach the workers
//! `legate serve` starts: shown by `legate check`, reported by `/admin/state`, seen as threads
//! of the process, and refused outside 1..=256 at the key's path before anything starts.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::harness::{BIN, addrs, sigterm, spawn};

fn write_config(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("legate.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{server}\n\
         [providers.anthropic]\nkind = \"anthropic\"\nbase_url = \"http://127.0.0.1:9\"\n\
         api_key_env = \"ANTHROPIC_API_KEY\"\n\
         [providers.openai]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9\"\n\
         api_key_env = \"OPENAI_API_KEY\"\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn check(cfg: &Path, envs: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["check", "--config", cfg.to_str().unwrap()])
        .env_remove("LEGATE_CONFIG")
        .env_remove("TOKIO_WORKER_THREADS");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The worker count the running server reports, and how many worker threads it started
/// beside the main one (read from `/proc`).
async fn served_workers(cfg: &Path, envs: &[(&str, &str)]) -> (serde_json::Value, usize) {
    let (mut child, line) = spawn(&["serve", "--config", cfg.to_str().unwrap()], envs, None).await;
    let (_, admin) = addrs(&line);
    let pid = child.id().unwrap();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("legate-worker-"))
        .count();
    let state = crate::harness::get_json(&format!("{admin}/admin/state")).await;
    sigterm(&child);
    let _ = child.wait().await;
    (state["runtime"]["worker_threads"].clone(), threads)
}

#[tokio::test]
async fn worker_threads_reach_the_runtime_and_the_environment_overrides_them() {
    let dir = tempfile::tempdir().unwrap();

    let default = write_config(dir.path(), "");
    let out = check(&default, &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("worker_threads = 1\n"));
    assert_eq!(served_workers(&default, &[]).await, (1.into(), 0));

    let three = write_config(dir.path(), "worker_threads = 3");
    let out = check(&three, &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("worker_threads = 3\n"));
    assert_eq!(served_workers(&three, &[]).await, (3.into(), 2));

    let env = [("TOKIO_WORKER_THREADS", "2")];
    let out = check(&three, &env);
    assert!(String::from_utf8_lossy(&out.stdout).contains("worker_threads = 2\n"));
    assert_eq!(served_workers(&three, &env).await, (2.into(), 1));
}

#[tokio::test]
async fn worker_threads_outside_the_range_are_refused_at_their_path() {
    let dir = tempfile::tempdir().unwrap();
    for (server, envs) in [
        ("worker_threads = 0", &[][..]),
        ("worker_threads = 257", &[][..]),
        ("worker_threads = -1", &[][..]),
        ("worker_threads = \"many\"", &[][..]),
        ("", &[("TOKIO_WORKER_THREADS", "0")][..]),
        ("", &[("TOKIO_WORKER_THREADS", "lots")][..]),
        ("", &[("LEGATE__SERVER__WORKER_THREADS", "300")][..]),
    ] {
        let cfg = write_config(dir.path(), server);
        let out = check(&cfg, envs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{server} {envs:?}: {stderr}");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with("server.worker_threads: ")),
            "{server} {envs:?}: {stderr}"
        );
        // serve refuses it too, before binding anything.
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["serve", "--config", cfg.to_str().unwrap()])
            .env_remove("LEGATE_CONFIG")
            .env_remove("TOKIO_WORKER_THREADS");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        assert_eq!(cmd.output().unwrap().status.code(), Some(64));
    }
}
