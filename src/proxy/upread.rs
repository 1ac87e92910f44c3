//! Reading an upstream response within its time limits, without deciding anything: a stream
//! up to its commit point (its preamble held back), a whole success body, a small error body,
//! and the call itself up to its response headers. Each chunk must come within the provider's
//! `idle_timeout`, and all of it before the request's deadline.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tokio::time::{Instant, Sleep};

use crate::error::ProxyError;
use crate::proxy::buffers::{self, AnswerShare};
use crate::proxy::upbody::UpstreamBody;
use crate::proxy::watch::SseWatch;
use crate::upstream::SendError;
use crate::upstream::h1::H1Error;
use crate::upstream::{ResponseBody, Upstream};

/// Error bodies read to classify a retryable status are small; larger ones are cut here.
const ERROR_BODY_LIMIT: usize = 1 << 20;
/// A preamble larger than this is forwarded without waiting for content (a misbehaving
/// upstream must not make legate buffer without bound).
const PREAMBLE_LIMIT: usize = 256 << 10;

/// Whether `due` has passed, by `timer`, which is armed for `due` or for an earlier time: if it
/// fires before `due`, it is armed again for `due` (and the task's waker registered with it).
///
/// One timer thus serves a whole body read, each chunk's time limit only moved in the
/// reader's own state: a timer per chunk (`timeout_at`) entered the runtime's timer wheel and
/// left it again for every chunk not there at once, which is most of them (hyper hands a body
/// over chunk by chunk, each after a turn of the connection's task), and resetting one timer
/// per chunk updates its entry per chunk; limits come far apart compared with chunks.
pub(super) fn passed(mut timer: Pin<&mut Sleep>, due: Instant, cx: &mut Context<'_>) -> bool {
    while timer.as_mut().poll(cx).is_ready() {
        if due <= Instant::now() {
            return true;
        }
        timer.as_mut().reset(due);
    }
    false
}

/// `fut`'s output, or None if `idle` passes first, counted from when `fut` first has to wait
/// (and never past `deadline`; see [`passed`]).
///
/// The limit is set by the first `Pending`, not before the first poll: a frame hyper already
/// holds (a whole answer that came in one read, a burst of events) is taken without reading
/// the clock, which costs tens of nanoseconds per read on a virtual machine.
async fn by<F: Future>(
    timer: Pin<&mut Sleep>,
    idle: Duration,
    deadline: Instant,
    fut: F,
) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut timer = timer;
    let mut due = None;
    poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => {
            let due = *due.get_or_insert_with(|| {
                let due = (Instant::now() + idle).min(deadline);
                // The timer must not be later than the limit; earlier, `passed` re-arms it.
                if timer.deadline() > due {
                    timer.as_mut().reset(due);
                }
                due
            });
            if passed(timer.as_mut(), due, cx) {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

/// A read of `incoming` found no bytes in time: when that was its `idle_timeout` (the
/// request's deadline is not yet there), the connection takes no new request (a timed-out
/// request's own deadline says nothing of the connection).
fn stalled(incoming: &UpstreamBody, deadline: Instant) {
    if Instant::now() < deadline {
        incoming.retire_connection();
    }
}

/// Why a stream failed before its commit point.
pub(super) enum PreCommit {
    /// An error event (its data) arrived before any content.
    ErrorEvent(String),
    Broken(&'static str),
}

/// Reads a stream up to its commit point (the first content event, or its end, or a background
/// response's `response.created`), holding the bytes back; each chunk must come within `idle`
/// and all of it before the deadline.
pub(super) async fn read_to_commit(
    incoming: &mut UpstreamBody,
    watch: &mut SseWatch,
    idle: Duration,
    deadline: Instant,
) -> Result<Bytes, PreCommit> {
    let mut held = BytesMut::new();
    // Each chunk's limit is later than the one before: one timer for the whole read,
    // armed for the deadline; `by` moves it earlier once a read has to wait.
    let mut timer = pin!(tokio::time::sleep_until(deadline));
    loop {
        if let Some(d) = &watch.error_data {
            return Err(PreCommit::ErrorEvent(d.clone()));
        }
        if watch.oversize {
            return Err(PreCommit::Broken(
                "an event is larger than server.max_event_bytes",
            ));
        }
        // A background response exists at the provider once its start event came: the caller
        // gets its id at once (to poll or resume it), and no other attempt starts a second one.
        if watch.saw_content
            || watch.saw_terminal
            || held.len() > PREAMBLE_LIMIT
            || watch.background().is_some()
        {
            return Ok(held.freeze());
        }
        match by(timer.as_mut(), idle, deadline, incoming.frame()).await {
            None => {
                stalled(incoming, deadline);
                return Err(PreCommit::Broken(
                    "no content within idle_timeout or the deadline",
                ));
            }
            Some(Some(Err(_))) => return Err(PreCommit::Broken("the connection broke")),
            Some(None) => {
                if let Some(rest) = watch.finish() {
                    held.extend_from_slice(&rest);
                }
                if let Some(d) = &watch.error_data {
                    return Err(PreCommit::ErrorEvent(d.clone()));
                }
                if watch.saw_terminal {
                    return Ok(held.freeze());
                }
                return Err(PreCommit::Broken(
                    "the stream ended before its first content",
                ));
            }
            Some(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data()
                    && let (Some(out), _) = watch.feed(data)
                {
                    held.extend_from_slice(&out);
                }
            }
        }
    }
}

/// A whole success body larger than this is streamed through instead of held.
pub(crate) const WHOLE_BODY_LIMIT: usize = 16 << 20;

pub(super) enum Whole {
    Complete(Bytes),
    /// Larger than `WHOLE_BODY_LIMIT`: what was read so far; the rest follows.
    TooLarge(Bytes),
    /// Holding more would pass `max_buffered_bytes`: what was read so far; the rest follows.
    Full(Bytes),
    Broken(&'static str),
    /// Complete, but not an answer that can reach the caller (translated: no choices, broken
    /// tool arguments).
    Unusable(String),
}

/// Reads a whole response body, each chunk within `idle`, all before the deadline, counting
/// what it holds against `share` of `max_buffered_bytes`.
pub(super) async fn read_whole(
    incoming: &mut UpstreamBody,
    idle: Duration,
    deadline: Instant,
    share: &mut AnswerShare<'_>,
) -> Whole {
    // Most answers arrive as one frame: it is kept as it came, and only a second frame makes
    // a buffer that both are copied into.
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let declared = incoming
        .size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok());
    // Armed for the deadline; `by` moves it earlier once a read has to wait.
    let mut timer = pin!(tokio::time::sleep_until(deadline));
    loop {
        match by(timer.as_mut(), idle, deadline, incoming.frame()).await {
            None => {
                stalled(incoming, deadline);
                return Whole::Broken("the body stalled past idle_timeout or the deadline");
            }
            Some(Some(Err(_))) => return Whole::Broken("the connection broke mid-body"),
            Some(None) => {
                return Whole::Complete(first.unwrap_or_else(|| buffers::exact_buf(buf)));
            }
            Some(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if first.is_none() && buf.is_empty() {
                    if !share.grow(data.len()) {
                        return Whole::Full(data);
                    }
                    if data.len() > WHOLE_BODY_LIMIT {
                        return Whole::TooLarge(data);
                    }
                    first = Some(data);
                    continue;
                }
                if let Some(f) = first.take() {
                    // A declared length that can be counted is reserved at once: one
                    // allocation of the answer's size, instead of a chain of doublings, each
                    // a copy of all read so far and the last up to twice the answer.
                    let now = f.len() + data.len();
                    let room = declared
                        .filter(|&d| d > now && d <= WHOLE_BODY_LIMIT && share.grow(d))
                        .unwrap_or(now);
                    buf.reserve(room);
                    buf.extend_from_slice(&f);
                }
                buf.extend_from_slice(&data);
                // The buffer's allocation is what is held, room to grow included.
                if !share.grow(buf.capacity()) {
                    return Whole::Full(buffers::exact_buf(buf));
                }
                if buf.len() > WHOLE_BODY_LIMIT {
                    return Whole::TooLarge(buffers::exact_buf(buf));
                }
            }
        }
    }
}

/// Reads a small error body (bounded in size and time), counted against `share` of
/// `max_buffered_bytes` until its last view is dropped; `None` when it cannot be read whole
/// (over the limit, cut, or late) or held (the bound is reached).
pub(super) async fn read_small(
    mut incoming: UpstreamBody,
    idle: Duration,
    deadline: Instant,
    mut share: AnswerShare<'_>,
) -> Option<Bytes> {
    let limit = (Instant::now() + idle).min(deadline);
    let read = Limited::new(&mut incoming, ERROR_BODY_LIMIT).collect();
    match tokio::time::timeout_at(limit, read).await {
        Ok(Ok(c)) => {
            let body = c.to_bytes();
            share
                .grow(body.len())
                .then(|| buffers::hold(body, share.into_share()))
        }
        Err(_) => {
            stalled(&incoming, deadline);
            None
        }
        Ok(Err(_)) => None,
    }
}

/// One upstream call (sent at `now`, with the caller's `verbatim` lines it was built for) up
/// to its response headers, bounded by the first-byte timeout and the request's deadline,
/// whichever comes first.
pub(super) async fn send(
    up: &Upstream,
    req: http::Request<Full<Bytes>>,
    verbatim: Option<&crate::verbatim::Verbatim>,
    now: Instant,
    deadline: Instant,
) -> Result<Response<ResponseBody>, ProxyError> {
    let first_byte = now + up.first_byte_timeout;
    let limit = first_byte.min(deadline);
    // Pinned where it is made and polled beside its timer, rather than moved into
    // `tokio::time::timeout_at` and that moved again by its `.await`: the call's future is the
    // largest of the request's (about 1.8 KB), and each move was a copy of all of it.
    let on = crate::upstream::Sent::default();
    let mut call = pin!(up.client().request_on(req, verbatim, now, &on));
    let mut timer = pin!(tokio::time::sleep_until(limit));
    let within = poll_fn(|cx| match call.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(Ok(r)),
        Poll::Pending => timer.as_mut().poll(cx).map(Err),
    });
    match within.await {
        Ok(Ok(resp)) => Ok(resp),
        // A head that is not HTTP is the provider's fault, not the network's: said so, to the
        // caller and in the log at the default level, where "could not connect" would send an
        // operator after the wrong thing. (The reasons are fixed texts, never the head's bytes.)
        Ok(Err(SendError::H1(H1Error::Head(e)))) => {
            tracing::warn!(provider = %up.name, error = %e, "upstream answered with a response head that is not HTTP/1.1");
            Err(ProxyError::UpstreamAnswerUnusable {
                provider: up.name.clone(),
                reason: format!("the response head could not be read as HTTP/1.1 ({e})"),
            })
        }
        Ok(Err(e)) => {
            tracing::debug!(provider = %up.name, connect = e.is_connect(), error = %e, "upstream request failed");
            let failed = e.failed();
            if let crate::error::Failed::Tls(why) = &failed {
                // A certificate or handshake fault is the operator's to fix: said at the level
                // they read, with rustls's reason (never a secret).
                tracing::warn!(provider = %up.name, error = %why, "the provider's TLS certificate was refused: check its base_url and ca_file");
            }
            Err(ProxyError::UpstreamUnreachable {
                provider: up.name.clone(),
                failed,
            })
        }
        // The request's own deadline says nothing of the connection: it stays in use.
        Err(_) if deadline <= first_byte => Err(ProxyError::DeadlineExceeded),
        Err(_) => {
            // The retry, and every later request, go on another connection.
            on.retire();
            Err(ProxyError::UpstreamTimeout {
                provider: up.name.clone(),
            })
        }
    }
}
