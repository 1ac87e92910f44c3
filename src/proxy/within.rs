//! A time limit that starts when a future first has to wait.
//!
//! `tokio::time::timeout` reads the clock when it is made, to know its deadline; most of what
//! a request waits on with a limit is already there when first polled (a request body that
//! came with its head, an answer that came in one read), and a clock read costs tens of
//! nanoseconds on a virtual machine. Here the deadline is taken, and the timer made, at the
//! first `Pending` only.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// `fut`'s output, or `None` if it is still pending `limit` after it first had to wait.
pub async fn within<F: Future>(limit: Duration, fut: F) -> Option<F::Output> {
    within_noting(limit, fut, &mut None).await
}

/// [`within`], noting in `waited` when `fut` first had to wait (left `None` when it never
/// did): the time since is a wait on someone else (a caller's upload), not legate's own.
pub async fn within_noting<F: Future>(
    limit: Duration,
    fut: F,
    waited: &mut Option<Instant>,
) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut timer = pin!(None::<Sleep>);
    poll_fn(|cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if timer.is_none() {
            let now = Instant::now();
            *waited = Some(now);
            timer.set(Some(tokio::time::sleep_until(now + limit)));
        }
        match timer.as_mut().as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_ready_future_is_taken_without_a_timer() {
        assert_eq!(within(Duration::ZERO, async { 7 }).await, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_wait_is_noted_and_a_ready_future_notes_none() {
        let mut waited = None;
        assert_eq!(
            within_noting(Duration::ZERO, async { 7 }, &mut waited).await,
            Some(7)
        );
        assert_eq!(waited, None);
        let start = Instant::now();
        let soon = tokio::time::sleep(Duration::from_secs(2));
        assert_eq!(
            within_noting(Duration::from_secs(5), soon, &mut waited).await,
            Some(())
        );
        assert_eq!(waited, Some(start));
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_counts_from_the_first_wait() {
        let start = Instant::now();
        let never = std::future::pending::<()>();
        assert_eq!(within(Duration::from_secs(5), never).await, None);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_done_within_the_limit_gives_its_output() {
        let soon = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            "done"
        };
        assert_eq!(within(Duration::from_secs(5), soon).await, Some("done"));
    }
}
