//! Hands the heap memory legate has freed back to the system once the data plane goes quiet.
//!
//! glibc's allocator keeps freed memory for reuse and returns it to the system only from the
//! top of the heap, so after a burst (a hundred connections' buffers, a store that filled and
//! evicted) the freed pages in between stay resident until the process exits: in the benchmark,
//! about 2.5 MiB of a 22 MiB RSS. In a pod whose memory limit counts RSS, a sidecar should go
//! back down after the burst that raised it.
//!
//! `malloc_trim` gives those pages back, but it walks the heap under the allocator's lock, so a
//! request allocating at the same time would wait for it: it runs only after a whole
//! [`CHECK_EVERY`] period in which no request arrived and no data-plane connection ended, once
//! per quiet spell, never under load. A connection's end counts as a request does: what it held
//! (streams cut for a reader that never read them) is freed then, with no request to follow.
//! The admin plane's do not: a kubelet probe ends one every few seconds.
//! A process that is never idle never trims, and then has nothing a trim would find either:
//! its freed pages are being reused.
//!
//! This is the crate's one `unsafe` block (`unsafe_code` is denied everywhere else): glibc has
//! no safe binding for the call, and it takes no pointers and has no preconditions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::proxy::Proxy;

/// How often the request count is looked at. A trim follows a burst by one to two periods.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Decides, from the request count read once per period, when to trim: after a period in
/// which the count did not move, if it moved since the last trim.
#[derive(Debug)]
pub struct Quiet {
    seen: u64,
    trimmed_at: u64,
}

impl Quiet {
    /// Starts from the current count: requests before this point do not call for a trim.
    pub fn new(count: u64) -> Self {
        Quiet {
            seen: count,
            trimmed_at: count,
        }
    }

    /// Takes this period's count; true when the memory should be trimmed now.
    pub fn tick(&mut self, count: u64) -> bool {
        let idle = count == self.seen;
        self.seen = count;
        if idle && count != self.trimmed_at {
            self.trimmed_at = count;
            return true;
        }
        false
    }
}

/// Runs the check on the runtime until the task is aborted (at shutdown). The trim itself runs
/// on the worker, inline: it happens only when no request has arrived for a whole period, and a
/// blocking thread would cost an allocator arena of its own.
pub fn spawn(proxy: Arc<Proxy>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(CHECK_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Requests, and data-plane connections' ends: memory a connection held (streams cut
        // for a reader that never read them) is freed when it ends, with no request to follow.
        let activity = || proxy.requests_seen() + super::listener::connections_ended();
        let mut quiet = Quiet::new(activity());
        loop {
            ticks.tick().await;
            if quiet.tick(activity()) {
                let started = Instant::now();
                let released = trim();
                tracing::debug!(
                    released,
                    micros = started.elapsed().as_micros() as u64,
                    "idle: freed heap memory handed back to the system"
                );
            }
        }
    })
}

/// Asks the allocator to return its free pages; true when it gave any back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "glibc's malloc_trim has no safe binding")]
fn trim() -> bool {
    // SAFETY: malloc_trim takes no pointers and has no preconditions; glibc runs it under each
    // arena's own lock, like any other allocator call.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other allocators (musl, macOS) return free memory on their own and have no such call.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_after_a_quiet_period_that_follows_requests() {
        let mut q = Quiet::new(5);
        assert!(!q.tick(5), "nothing happened since start");
        assert!(!q.tick(9), "requests arrived in this period: not idle");
        assert!(!q.tick(12), "still busy");
        assert!(
            q.tick(12),
            "a whole period without a request after a busy one"
        );
        assert!(!q.tick(12), "already trimmed for this quiet spell");
        assert!(!q.tick(12));
        assert!(!q.tick(13), "a new request");
        assert!(q.tick(13), "quiet again");
    }

    #[test]
    fn never_trims_under_steady_load() {
        let mut q = Quiet::new(0);
        for count in 1..1_000 {
            assert!(!q.tick(count * 7));
        }
    }

    /// Pages freed below a live allocation stay resident until a trim hands them back.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_trim_returns_pages_freed_below_a_live_allocation() {
        // 4 KiB blocks stay under glibc's mmap threshold, so they come from the heap; the last
        // one stays live above the freed ones and keeps them from being trimmed at `free`.
        let mut blocks: Vec<Box<[u8; 4096]>> = (0..1024).map(|_| Box::new([1u8; 4096])).collect();
        let top = blocks.pop();
        drop(blocks);
        assert!(
            trim(),
            "4 MiB freed in the middle of the heap, none returned"
        );
        assert_eq!(top.map(|b| b[4095]), Some(1));
    }
}
