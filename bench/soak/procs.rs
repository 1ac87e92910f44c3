//! The two processes of the soak, `legate mock` and `legate serve`: started as children on
//! loopback ports the kernel picks, their announced addresses read from stdout, their output
//! drained while they run, killed when dropped; and what /proc says about legate.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The provider key legate is given; the echoing upstream sends it back, and it must never
/// reach a caller.
pub(crate) const PROVIDER_KEY: &str = "sk-soak-provider-key-5d1e";

/// The limits under test, small enough that a short run reaches them.
pub(crate) const MAX_CONNECTIONS: u64 = 256;
pub(crate) const ADMIN_MAX_CONNECTIONS: u64 = 16;
pub(crate) const MAX_BODY_BYTES: usize = 2 << 20;
pub(crate) const MAX_BUFFERED_BYTES: usize = 8 << 20;
pub(crate) const MAX_EVENT_BYTES: usize = 128 << 10;

/// `legate serve`'s config: both providers at the mock, short deadlines so hostile peers are
/// cut within a sample interval, and a short pool idle time so upstream connections settle.
fn config_text(mock_url: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_body_bytes = {MAX_BODY_BYTES}
header_read_timeout = "2s"
body_read_timeout = "3s"
connection_idle_timeout = "5s"
max_connections = {MAX_CONNECTIONS}
admin_max_connections = {ADMIN_MAX_CONNECTIONS}
max_event_bytes = {MAX_EVENT_BYTES}
max_buffered_bytes = {MAX_BUFFERED_BYTES}

[retry]
max_attempts = 2
base_delay = "20ms"
max_delay = "50ms"

[providers.anthropic]
kind = "anthropic"
base_url = "{mock_url}"
api_key_env = "SOAK_PROVIDER_KEY"
first_byte_timeout = "3s"
idle_timeout = "2s"
pool_idle_timeout = "2s"

[providers.openai]
kind = "openai"
base_url = "{mock_url}"
api_key_env = "SOAK_PROVIDER_KEY"
first_byte_timeout = "3s"
idle_timeout = "2s"
pool_idle_timeout = "2s"

[routing]
anthropic = "anthropic"
openai = "openai"
"#
    )
}

/// A running child, killed when dropped.
pub(crate) struct Running {
    child: Child,
    pub(crate) pid: u32,
    pub(crate) url: String,
    pub(crate) admin_url: Option<String>,
}

impl Running {
    pub(crate) async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

pub(crate) async fn start_mock(bin: &Path) -> Result<Running, String> {
    let mut cmd = Command::new(bin);
    cmd.args(["mock", "--listen", "127.0.0.1:0"]);
    start(cmd, |line| {
        Some((
            line.strip_prefix("legate mock listening on ")?.to_owned(),
            None,
        ))
    })
    .await
}

pub(crate) async fn start_legate(
    bin: &Path,
    dir: &Path,
    mock_url: &str,
) -> Result<Running, String> {
    let path = dir.join("legate-soak.toml");
    std::fs::write(&path, config_text(mock_url)).map_err(|e| format!("config: {e}"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg("--config").arg(&path);
    start(cmd, |line| {
        let rest = line.strip_prefix("legate listening on ")?;
        let (data, admin) = rest.split_once(" (admin ")?;
        Some((
            data.to_owned(),
            Some(admin.trim_end_matches(')').to_owned()),
        ))
    })
    .await
}

type Announce = fn(&str) -> Option<(String, Option<String>)>;

async fn start(mut cmd: Command, announce: Announce) -> Result<Running, String> {
    cmd.env("SOAK_PROVIDER_KEY", PROVIDER_KEY)
        .env("LEGATE_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
    let pid = child.id().ok_or("the child exited at once")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .map_err(|_| "no listening line within 20 s".to_string())?
        .map_err(|e| format!("stdout: {e}"))?
        .ok_or("the child exited before listening")?;
    let (url, admin_url) = announce(&first).ok_or(format!("unexpected first line: {first}"))?;
    // Keep draining: a full pipe would stall the child.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Running {
        child,
        pid,
        url,
        admin_url,
    })
}

/// Resident memory of `pid`, in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Open descriptors of `pid`.
pub(crate) fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}
