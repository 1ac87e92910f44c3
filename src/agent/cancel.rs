//! Cancellation (Ctrl-C): a flag the loop checks at the top of every turn, and a future that
//! completes once it is raised, for the waits that should end at once (a model reply being
//! streamed, a terminal prompt, a running command).

use tokio::sync::watch;

/// Raises the flag; held by the signal task (and by tests).
#[derive(Debug, Clone)]
pub(super) struct CancelHandle(watch::Sender<bool>);

/// Observes the flag.
#[derive(Debug, Clone)]
pub(super) struct Cancel(watch::Receiver<bool>);

/// A new, lowered flag.
pub(super) fn new() -> (CancelHandle, Cancel) {
    let (tx, rx) = watch::channel(false);
    (CancelHandle(tx), Cancel(rx))
}

impl CancelHandle {
    pub(super) fn cancel(&self) {
        self.0.send_replace(true);
    }
}

impl Cancel {
    /// A flag that never rises.
    #[cfg(test)]
    pub(super) fn never() -> Cancel {
        let (tx, rx) = watch::channel(false);
        // Dropping the sender is fine: `cancelled` then waits forever.
        drop(tx);
        Cancel(rx)
    }

    pub(super) fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once the flag is raised; never completes if it cannot be raised any more.
    pub(super) async fn cancelled(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|raised| *raised).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Raises the flag on the first Ctrl-C (SIGINT). The handler replaces the default
/// terminate-at-once, so the loop decides when to stop and the transcript stays whole. A
/// second Ctrl-C exits at once with `exit_code`, for a tool stuck where the flag is not
/// watched; the transcript is fsynced record by record, so that is no worse than a crash.
pub(super) fn on_ctrl_c(handle: CancelHandle, exit_code: i32) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        handle.cancel();
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(exit_code);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn raising_the_flag_wakes_waiters() {
        let (handle, cancel) = new();
        assert!(!cancel.is_cancelled());
        let waiter = {
            let cancel = cancel.clone();
            tokio::spawn(async move { cancel.cancelled().await })
        };
        handle.cancel();
        assert!(waiter.await.is_ok());
        assert!(cancel.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn never_is_never_cancelled() {
        let cancel = Cancel::never();
        assert!(!cancel.is_cancelled());
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(10), cancel.cancelled()).await;
        assert!(waited.is_err());
    }
}
