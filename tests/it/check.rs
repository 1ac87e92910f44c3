//! `legate check` refuses what `serve` could not run and warns on what is risky (SPEC §14), and
//! no validation message, warning, reload answer or log line repeats a credential: a canary
//! placed where keys end up by mistake is asserted absent from everything printed.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::harness::{BIN, addrs, sigterm, spawn};

const CANARY: &str = "sk-ant-api03-CANARY-77e1b0";

fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(args)
        .env_remove("LEGATE_CONFIG")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[cfg(unix)]
fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn check_and_serve_refuse_what_could_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "empty", "");
    let newline = write(dir.path(), "newline", "\n");
    let control = write(dir.path(), "control", "sk-one\nsk-two\n");
    let cfg = write(
        dir.path(),
        "legate.toml",
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
default_deadline = "500000000000y"

[providers.anthropic]
api_key_file = "{empty}"

[providers.openai]
api_key_file = "{newline}"

[providers.local]
kind = "openai"
base_url = "http://127.0.0.1:9"
api_key_file = "{control}"

[routing]
openai = "openai"

[ratelimit]
store = "redis"
redis_url = "redis://:{CANARY}@127.0.0.1:notaport/0"

[[clients]]
tenant = "team-a"
key_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
"#,
            empty = empty.display(),
            newline = newline.display(),
            control = control.display(),
        ),
    );
    let out = run(&["check", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let lines = stderr_lines(&out);
    let expected = [
        "server.default_deadline: longer than one year, the longest duration legate accepts"
            .to_owned(),
        format!(
            "providers.anthropic.api_key_file: `{}`: there is no key (empty, or only spaces)",
            empty.display()
        ),
        format!(
            "providers.local.api_key_file: `{}`: the key holds control characters (a line \
             break, tab or NUL)",
            control.display()
        ),
        format!(
            "providers.openai.api_key_file: `{}`: there is no key (empty, or only spaces)",
            newline.display()
        ),
        "clients[0].key_sha256: this is the SHA-256 of the empty string: an empty key would \
         authenticate"
            .to_owned(),
        "ratelimit.redis_url: not a usable Redis URL; expected redis://[:password@]host[:port][/db]"
            .to_owned(),
    ];
    for line in &expected {
        assert!(lines.contains(line), "missing `{line}` in:\n{lines:#?}");
    }
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains(CANARY));

    let out = run(&["serve", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server.default_deadline: longer than one year"));
    assert!(!stderr.contains(CANARY), "{stderr}");
}

#[tokio::test]
async fn one_year_is_the_longest_duration() {
    let dir = tempfile::tempdir().unwrap();
    let ok = write(
        dir.path(),
        "ok.toml",
        "[server]\ndefault_deadline = \"1y\"\n",
    );
    assert_eq!(
        run(&["check", "--config", ok.to_str().unwrap()], &[])
            .status
            .code(),
        Some(0)
    );
    let over = write(
        dir.path(),
        "over.toml",
        "[retry]\nmax_retry_after = \"1y 1s\"\n",
    );
    let out = run(&["check", "--config", over.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr_lines(&out),
        ["retry.max_retry_after: longer than one year, the longest duration legate accepts"]
    );
}

#[cfg(unix)]
#[tokio::test]
async fn check_warns_on_a_readable_key_file_and_a_key_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let key = write(dir.path(), "key", &format!("{CANARY}\n"));
    chmod(&key, 0o644);
    let cfg = write(
        dir.path(),
        "legate.toml",
        &format!(
            "[providers.anthropic]\napi_key_file = \"{}\"\n[providers.openai]\nbase_url = \
             \"http://10.20.30.40:8080/v1\"\napi_key_env = \"OPENAI_API_KEY\"\n",
            key.display()
        ),
    );
    let out = run(
        &["check", "--config", cfg.to_str().unwrap()],
        &[("OPENAI_API_KEY", CANARY)],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let lines = stderr_lines(&out);
    let expected = [
        format!(
            "warning: providers.anthropic.api_key_file: `{}` is readable by other users; \
             restrict it (chmod 600)",
            key.display()
        ),
        "warning: providers.openai.base_url: the provider key is sent over plain http:// to \
         `http://10.20.30.40:8080/v1`, which is not this host; use https://"
            .to_owned(),
    ];
    for line in &expected {
        assert!(lines.contains(line), "missing `{line}` in:\n{lines:#?}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains(CANARY) && !lines.concat().contains(CANARY));

    // Owner-only and loopback: nothing to say about either.
    chmod(&key, 0o600);
    let quiet = write(
        dir.path(),
        "quiet.toml",
        &format!(
            "[providers.anthropic]\napi_key_file = \"{}\"\n[providers.openai]\nbase_url = \
             \"http://127.0.0.1:8080\"\napi_key_env = \"OPENAI_API_KEY\"\n",
            key.display()
        ),
    );
    let out = run(
        &["check", "--config", quiet.to_str().unwrap()],
        &[("OPENAI_API_KEY", CANARY)],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning:"),
        "{:?}",
        stderr_lines(&out)
    );
}

#[tokio::test]
async fn a_credential_in_the_wrong_place_is_never_printed_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "legate.toml",
        &format!(
            r#"
[providers.anthropic]
base_url = "https://user:{CANARY}@gw.example"
api_key_env = "{CANARY}"

[providers.openai]
kind = "{CANARY}"
auth_header = "{CANARY}"

[[clients]]
tenant = "team-a"
key_sha256 = "{CANARY}"

[tenants.team-a]
daily_budget_usd = "{CANARY}"

[telemetry]
otlp_endpoint = "{CANARY}"
"#
        ),
    );
    let out = run(&["check", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "providers.anthropic.base_url: `https://***@gw.example` must not carry credentials; \
             use api_key_env or api_key_file"
        ),
        "{stderr}"
    );
    for path in [
        "providers.anthropic.api_key_env:",
        "providers.openai.kind:",
        "providers.openai.auth_header:",
        "clients[0].key_sha256:",
        "tenants.team-a.daily_budget_usd:",
        "telemetry.otlp_endpoint:",
    ] {
        assert!(stderr.contains(path), "{path} not reported:\n{stderr}");
    }
    assert!(!stderr.contains("CANARY"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("CANARY"));

    // A key pasted on a line of its own: a TOML syntax error, located but not quoted.
    let pasted = write(
        dir.path(),
        "pasted.toml",
        &format!("[providers.anthropic]\n{CANARY}\n"),
    );
    let out = run(&["check", "--config", pasted.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].starts_with(&format!("{}: line 2, column ", pasted.display())),
        "{lines:#?}"
    );
    assert!(!lines[0].contains("CANARY"), "{lines:#?}");
}

#[tokio::test]
async fn a_refused_reload_does_not_echo_a_credential() {
    let dir = tempfile::tempdir().unwrap();
    let good = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
                [providers.anthropic]\nbase_url = \"http://127.0.0.1:9\"\n\
                [providers.openai]\nbase_url = \"http://127.0.0.1:9\"\n";
    let cfg = write(dir.path(), "legate.toml", good);
    let log = dir.path().join("stderr.log");
    let (mut legate, line) = spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[],
        Some(&log),
    )
    .await;
    let (_, admin) = addrs(&line);
    std::fs::write(
        &cfg,
        good.replace(
            "[providers.anthropic]\nbase_url = \"http://127.0.0.1:9\"",
            &format!("[providers.anthropic]\nbase_url = \"http://u:{CANARY}@127.0.0.1:9\""),
        ),
    )
    .unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{admin}/admin/reload"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap();
    assert_ne!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"], "error", "{body}");
    assert_eq!(
        v["errors"][0],
        "providers.anthropic.base_url: `http://***@127.0.0.1:9` must not carry credentials; \
         use api_key_env or api_key_file"
    );
    assert!(!body.contains("CANARY"), "{body}");
    sigterm(&legate);
    assert!(legate.wait().await.unwrap().success());
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.contains("http://***@127.0.0.1:9"), "{logs}");
    assert!(!logs.contains("CANARY"), "{logs}");
}

/// A reader that stops early (`legate check | head`) does not turn a valid config into a
/// crash: stdout is closed before `check` writes, and the exit code still says "valid".
#[test]
fn check_with_its_output_closed_early_still_exits_valid() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "legate.toml",
        "[providers.anthropic]\nkind = \"anthropic\"\nbase_url = \"http://127.0.0.1:9\"\n\
         [providers.openai]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9\"\n",
    );
    let (read, write_end) = std::io::pipe().unwrap();
    drop(read);
    let status = std::process::Command::new(BIN)
        .args(["check", "--config", cfg.to_str().unwrap()])
        .env_remove("LEGATE_CONFIG")
        .stdout(write_end)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
