//! `run_command`: `sh -c COMMAND` in the workspace root, with a timeout, stdin closed, and
//! stdout / stderr captured head+tail. The command runs in its own process group so a timeout
//! or a signal to the agent (Ctrl-C, SIGTERM, SIGHUP) kills everything it started, not only the
//! shell; descendants that left the group (`setsid`) are found and killed with it. Its
//! environment lacks the credentials of the agent's own (`secrets`).
//!
//! A non-zero exit status is a normal result (the model reads the code); only a command that
//! could not start, timed out, was cancelled or could not be waited for is a tool error.

use std::os::unix::process::CommandExt;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

use super::child::Shell;
use super::output::HeadTail;
use super::{ToolError, ToolKind, ToolSpec};
use crate::agent::cancel::{Cancel, Signal};
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
    Exited(ExitStatus),
    TimedOut,
    Cancelled(Signal),
}

type Capture = Arc<Mutex<HeadTail>>;

pub(crate) async fn run(
    input: &Input,
    ws: &Workspace,
    cancel: &Cancel,
) -> Result<String, ToolError> {
    // The dispatcher checks before each call, but Ctrl-C may land between that check and
    // here; a command spawned now would run for an instant with nobody wanting it.
    if let Some(by) = cancel.signal() {
        return Err(ToolError::NotStarted { by });
    }
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(&input.command)
        .current_dir(ws.root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // The model reads what the command prints: credentials in the agent's own environment
    // (a provider key exported for `legate serve` in the same shell) are not handed to it.
    for name in crate::agent::secrets::scrubbed_names() {
        cmd.env_remove(name);
    }
    let (mut child, (out, err)) = Shell::spawn(&mut cmd).map_err(ToolError::Spawn)?;
    let pid = Some(child.id());
    let _running = Running::set(pid);
    let stdout = Arc::new(Mutex::new(HeadTail::new(KEEP_BYTES)));
    let stderr = Arc::new(Mutex::new(HeadTail::new(KEEP_BYTES)));
    let readers = [
        out.map(|r| capture(r, stdout.clone())),
        err.map(|r| capture(r, stderr.clone())),
    ];
    let secs = input.timeout_secs();
    // Biased towards the shell's own exit: a command that ended is reported as ended, even if
    // Ctrl-C or the timeout became ready in the same poll.
    let waited = tokio::select! {
        biased;
        status = child.wait() => status.map(Ended::Exited),
        by = cancel.cancelled() => Ok(Ended::Cancelled(by)),
        () = tokio::time::sleep(Duration::from_secs(secs)) => Ok(Ended::TimedOut),
    };
    let ended = match waited {
        Ok(Ended::Exited(status)) => Ended::Exited(status),
        Ok(stop) => stop_group(&mut child, pid, stop).await,
        Err(error) => {
            kill_group(pid);
            drain(readers, pid).await;
            return Err(ToolError::Wait {
                error,
                output: render(None, &stdout, &stderr),
            });
        }
    };
    drain(readers, pid).await;
    match ended {
        Ended::Exited(status) => Ok(render(Some(status), &stdout, &stderr)),
        Ended::TimedOut => Err(ToolError::TimedOut {
            secs,
            output: render(None, &stdout, &stderr),
        }),
        Ended::Cancelled(by) => Err(ToolError::Cancelled {
            by,
            output: render(None, &stdout, &stderr),
        }),
    }
}

/// The process group of the command running now (0: none), for [`kill_running`].
static RUNNING_GROUP: AtomicU32 = AtomicU32::new(0);

/// Marks a command's group as running until dropped.
struct Running;

impl Running {
    fn set(pid: Option<u32>) -> Running {
        RUNNING_GROUP.store(pid.unwrap_or(0), Ordering::SeqCst);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING_GROUP.store(0, Ordering::SeqCst);
    }
}

/// Kills the running command's whole group, if one runs: for a second signal, which exits at
/// once without waiting for the first one's kill (a closed terminal can send SIGHUP twice).
pub(in crate::agent) fn kill_running() {
    let pid = RUNNING_GROUP.swap(0, Ordering::SeqCst);
    if pid != 0 {
        kill_group(Some(pid));
    }
}

/// Kills the group for a timeout or Ctrl-C and reaps the shell. Its status tells whether the
/// kill is what ended it: a shell that exited on its own just before is reported as exited,
/// so a result never says "killed" of a command that ran to its end.
async fn stop_group(child: &mut Shell, pid: Option<u32>, stop: Ended) -> Ended {
    // The shell is not reaped yet (its pid cannot have gone to another process): its
    // descendants are found from it, and killed with the group.
    #[cfg(unix)]
    if let Some(pid) = pid {
        super::process_tree::kill_tree(pid);
    }
    // The direct kill is for a system without kill(1); on an exited shell it does nothing.
    let _ = child.start_kill();
    match child.wait().await {
        Ok(status) if !killed(status) => Ended::Exited(status),
        _ => stop,
    }
}

/// True when the shell died of SIGKILL, the signal [`kill_group`] sends.
fn killed(status: ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal() == Some(9)
    }
    #[cfg(not(unix))]
    {
        !status.success()
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

/// Kills the command's process group. Its descendants that left the group are found only
/// while the shell is unreaped ([`stop_group`]): once reaped, its pid may be another
/// process's, whose children are none of ours. A group's id is not given to a new process
/// while the group has members.
fn kill_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid {
        super::process_tree::kill_group(pid);
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

    /// A child that left the group with `setsid` is killed with it.
    #[tokio::test]
    async fn timeout_kills_what_left_the_group() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        let pid_file = dir.path().join("pid");
        let command = "setsid sh -c 'echo $$ > pid.tmp; mv pid.tmp pid; exec sleep 30' & sleep 30";
        let result = run_in(&ws, command, Some(1)).await;
        assert!(matches!(result, Err(ToolError::TimedOut { secs: 1, .. })));
        let pid = std::fs::read_to_string(&pid_file)?.trim().to_owned();
        // SIGKILL is delivered at once, but the process's exit and reaping follow: a bounded
        // poll for it to be gone (or a zombie awaiting init).
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !gone() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone(), "the setsid child {pid} outlived the timeout");
        Ok(())
    }

    #[tokio::test]
    async fn nothing_is_spawned_once_cancelled() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        let (handle, cancel) = crate::agent::cancel::new();
        handle.cancel();
        let result = run(&input("touch ran.txt", None), &ws, &cancel).await;
        assert!(
            matches!(result, Err(ToolError::NotStarted { .. })),
            "{result:?}"
        );
        assert!(!dir.path().join("ran.txt").exists());
        Ok(())
    }

    #[tokio::test]
    async fn cancel_kills_a_running_command() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = Workspace::open(dir.path())?;
        let (handle, cancel) = crate::agent::cancel::new();
        // The command says it is running on stdout, which the test reads through a FIFO.
        let gate = dir.path().join("gate");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&gate)
                .status()?
                .success()
        );
        let reader = std::thread::spawn(move || std::fs::read(gate));
        let command = input("echo up > gate; sleep 30; touch slept.txt", None);
        let raise = async {
            let _ = tokio::task::spawn_blocking(move || reader.join()).await;
            handle.cancel();
        };
        let (result, ()) = tokio::join!(run(&command, &ws, &cancel), raise);
        match result {
            Err(e @ ToolError::Cancelled { .. }) => assert!(e.to_string().contains("killed")),
            other => panic!("expected a kill, got {other:?}"),
        }
        assert!(!dir.path().join("slept.txt").exists());
        Ok(())
    }

    /// A command that started and then could not be waited for is not reported as one that
    /// never started, and what it printed is kept.
    #[test]
    fn a_failed_wait_says_so_with_the_output() {
        let error = ToolError::Wait {
            error: std::io::Error::from_raw_os_error(10),
            output: "--- stdout ---\nran\n".to_owned(),
        };
        let text = error.to_string();
        assert!(
            text.starts_with("the wait for the command failed ("),
            "{text}"
        );
        assert!(
            text.ends_with("it was killed\n--- stdout ---\nran\n"),
            "{text}"
        );
        assert!(!text.contains("cannot start"), "{text}");
    }

    #[test]
    fn only_a_sigkill_counts_as_killed() {
        use std::os::unix::process::ExitStatusExt;
        assert!(killed(ExitStatus::from_raw(9)));
        assert!(!killed(ExitStatus::from_raw(0)), "exit 0");
        assert!(!killed(ExitStatus::from_raw(1 << 8)), "exit 1");
        assert!(!killed(ExitStatus::from_raw(15)), "SIGTERM from elsewhere");
    }

    #[test]
    fn inputs_are_checked() {
        assert!(input(" ", None).check().is_err());
        assert!(input("ls", Some(0)).check().is_err());
        assert!(input("ls", Some(MAX_TIMEOUT_SECS + 1)).check().is_err());
        assert!(input("ls", Some(5)).check().is_ok());
    }
}
