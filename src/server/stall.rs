//! An HTTP/2 stream whose caller gives it no flow-control credit (SPEC §14).
//!
//! hyper polls a stream's response body only while the stream has credit to send what it
//! yields. A caller that keeps reading its socket but never opens one stream's window stalls
//! that stream alone, inside hyper, where the connection's watch ([`super::conn`]), which sees
//! the socket, cannot see it; and the connection must not be closed for it, since its other
//! streams are healthy. Left alone, the stalled stream would hold its upstream stream, the
//! provider connection and a `max_concurrency` slot for as long as the provider streams.
//!
//! So the body watches itself. Once it has handed hyper a frame, hyper must ask for the next
//! one, or drop the body, within `connection_idle_timeout`, the bound a caller that stops
//! reading its socket gets. (hyper keeps a frame it cannot send yet, and with it the body,
//! until the stream has credit, and drops the body once its last frame is sent; so a whole
//! answer, one frame, is watched until then too.) If it does not, a watcher task drops the
//! body, and with it the upstream stream and the request's count in flight, so that a
//! connection left with nothing but such streams falls under its idle deadline. A request cut
//! before its answer's end is recorded as the caller's leaving (499), as when a connection
//! goes; a whole answer already handed over keeps the status it was recorded with. If hyper polls it again
//! later, the body ends in an error, which resets the stream. Time the body spends waiting on
//! its provider (it returned `Pending`) is not a stall.
//!
//! A cut stream's last frame stays with hyper until credit comes or the connection ends, and
//! the stream's slot with it. A caller that keeps another stream busy keeps the connection out
//! of its idle deadline, and could so keep up to hyper's 200 streams' answers held (each up to
//! a 16 MiB whole answer) for as long as it opens new streams. So each cut reports the bytes it
//! leaves behind to the connection's watch, which asks the connection for GOAWAY once they
//! pass [`CUT_HELD_MAX`](super::conn::CUT_HELD_MAX): its streams in flight finish, new ones go
//! to a new connection, and it ends when they are done (see [`super::conn`]).
//!
//! The watcher is one task per stream, spawned at its first frame; it sleeps until the
//! earliest instant the stream could be overdue, and is aborted when the body ends or is
//! dropped, so that a finished stream leaves no task sleeping out its limit. Only HTTP/2
//! answers pay for it (a spawn and an abort). tower's timeouts bound a service's answer, not
//! how soon hyper polls a body, so none of them fits here.

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::conn::ConnWatch;
use super::listener::BoxError;

/// A response body cut off because its stream took nothing for too long.
#[derive(Debug)]
struct Stalled;

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the caller gave the stream no flow-control credit within connection_idle_timeout",
        )
    }
}

impl std::error::Error for Stalled {}

/// The body and what the watcher needs to know of it.
struct State<B> {
    /// `None` once the watcher has dropped it.
    body: Option<B>,
    /// When the last frame was handed to hyper, while the next has not been asked for.
    handed: Option<Instant>,
    /// That frame's data bytes: what hyper holds of the stream if it is cut.
    handed_bytes: u64,
}

/// A response body held to being polled again within its connection's
/// `connection_idle_timeout` of each frame it hands out.
pub struct StallWatched<B> {
    state: Arc<Mutex<State<B>>>,
    conn: Arc<ConnWatch>,
    watcher: Option<AbortHandle>,
}

impl<B> StallWatched<B> {
    pub fn new(body: B, conn: Arc<ConnWatch>) -> Self {
        StallWatched {
            state: Arc::new(Mutex::new(State {
                body: Some(body),
                handed: None,
                handed_bytes: 0,
            })),
            conn,
            watcher: None,
        }
    }

    fn stop_watching(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
    }
}

impl<B> Drop for StallWatched<B> {
    fn drop(&mut self) {
        self.stop_watching();
    }
}

impl<B> Body for StallWatched<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let mut s = this.state.lock();
        s.handed = None;
        let Some(body) = s.body.as_mut() else {
            return Poll::Ready(Some(Err(Stalled.into())));
        };
        let frame = match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(end) => {
                drop(s);
                this.stop_watching();
                return Poll::Ready(end.map(|r| r.map_err(Into::into)));
            }
        };
        // The last frame too: hyper holds it, and the body, until the stream has credit to
        // send it, and drops the body once it is sent.
        s.handed = Some(Instant::now());
        s.handed_bytes = frame.data_ref().map_or(0, |d| d.len() as u64);
        drop(s);
        if this.watcher.is_none() {
            let watcher = tokio::spawn(watch(Arc::downgrade(&this.state), this.conn.clone()));
            this.watcher = Some(watcher.abort_handle());
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.state
            .lock()
            .body
            .as_ref()
            .is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.state
            .lock()
            .body
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}

/// Drops the body once a frame it handed out has waited `connection_idle_timeout` for the
/// next poll, and tells the connection what the cut left with hyper; returns when the body is
/// done, dropped, or cut.
async fn watch<B>(state: Weak<Mutex<State<B>>>, conn: Arc<ConnWatch>) {
    let limit = conn.limits().connection_idle_timeout;
    let mut at = Instant::now() + limit;
    loop {
        tokio::time::sleep_until(at).await;
        let Some(state) = state.upgrade() else { return };
        let mut s = state.lock();
        if s.body.is_none() {
            return;
        }
        match s.handed {
            Some(t) if t + limit <= Instant::now() => {
                let body = s.body.take();
                let held = s.handed_bytes;
                drop(s);
                tracing::debug!(
                    "HTTP/2 stream given no credit within connection_idle_timeout: its answer is dropped"
                );
                // Outside the lock: dropping the body releases the upstream stream.
                drop(body);
                conn.stream_cut(held);
                return;
            }
            Some(t) => at = t + limit,
            None => at = Instant::now() + limit,
        }
    }
}

#[cfg(test)]
mod tests;
