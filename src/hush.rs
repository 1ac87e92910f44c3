//! Wake-ups that hyper's HTTP/1 body channel sends to a connection that has finished the body,
//! dropped.
//!
//! hyper hands an HTTP/1 body from the connection's task to its reader through a channel, and
//! each time the reader takes a chunk it wakes the connection's task so that it reads more
//! (hyper 1.12, `body/chan.rs`, `Receiver::poll_next`). It does so also when the connection has
//! already sent the body's last chunk and closed its end. legate's requests nearly always
//! arrive whole with their heads, so each request paid for a task poll of the caller's
//! connection that found nothing to do. (The upstream answer paid for one too, until legate
//! read its HTTP/1 answers itself: see `upstream::h1`.)
//!
//! Nothing on this side of hyper's API avoids the wake-up, but it can be caught. A connection's
//! task is polled through [`quieted`], which hands hyper a waker of its own ([`Relay`]) instead
//! of the task's. A body is read through [`Hushed`]: while it takes a chunk, a relay's wake-up
//! is held instead of passed on; if that chunk was the last of a known length, `Hushed` asks
//! the channel once more at once, and when the channel answers that the sending end is closed,
//! nobody is left to need the wake-up and it is dropped. In every other case (the sending end
//! still open, more to come, an error) it is passed on as it would have been. Only HTTP/1
//! bodies are hushed: reading an HTTP/2 body releases flow-control window, whose wake-up the
//! connection needs.
//!
//! The hold is per thread and lasts only for the synchronous call into the channel, so a
//! wake-up from another thread, or from anything other than the body read, is never held.

use std::cell::Cell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};

/// The waker a connection's task hands to hyper: it wakes the task, unless a [`Hushed`] read
/// on this thread is holding it.
#[derive(Default)]
struct Relay {
    task: AtomicWaker,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !hold(self) {
            self.task.wake();
        }
    }
}

thread_local! {
    /// A body read is taking a chunk on this thread.
    static OPEN: Cell<bool> = const { Cell::new(false) };
    /// The wake-up that read is holding.
    static HELD: Cell<Option<Arc<Relay>>> = const { Cell::new(None) };
}

/// Holds `relay`'s wake-up if a read on this thread is taking a chunk and holds none yet.
fn hold(relay: &Arc<Relay>) -> bool {
    if !OPEN.get() {
        return false;
    }
    match HELD.take() {
        None => {
            HELD.set(Some(relay.clone()));
            true
        }
        // Never more than one: a second wake-up in the same call is passed on.
        Some(first) => {
            HELD.set(Some(first));
            false
        }
    }
}

/// A read's hold: opened around the calls into the body channel; passes on what it holds when
/// dropped, unless [`Window::drop_held`] said nobody needs it.
struct Window;

impl Window {
    fn open() -> Window {
        OPEN.set(true);
        Window
    }

    fn holds(&self) -> bool {
        let held = HELD.take();
        let holds = held.is_some();
        HELD.set(held);
        holds
    }

    fn drop_held(self) {
        OPEN.set(false);
        drop(HELD.take());
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        OPEN.set(false);
        if let Some(relay) = HELD.take() {
            relay.task.wake();
        }
    }
}

/// `fut`, polled with a [`Relay`] for a waker: the task a connection runs in.
pub async fn quieted<F: Future>(fut: F) -> F::Output {
    let relay = Arc::new(Relay::default());
    let waker = Waker::from(relay.clone());
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| {
        relay.task.register(cx.waker());
        fut.as_mut().poll(&mut Context::from_waker(&waker))
    })
    .await
}

/// A body read with the connection's last wake-up dropped (see the module); an HTTP/2 body
/// (`hush` false) or one of unknown length is read as it is.
pub struct Hushed<B: Body> {
    inner: B,
    hush: bool,
    /// The channel said it was closed when asked again after the last chunk: the next read
    /// ends the body.
    ended: bool,
    /// Or it answered with a frame (not expected after a known length): the next read's.
    /// Boxed, so that the body stays small where it is moved about.
    kept: Option<Box<Result<Frame<Bytes>, B::Error>>>,
}

impl<B: Body> Hushed<B> {
    pub fn new(inner: B, hush: bool) -> Self {
        // Only a known length has a last chunk to catch: a chunked body (a stream) is read as
        // it is, without a hold around each of its chunks.
        let hush = hush && inner.size_hint().exact().is_some();
        Hushed {
            inner,
            hush,
            ended: false,
            kept: None,
        }
    }
}

impl<B> Body for Hushed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(kept) = this.kept.take() {
            return Poll::Ready(Some(*kept));
        }
        if std::mem::take(&mut this.ended) {
            return Poll::Ready(None);
        }
        if !this.hush {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        let window = Window::open();
        let got = Pin::new(&mut this.inner).poll_frame(cx);
        if window.holds() && matches!(got, Poll::Ready(Some(Ok(_)))) && this.inner.is_end_stream() {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(None) => {
                    // The sending end is closed: the held wake-up has nobody to wake.
                    this.ended = true;
                    window.drop_held();
                }
                Poll::Ready(Some(frame)) => this.kept = Some(Box::new(frame)),
                Poll::Pending => {}
            }
        }
        got
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.kept.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match (self.ended, &self.kept) {
            (true, _) => SizeHint::with_exact(0),
            (false, Some(_)) => SizeHint::default(),
            (false, None) => self.inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests;
