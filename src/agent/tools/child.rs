//! A command's shell as a standard-library child, awaited without tokio's `process` driver.
//!
//! With tokio's `process` feature on, every park of every runtime (the proxy's data-plane
//! workers too) tries the two locks of a process-wide orphan queue: eight locked instructions
//! per proxied request, on cache lines every worker writes, for a tool only `legate agent`
//! runs. So the shell is a [`std::process::Child`], and a thread of its own blocks in
//! `waitid(WNOWAIT)` until it ends. That sees the end without reaping the shell: [`Shell::wait`]
//! reaps it itself, so its pid stays the shell's until then, which `process_tree::kill_tree`
//! needs. (A pidfd would need no thread, but tokio's safe constructors of an `AsyncFd` are
//! deprecated as unsound and the one left is `unsafe`, which the crate keeps for hot paths;
//! one thread per command is nothing here.)

use std::io;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus};

use rustix::process::{Pid, WaitId, WaitIdOptions};
use tokio::net::unix::pipe;

/// A running shell, SIGKILLed and reaped (on a thread of its own) if dropped before it ended,
/// as tokio's `kill_on_drop` did.
pub(super) struct Shell {
    child: Child,
    pid: Pid,
}

/// The shell's stdout and stderr, readable on the runtime.
pub(super) type Pipes = (Option<pipe::Receiver>, Option<pipe::Receiver>);

impl Shell {
    /// Spawns `cmd`, whose stdout and stderr should be piped; must run on a tokio runtime
    /// with I/O enabled (the pipes are registered with it).
    pub(super) fn spawn(cmd: &mut Command) -> io::Result<(Shell, Pipes)> {
        catch_sigchld();
        let mut child = cmd.spawn()?;
        let pid = Pid::from_child(&child);
        let out = child.stdout.take();
        let err = child.stderr.take();
        let shell = Shell { child, pid };
        // The shell is killed and reaped by `shell`'s drop if its pipes cannot be registered.
        let pipes = (out.map(stdout).transpose()?, err.map(stderr).transpose()?);
        Ok((shell, pipes))
    }

    pub(super) fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the shell to end and reaps it. Cancel-safe: dropped before the end, it
    /// reaps nothing, and may be called again.
    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ended(self.pid).await?;
        }
    }

    /// Sends SIGKILL to the shell (not its group); nothing if it was reaped.
    pub(super) fn start_kill(&mut self) -> io::Result<()> {
        self.child.kill()
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = self.child.kill();
        // The wait is short (SIGKILL cannot be caught), but a drop must not block the
        // runtime's thread. A zombie is left only if no thread can be started.
        let pid = self.pid;
        let _ = std::thread::Builder::new()
            .name("legate-reap".to_owned())
            .spawn(move || rustix::process::waitid(WaitId::Pid(pid), WaitIdOptions::EXITED));
    }
}

/// Makes sure SIGCHLD is not ignored, once per process. A parent may start legate with it
/// ignored (exec keeps an ignored signal so), and then the kernel reaps each child as it
/// ends: a wait finds none ("No child processes") and the command's exit code is lost. A
/// handler of tokio's, installed once and kept for the process's life, puts children back in
/// the waitable state; it costs a wake-up of the agent's runtime per child that ends.
fn catch_sigchld() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use tokio::signal::unix::{SignalKind, signal};
        if let Err(e) = signal(SignalKind::child()) {
            tracing::warn!(
                error = %e,
                "cannot handle SIGCHLD (not retried): if ignored, commands' exit codes are lost"
            );
        }
    });
}

fn stdout(out: ChildStdout) -> io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(out.into())
}

fn stderr(err: ChildStderr) -> io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(err.into())
}

/// Returns once `pid` (a child not reaped yet) has ended, leaving it to be reaped: a thread
/// blocks in `waitid(WNOWAIT)` until then. A wait dropped early leaves its thread to return at
/// that end (the shell is always killed or waited for in the end): there are at most as many
/// as calls to [`Shell::wait`], two per command.
async fn ended(pid: Pid) -> io::Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("legate-wait".to_owned())
        .spawn(move || {
            // Restarted after a signal: tokio installs its handlers with SA_RESTART, but one
            // without it must not turn a running command into a failed wait.
            let waited = loop {
                match rustix::process::waitid(
                    WaitId::Pid(pid),
                    WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
                ) {
                    Err(rustix::io::Errno::INTR) => continue,
                    other => break other,
                }
            };
            let _ = tx.send(waited.map(drop).map_err(io::Error::from));
        })?;
    rx.await
        .map_err(|_| io::Error::other("the wait's thread ended without an answer"))?
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use tokio::io::AsyncReadExt;

    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    #[tokio::test]
    async fn the_shells_status_and_output_arrive() -> Result<(), Box<dyn std::error::Error>> {
        let (mut shell, (out, err)) = Shell::spawn(&mut sh("echo out; echo err >&2; exit 7"))?;
        let (mut text, mut errors) = (String::new(), String::new());
        out.ok_or("no stdout")?.read_to_string(&mut text).await?;
        err.ok_or("no stderr")?.read_to_string(&mut errors).await?;
        assert_eq!(shell.wait().await?.code(), Some(7));
        assert_eq!((text.as_str(), errors.as_str()), ("out\n", "err\n"));
        // Reaped once; asked again, the same status.
        assert_eq!(shell.wait().await?.code(), Some(7));
        Ok(())
    }

    /// The wait sees the end without reaping: the status is still there to take.
    #[tokio::test]
    async fn the_wait_leaves_the_shell_to_be_reaped() -> Result<(), Box<dyn std::error::Error>> {
        let (mut shell, _pipes) = Shell::spawn(&mut sh("exit 5"))?;
        ended(shell.pid).await?;
        assert_eq!(shell.child.try_wait()?.and_then(|s| s.code()), Some(5));
        Ok(())
    }

    /// A wait given up (a timeout won the race) and then asked again sees the kill.
    #[tokio::test]
    async fn a_wait_given_up_can_be_waited_again() -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::process::ExitStatusExt;
        let (mut shell, _pipes) = Shell::spawn(&mut sh("exec sleep 30"))?;
        let early = tokio::time::timeout(std::time::Duration::from_millis(1), shell.wait()).await;
        assert!(early.is_err(), "{early:?}");
        shell.start_kill()?;
        assert_eq!(shell.wait().await?.signal(), Some(9));
        Ok(())
    }

    /// Dropped while running, the shell is killed and reaped: no zombie is left.
    #[tokio::test]
    async fn a_dropped_shell_is_killed_and_reaped() -> Result<(), Box<dyn std::error::Error>> {
        let (shell, _pipes) = Shell::spawn(&mut sh("exec sleep 30"))?;
        let pid = shell.id();
        drop(shell);
        let gone = || !std::path::Path::new(&format!("/proc/{pid}")).exists();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !gone() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            gone(),
            "the dropped shell {pid} is still there (or a zombie)"
        );
        Ok(())
    }
}
