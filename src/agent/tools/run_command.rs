//! `run_command`: `sh -c COMMAND` in the workspace root, with a timeout, stdin closed, and
//! stdout / stderr captured head+tail. The command runs in its own process group so a timeout
//! or Ctrl-C kills everything it started, not only the shell.
//!
//! A non-zero exit status is a normal result (the model reads the code); only a command that
//! could not start, timed out or was cancelled is a tool error.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

use super::output::HeadTail;
use super::{ToolError, ToolKind, ToolSpec};
use crate::agent::cancel::Cancel;
use crate::agent::workspace::Workspace;

pub(crate) const SPEC: ToolSpec = ToolSpec {
    name: "run_command",
    kind: ToolKind::Run,
    description: "Run a shell command (`sh -c`) in the workspace root, stdin closed. Returns the \
                  exit code and stdout/stderr (the first and last 8 KiB of each). Default \
                  timeout 60 s (`timeout_secs`, at most 600); on timeout the command and \
                  everything it started is killed.",
    input_schema: schema,
};

const DEFAULT_TIMEOUT_SECS: u64 = 60;
const MAX_TIMEOUT_SECS: u64 = 600;
/// Bytes kept from each end of each stream.
const KEEP_BYTES: usize = 8 * 1024;
/// How long the pipes may stay open after the shell ended, held by something it started in
/// the background, before that process group is killed.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "Shell command line."},
            "timeout_secs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECS, "description": "Default 60."}
        },
        "required": ["command"],
        "additionalProperties": false
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Input {
    pub command: String,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl Input {
    pub(super) fn check(&self) -> Result<(), String> {
        if self.command.trim().is_empty() {
            return Err("command must not be empty".to_owned());
        }
        match self.timeout_secs {
            Some(s) if s == 0 || s > MAX_TIMEOUT_SECS => Err(format!(
                "timeout_secs must be within 1..={MAX_TIMEOUT_SECS}"
            )),
            _ => Ok(()),
        }
    }

    fn timeout_secs(&self) -> u64 {
        self.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS)
    }
}

/// How the wait for the shell ended.
enum Ended {
    Exited(std::io::Result<ExitStatus>),
    TimedOut,
    Cancelled,
}

type Capture = Arc<Mutex<HeadTail>>;

pub(crate) async fn run(
    input: &Input,
    ws: &Workspace,
    cancel: &Cancel,
) -> Result<String, ToolError> {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(&input.command)
        .current_dir(ws.root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    let mut child = cmd.spawn().map_err(ToolError::Spawn)?;
    let pid = child.id();
    let stdout = Arc::new(Mutex::new(HeadTail::new(KEEP_BYTES)));
    let stderr = Arc::new(Mutex::new(HeadTail::new(KEEP_BYTES)));
    let readers = [
        child.stdout.take().map(|r| capture(r, stdout.clone())),
        child.stderr.take().map(|r| capture(r, stderr.clone())),
    ];
    let secs = input.timeout_secs();
    let ended = tokio::select! {
        status = child.wait() => Ended::Exited(status),
        () = tokio::time::sleep(Duration::from_secs(secs)) => Ended::TimedOut,
        () = cancel.cancelled() => Ended::Cancelled,
    };
    if !matches!(ended, Ended::Exited(Ok(_))) {
        kill_group(pid);
        let _ = child.kill().await;
    }
    drain(readers, pid).await;
    let status = match &ended {
        Ended::Exited(Ok(status)) => Some(*status),
        _ => None,
    };
    let output = render(status, &stdout, &stderr);
    match ended {
        Ended::Exited(Ok(_)) => Ok(output),
        Ended::Exited(Err(e)) => Err(ToolError::Spawn(e)),
        Ended::TimedOut => Err(ToolError::TimedOut { secs, output }),
        Ended::Cancelled => Err(ToolError::Cancelled { output }),
    }
}

fn capture(mut reader: impl AsyncRead + Unpin + Send + 'static, into: Capture) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(&buf[..n]);
        }
    })
}

/// Waits for both pipes to close; past the grace period, kills what still holds them.
async fn drain(readers: [Option<JoinHandle<()>>; 2], pid: Option<u32>) {
    let handles: Vec<JoinHandle<()>> = readers.into_iter().flatten().collect();
    let aborts: Vec<_> = handles.iter().map(JoinHandle::abort_handle).collect();
    let all = futures_util::future::join_all(handles);
    if tokio::time::timeout(DRAIN_GRACE, all).await.is_err() {
        kill_group(pid);
        for abort in aborts {
            abort.abort();
        }
    }
}

/// Kills the command's process group. Done through kill(1): legate forbids unsafe code, and
/// the standard library only signals single processes.
fn kill_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    #[cfg(not(unix))]
    let _ = pid;
}

fn render(status: Option<ExitStatus>, stdout: &Capture, stderr: &Capture) -> String {
    let mut out = match status {
        Some(status) => describe(status),
        None => String::new(),
    };
    for (name, capture) in [("stdout", stdout), ("stderr", stderr)] {
        let capture = capture.lock().unwrap_or_else(PoisonError::into_inner);
        if capture.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("--- {name} ---\n{}", capture.render()));
    }
    if out.is_empty() {
        out.push_str("(no output)");
    }
    out
}

fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code: {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("terminated by signal {signal}");
        }
    }
    format!("ended: {status}")
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn input(command: &str, timeout: Option<u64>) -> Input {
        Input {
            command: command.to_owned(),
            timeout_secs: timeout,
        }
    }

    /// Runs `command` in `ws`, never cancelled.
    async fn run_in(
        ws: &Workspace,
        command: &str,
        timeout: Option<u64>,
    ) -> Result<String, ToolError> {
        run(&input(command, timeout), ws, &Cancel::never()).await
    }

    #[tokio::test]
    async fn runs_in_the_workspace_and_reports_code_and_streams()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        let out = run_in(
            &ws,
            "echo hi > f.txt; cat f.txt; echo oops >&2; exit 3",
            None,
        )
        .await?;
        assert_eq!(
            out,
            "exit code: 3\n--- stdout ---\nhi\n\n--- stderr ---\noops\n"
        );
        assert_eq!(std::fs::read_to_string(dir.path().join("f.txt"))?, "hi\n");
        assert_eq!(run_in(&ws, "true", None).await?, "exit code: 0");
        Ok(())
    }

    #[tokio::test]
    async fn long_output_keeps_head_and_tail() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        let long = "echo START; head -c 100000 /dev/zero | tr '\\0' x; echo; echo END";
        let out = run_in(&ws, long, None).await?;
        assert!(out.contains("--- stdout ---\nSTART\n"), "{}", &out[..100]);
        assert!(out.contains("bytes omitted"));
        assert!(out.ends_with("x\nEND\n"));
        assert!(out.len() < 2 * KEEP_BYTES + 200);
        Ok(())
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        // The background sleep holds stdout open: only killing the group ends the capture.
        let result = run_in(&ws, "echo begun; sleep 30 & sleep 30", Some(1)).await;
        match result {
            Err(ToolError::TimedOut { secs: 1, output }) => assert!(output.contains("begun")),
            other => panic!("expected a timeout, got {other:?}"),
        }
        Ok(())
    }

    #[tokio::test]
    async fn cancel_kills_the_command() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        let (handle, cancel) = crate::agent::cancel::new();
        handle.cancel();
        let result = run(&input("sleep 30", None), &ws, &cancel).await;
        assert!(matches!(result, Err(ToolError::Cancelled { .. })));
        Ok(())
    }

    #[test]
    fn inputs_are_checked() {
        assert!(input(" ", None).check().is_err());
        assert!(input("ls", Some(0)).check().is_err());
        assert!(input("ls", Some(MAX_TIMEOUT_SECS + 1)).check().is_err());
        assert!(input("ls", Some(5)).check().is_ok());
    }
}
