//! Cancellation by a signal (Ctrl-C, SIGTERM, SIGHUP): a flag the loop checks at the top of
//! every turn and the dispatcher before every call, and a future that completes once it is
//! raised, for the waits that should end at once (a model reply being streamed, a terminal
//! prompt, a running command).
//!
//! SIGTERM and SIGHUP are handled like Ctrl-C rather than left to kill the process: a running
//! command sits in its own process group, which a signal to the agent does not reach, so only
//! the agent can kill it; and the transcript should say which calls never ran.

use std::fmt;

use tokio::sync::watch;

/// The signal that stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    Interrupt,
    Terminate,
    Hangup,
}

impl Signal {
    /// 128 + the signal number, as a shell reports a process the signal killed.
    pub(super) fn exit_code(self) -> i32 {
        128 + match self {
            Signal::Hangup => 1,
            Signal::Interrupt => 2,
            Signal::Terminate => 15,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Interrupt => "Ctrl-C",
            Signal::Terminate => "SIGTERM",
            Signal::Hangup => "SIGHUP",
        })
    }
}

/// Raises the flag; held by the signal task (and by tests).
#[derive(Debug, Clone)]
pub(super) struct CancelHandle(watch::Sender<Option<Signal>>);

/// Observes the flag.
#[derive(Debug, Clone)]
pub(super) struct Cancel(watch::Receiver<Option<Signal>>);

/// A new, lowered flag.
pub(super) fn new() -> (CancelHandle, Cancel) {
    let (tx, rx) = watch::channel(None);
    (CancelHandle(tx), Cancel(rx))
}

impl CancelHandle {
    /// Raises the flag for `signal`; the first signal is the one the run reports.
    pub(super) fn raise(&self, signal: Signal) {
        self.0.send_if_modified(|raised| {
            let first = raised.is_none();
            if first {
                *raised = Some(signal);
            }
            first
        });
    }

    /// Ctrl-C.
    #[cfg(test)]
    pub(super) fn cancel(&self) {
        self.raise(Signal::Interrupt);
    }
}

impl Cancel {
    /// A flag that never rises.
    #[cfg(test)]
    pub(super) fn never() -> Cancel {
        let (tx, rx) = watch::channel(None);
        // Dropping the sender is fine: `cancelled` then waits forever.
        drop(tx);
        Cancel(rx)
    }

    /// The signal that cancelled the run, if one did.
    pub(super) fn signal(&self) -> Option<Signal> {
        *self.0.borrow()
    }

    /// Completes once the flag is raised, with the signal that raised it; never completes if
    /// it cannot be raised any more.
    pub(super) async fn cancelled(&self) -> Signal {
        let mut rx = self.0.clone();
        if let Ok(raised) = rx.wait_for(Option::is_some).await
            && let Some(signal) = *raised
        {
            return signal;
        }
        std::future::pending().await
    }
}

/// Raises the flag on the first SIGINT, SIGTERM or SIGHUP. The handlers replace the default
/// terminate-at-once, so the loop decides when to stop and the transcript stays whole. A second
/// signal exits at once with the first one's code, for a tool stuck where the flag is not
/// watched; the transcript is fsynced record by record, so that is no worse than a crash.
///
/// The handlers are installed before this returns, so a signal that comes while the run starts
/// is not lost to the default action.
pub(super) fn on_signals(handle: CancelHandle) {
    let mut signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("legate agent: cannot install signal handlers: {e}");
            return;
        }
    };
    tokio::spawn(async move {
        let Some(first) = signals.next().await else {
            return;
        };
        handle.raise(first);
        if signals.next().await.is_some() {
            // The first signal's kill of a running command may not have gone out yet.
            super::tools::run_command::kill_running();
            std::process::exit(first.exit_code());
        }
    });
}

#[cfg(unix)]
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal; `None` once none can come any more.
    async fn next(&mut self) -> Option<Signal> {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Some(Signal::Interrupt),
            Some(()) = self.terminate.recv() => Some(Signal::Terminate),
            Some(()) = self.hangup.recv() => Some(Signal::Hangup),
            else => None,
        }
    }
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals)
    }

    async fn next(&mut self) -> Option<Signal> {
        tokio::signal::ctrl_c()
            .await
            .ok()
            .map(|()| Signal::Interrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn raising_the_flag_wakes_waiters_with_the_first_signal() {
        let (handle, cancel) = new();
        assert_eq!(cancel.signal(), None);
        let waiter = {
            let cancel = cancel.clone();
            tokio::spawn(async move { cancel.cancelled().await })
        };
        handle.raise(Signal::Terminate);
        handle.raise(Signal::Interrupt);
        assert_eq!(waiter.await.ok(), Some(Signal::Terminate));
        assert_eq!(cancel.signal(), Some(Signal::Terminate));
    }

    #[test]
    fn exit_codes_are_128_plus_the_signal_number() {
        assert_eq!(Signal::Interrupt.exit_code(), 130);
        assert_eq!(Signal::Terminate.exit_code(), 143);
        assert_eq!(Signal::Hangup.exit_code(), 129);
    }

    #[tokio::test(start_paused = true)]
    async fn never_is_never_cancelled() {
        let cancel = Cancel::never();
        assert_eq!(cancel.signal(), None);
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(10), cancel.cancelled()).await;
        assert!(waited.is_err());
    }
}
