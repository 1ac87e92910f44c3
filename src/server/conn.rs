//! Deadlines of one inbound connection (SPEC §14), whatever protocol it speaks. hyper bounds
//! only the HTTP/1 head, and only once protocol detection is over; a peer that sends nothing,
//! only an HTTP/2 preface, or half a request head would otherwise hold its descriptor forever.
//!
//! The watch sees the connection from outside: the socket's reads (through [`WatchedIo`]) and
//! the requests that reach the service (through [`ConnWatch::begin`]). While no request is in
//! flight the connection must, from its first unanswered byte, deliver a request within
//! `header_read_timeout` (a new connection from its accept), and is closed after
//! `connection_idle_timeout` without one. A request in flight is bounded by its own timeouts,
//! and its answer by the socket (through [`WatchedIo`]'s writes): once a write waits on a full
//! socket, the caller must take some of it within `connection_idle_timeout`. A caller that
//! stops reading would otherwise hold its connection, and through backpressure the upstream
//! call and a provider concurrency slot, for as long as the provider kept the stream open.
//! Over HTTP/2 that covers a caller that stops reading the socket; one that reads it but
//! withholds flow-control credit from one stream stalls only that stream, inside hyper, and is
//! not seen here: that stream's body watches itself ([`super::stall`]).

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The least time a connection has waited for a request before its plane, when full, may close
/// it for a new one: a just-accepted connection's first request, or a just-answered caller's
/// reading of its answer, is on its way well within it (a peer beside it, a round trip away).
/// Short, because while every connection is younger nothing can be closed and a new peer
/// waits: at 1 s, a peer opening a hundred idle connections a second to the admin plane held
/// a kubelet's probe past its 1 s timeout. The longest-idle connection goes first, so a young
/// one is chosen only once every other is busy or younger still.
pub const EVICTABLE_AFTER: Duration = Duration::from_millis(100);

/// The grace an HTTP/2 connection closed for a new peer gets after its GOAWAY, with nothing in
/// flight: enough for a client that reads its socket to answer the GOAWAY's PING (a round trip
/// on the same host) and for a stream that raced the GOAWAY to arrive (it is then served). A
/// client that does not read its idle connections (some SDKs' HTTP/2 transports) would
/// otherwise hold the slot for the whole `header_read_timeout` while the new peer waits.
pub const EVICTED_GRACE: Duration = Duration::from_secs(1);

/// Bytes that HTTP/2 streams cut for want of credit may leave with hyper on one connection
/// (see [`super::stall`]) before it is asked to end with GOAWAY: one whole answer at the most
/// legate holds (`proxy::upread`'s 16 MiB). One such stream, or a few streams cut with
/// [`H2_SEND_BUF`] queued each, cost a caller nothing; a caller that keeps starving streams
/// has its connection ended after the second whole answer, or about the fortieth stream.
pub const CUT_HELD_MAX: u64 = 16 << 20;

/// Bytes of a stream's answer the HTTP/2 layer queues ahead of the caller's credit, before the
/// frame hyper keeps: a cut stream is counted as holding these besides that frame.
pub const H2_SEND_BUF: usize = 400 << 10;

/// The deadlines a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_read_timeout: Duration,
    pub connection_idle_timeout: Duration,
    /// How long the rest of a request body left unread is read and dropped for, after its
    /// answer, so that the connection can carry the next request (HTTP/1).
    pub body_read_timeout: Duration,
}

struct State {
    inflight: usize,
    /// When the connection last had no request in flight (its accept, at first).
    idle_since: Instant,
    /// The first byte received since then, if any: a request is on its way.
    head_started: Option<Instant>,
    /// Whether any request reached the service yet.
    served: bool,
    /// The connection speaks HTTP/2: bytes read while nothing is in flight are frames
    /// (window updates, pings, settings), not the head of a next request.
    frames: bool,
    /// It was asked to end with GOAWAY ([`ConnWatch::ask_goaway`]).
    goaway: bool,
    /// It was chosen to make room for a new connection ([`ConnWatch::evict_if_idle`]): it
    /// closes as soon as nothing is in flight on it.
    evicted: bool,
    /// Bytes its HTTP/2 streams cut for want of credit left with hyper.
    cut_held: u64,
    /// Since when a write has waited on a full socket, if one does.
    write_stalled: Option<Instant>,
    /// The instant the watchdog sleeps until (`None` before it first looked).
    armed: Option<Instant>,
    /// The deadline may have come before `armed`: the watchdog must look again.
    changed: bool,
    /// The watchdog's task, woken when `changed` is set.
    waker: Option<Waker>,
}

/// What one connection is doing, shared by its socket, its requests and its watchdog.
pub struct ConnWatch {
    limits: ConnLimits,
    state: Mutex<State>,
    /// [`watched`] is polling the connection, and polls the watchdog right after it.
    serving: AtomicBool,
    /// Cancelled when an HTTP/2 connection is idle past its deadline: it is to say GOAWAY
    /// and end, rather than be dropped under a request the caller may be sending.
    goaway: tokio_util::sync::CancellationToken,
}

impl ConnWatch {
    pub fn new(limits: ConnLimits) -> Arc<Self> {
        Arc::new(ConnWatch {
            limits,
            state: Mutex::new(State {
                inflight: 0,
                idle_since: Instant::now(),
                head_started: None,
                served: false,
                frames: false,
                goaway: false,
                evicted: false,
                cut_held: 0,
                write_stalled: None,
                armed: None,
                changed: false,
                waker: None,
            }),
            serving: AtomicBool::new(false),
            goaway: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// The connection is HTTP/2 from here on (see [`State::frames`]).
    pub fn speaks_frames(&self) {
        self.lock().frames = true;
    }

    /// Resolves when an HTTP/2 connection has been idle past its deadline: it should send
    /// GOAWAY and end once its streams are done.
    pub fn goaway_due(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.goaway.cancelled()
    }

    /// An HTTP/2 connection overstayed: asks it to say GOAWAY (see [`watched`]). A stream
    /// that raced the GOAWAY is in flight, and served; with nothing in flight, what hyper
    /// still holds (streams cut for want of credit, whose answers wait for it) is given
    /// `header_read_timeout` more, not another idle timeout, before the connection is
    /// dropped. Whether it had not been asked yet.
    fn ask_goaway(&self) -> bool {
        let mut s = self.lock();
        // A connection that never delivered a whole request has no stream to finish: past its
        // `header_read_timeout` it is dropped at once, not given a GOAWAY's grace as well (a
        // HEADERS frame whose block never ends would otherwise hold it twice as long).
        if s.goaway || !s.frames || !s.served {
            return false;
        }
        s.goaway = true;
        s.idle_since = Instant::now();
        s.changed = true;
        drop(s);
        self.goaway.cancel();
        true
    }

    /// An HTTP/2 stream of this connection was cut for want of credit, leaving the `held`
    /// bytes of its last frame with hyper, and up to [`H2_SEND_BUF`] queued before it, until
    /// credit comes or the connection ends. Past [`CUT_HELD_MAX`] the
    /// connection is asked for GOAWAY, whatever else it has in flight: those streams finish,
    /// new ones go to a new connection, and once nothing is in flight it is dropped
    /// `header_read_timeout` later if the starved streams still hold it.
    pub fn stream_cut(&self, held: u64) {
        let mut s = self.lock();
        s.cut_held = s
            .cut_held
            .saturating_add(held)
            .saturating_add(H2_SEND_BUF as u64);
        let total = s.cut_held;
        drop(s);
        if total > CUT_HELD_MAX && self.ask_goaway() {
            tracing::warn!(
                held_bytes = total,
                "HTTP/2 caller starves its streams of more answer bytes than legate holds for it: the connection is ended with GOAWAY"
            );
            // The connection's task waits on the GOAWAY's token; the watchdog looks at the
            // deadline again when that task polls it.
        }
    }

    /// How long this connection has waited for a request, for choosing one to close when its
    /// plane is full: whether a request's head has begun to arrive, and since when it waited
    /// (for that head, or since its last request or its accept). `None` when it may not be
    /// chosen at `now`: a request in flight, a write waiting on the caller (an answer's last
    /// bytes, queued), chosen already, or idle less than [`EVICTABLE_AFTER`] (a connection
    /// just accepted, whose first request is on its way, or one that just answered).
    pub fn idleness(&self, now: Instant) -> Option<(bool, Instant)> {
        let s = self.lock();
        if !Self::evictable(&s, now) {
            return None;
        }
        Some(match s.head_started {
            Some(h) => (true, h),
            None => (false, s.idle_since),
        })
    }

    fn evictable(s: &State, now: Instant) -> bool {
        s.inflight == 0
            && !s.evicted
            && s.write_stalled.is_none()
            && now.saturating_duration_since(s.idle_since) >= EVICTABLE_AFTER
    }

    /// It was chosen to be closed for a new peer and is still open (an HTTP/2 one in its
    /// GOAWAY's grace).
    pub fn closing_for_room(&self) -> bool {
        self.lock().evicted
    }

    /// Closes the connection now if it may be chosen at `now` ([`ConnWatch::idleness`]): an
    /// HTTP/1 one at once, an HTTP/2 one after GOAWAY and its usual grace; whether it was.
    pub fn evict_if_idle(&self, now: Instant) -> bool {
        let mut s = self.lock();
        if !Self::evictable(&s, now) {
            return false;
        }
        s.evicted = true;
        s.changed = true;
        if let Some(w) = &s.waker {
            w.wake_by_ref();
        }
        true
    }

    /// The deadlines this connection is held to.
    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// A request reached the service; it is in flight until the guard drops (with the
    /// response body, or with the handler if the caller went away first).
    pub fn begin(self: &Arc<Self>) -> InFlight {
        // The watchdog is not woken: a request in flight removes the deadline, and the
        // watchdog finds that out when it next wakes on its own. Waking it here cost the
        // connection's task an extra poll per request.
        let mut s = self.lock();
        s.inflight += 1;
        s.served = true;
        s.head_started = None;
        // A request that came before the eviction took effect is served, and the
        // connection is no longer idle: the next full plane may choose it again.
        s.evicted = false;
        drop(s);
        InFlight(self.clone())
    }

    /// Bytes of a next request were read while the last one was served: its head is held
    /// to the header read timeout from now.
    pub fn head_begun(&self) {
        self.on_bytes();
    }

    /// What came of a next head was only blank lines, skipped: the connection is idle again,
    /// held to the idle timeout (which runs from the last answer, so a caller trickling blank
    /// lines is still closed at it) rather than to the header read timeout.
    pub fn head_withdrawn(&self) {
        let mut s = self.lock();
        if s.inflight == 0 {
            s.head_started = None;
        }
    }

    fn on_bytes(&self) {
        let mut s = self.lock();
        if s.inflight == 0 && s.head_started.is_none() && !s.frames {
            s.head_started = Some(Instant::now());
            self.deadline_moved(&mut s);
        }
    }

    /// The deadline may have come forward, from the connection's own socket: seen by the
    /// watchdog in this poll of the task, or woken for.
    fn deadline_moved(&self, s: &mut State) {
        // Seen while [`watched`] polls the connection (as the socket always is): the
        // watchdog is polled next, in the same poll of the task, and finds the change then.
        // Waking it would cost the task another poll, once per request.
        if self.serving.load(Ordering::Relaxed) {
            self.note_if_sooner(s);
        } else {
            self.wake_if_sooner(s);
        }
    }

    /// A write found the socket full: the caller must take some of it within
    /// `connection_idle_timeout`, whatever is in flight.
    fn write_waits(&self) {
        let mut s = self.lock();
        s.write_stalled = Some(Instant::now());
        self.deadline_moved(&mut s);
    }

    /// The socket took bytes again. The deadline only moves later: the watchdog finds that
    /// out when it wakes.
    fn write_moved(&self) {
        self.lock().write_stalled = None;
    }

    /// Marks the deadline for the watchdog to look at again if it is now earlier than the
    /// instant it sleeps until; whether it did.
    fn note_if_sooner(&self, s: &mut State) -> bool {
        let sooner = self.sooner_than_armed(s);
        s.changed |= sooner;
        sooner
    }

    /// Wakes the watchdog when the deadline is now earlier than the instant it sleeps until:
    /// only then must it look again. A later deadline, or none, it finds when it wakes.
    fn wake_if_sooner(&self, s: &mut State) {
        if self.note_if_sooner(s) {
            // A tokio waker only schedules its task; nothing runs under this lock.
            if let Some(w) = &s.waker {
                w.wake_by_ref();
            }
        }
    }

    /// Whether the deadline is now earlier than the instant the watchdog sleeps until: only
    /// then must it be woken. A later deadline, or none, it finds when it wakes.
    fn sooner_than_armed(&self, s: &State) -> bool {
        match (self.deadline_of(s), s.armed) {
            (Some(d), Some(armed)) => d < armed,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// When the connection must be closed if nothing changes, or `None` while a request is
    /// in flight and the socket takes what is written.
    fn deadline(&self) -> Option<Instant> {
        self.deadline_of(&self.lock())
    }

    fn deadline_of(&self, s: &State) -> Option<Instant> {
        let stalled = s
            .write_stalled
            .map(|t| t + self.limits.connection_idle_timeout);
        if s.inflight > 0 {
            return stalled;
        }
        if s.evicted && !s.goaway {
            // Due now (`idle_since` is past). Over HTTP/2 that asks for GOAWAY, after which
            // the usual grace below applies: streams whose answers hyper still holds finish.
            return Some(s.idle_since);
        }
        let head = if s.served {
            s.head_started
        } else {
            // A new connection owes its first request from the accept on.
            Some(s.idle_since)
        };
        let idle = s.idle_since
            + if s.goaway {
                let grace = self
                    .limits
                    .header_read_timeout
                    .min(self.limits.connection_idle_timeout);
                // Closed for a new peer: that peer waits on this grace.
                if s.evicted {
                    grace.min(EVICTED_GRACE)
                } else {
                    grace
                }
            } else {
                self.limits.connection_idle_timeout
            };
        let due = match head {
            Some(h) => idle.min(h + self.limits.header_read_timeout),
            None => idle,
        };
        Some(stalled.map_or(due, |t| t.min(due)))
    }

    /// Resolves when the connection has overstayed: the caller then drops it. While a
    /// request is in flight it looks again every `connection_idle_timeout`, so that the end of
    /// a request needs to wake it only when that brings the deadline forward.
    ///
    /// It is polled with its connection, each time the connection's task wakes (several times
    /// per request): such a poll only asks the timer whether it fired, since the timer and the
    /// state hold the task's waker already. Re-arming happens only when the
    /// deadline came forward or the timer fired.
    pub async fn expired(&self) {
        let sleep = tokio::time::sleep_until(Instant::now() + self.limits.connection_idle_timeout);
        tokio::pin!(sleep);
        std::future::poll_fn(|cx| self.poll_expired(cx, sleep.as_mut())).await
    }

    fn poll_expired(&self, cx: &mut Context<'_>, mut sleep: Pin<&mut Sleep>) -> Poll<()> {
        loop {
            let mut s = self.lock();
            if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.waker = Some(cx.waker().clone());
            }
            match s.armed {
                Some(_) if !s.changed => {
                    drop(s);
                    // The timer is armed for that instant and holds the task's waker: until
                    // it has fired, the instant has not come (asking the timer is cheaper
                    // than reading the clock, once per poll of the connection).
                    if !sleep.is_elapsed() {
                        return Poll::Pending;
                    }
                }
                _ => {
                    s.changed = false;
                    let at = self
                        .deadline_of(&s)
                        .unwrap_or_else(|| Instant::now() + self.limits.connection_idle_timeout);
                    s.armed = Some(at);
                    drop(s);
                    sleep.as_mut().reset(at);
                }
            }
            // Registers the timer after a reset, or finds it fired.
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.deadline().is_some_and(|d| d <= Instant::now()) {
                return Poll::Ready(());
            }
            self.lock().changed = true;
        }
    }
}

/// Serves `conn` until it ends (`Some` of its output) or overstays its deadlines (`None`: the
/// caller then drops it). The connection is polled first and the watchdog right after it, so
/// that what the connection's reads tell the watch is seen in the same poll of the task.
///
/// An HTTP/2 connection that overstays is first asked to end itself with GOAWAY
/// ([`ConnWatch::goaway_due`]), which tells the caller which of its streams were taken, so
/// that one sent at that moment is known unserved and can be sent again elsewhere; it is
/// dropped only if it overstays its deadlines once more.
pub async fn watched<C: Future>(watch: &ConnWatch, conn: C) -> Option<C::Output> {
    let mut conn = pin!(conn);
    let mut expired = pin!(watch.expired());
    std::future::poll_fn(|cx| {
        loop {
            watch.serving.store(true, Ordering::Relaxed);
            let served = conn.as_mut().poll(cx);
            watch.serving.store(false, Ordering::Relaxed);
            if let Poll::Ready(out) = served {
                return Poll::Ready(Some(out));
            }
            ready!(expired.as_mut().poll(cx));
            if !watch.ask_goaway() {
                return Poll::Ready(None);
            }
            // The connection's next poll sends the GOAWAY; the watchdog starts again.
            expired.set(watch.expired());
        }
    })
    .await
}

/// One request in flight on a watched connection.
pub struct InFlight(Arc<ConnWatch>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.inflight = s.inflight.saturating_sub(1);
        if s.inflight == 0 {
            s.idle_since = Instant::now();
            s.head_started = None;
        }
        self.0.wake_if_sooner(&mut s);
    }
}

/// The socket of a watched connection: every read is reported to the watch, and so is a
/// write that waits on a full socket, and the first one after it that moves bytes.
pub struct WatchedIo<T> {
    inner: T,
    watch: Arc<ConnWatch>,
    /// A write waits on the socket (kept here, so that a write that goes through, the usual
    /// case, costs no lock).
    stalled: bool,
}

impl<T> WatchedIo<T> {
    pub fn new(inner: T, watch: Arc<ConnWatch>) -> Self {
        WatchedIo {
            inner,
            watch,
            stalled: false,
        }
    }

    /// Reports what a write's outcome says of the socket: full, or taking bytes again. (A
    /// flush is not one: the socket's is a no-op, ready whether or not it is full.)
    fn wrote(&mut self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending if !self.stalled => {
                self.stalled = true;
                self.watch.write_waits();
            }
            Poll::Ready(Ok(n)) if self.stalled && *n > 0 => {
                self.stalled = false;
                self.watch.write_moved();
            }
            _ => {}
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WatchedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.watch.on_bytes();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WatchedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(&r);
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A response body that keeps its request in flight until it is done or dropped.
pub struct Guarded<B> {
    inner: B,
    /// The answer to a HEAD: its headers go out, its body does not (hyper's HTTP/2 server
    /// would send it; RFC 9110 §9.3.2 says a HEAD answer has none).
    bodiless: bool,
    _inflight: InFlight,
}

impl<B> Guarded<B> {
    pub fn new(inner: B, inflight: InFlight) -> Self {
        Guarded {
            inner,
            bodiless: false,
            _inflight: inflight,
        }
    }

    /// The same, answering a HEAD: no body is sent.
    pub fn bodiless(inner: B, inflight: InFlight) -> Self {
        Guarded {
            inner,
            bodiless: true,
            _inflight: inflight,
        }
    }
}

impl<B> Body for Guarded<B>
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
        if this.bodiless {
            return Poll::Ready(None);
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.bodiless || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.bodiless {
            return SizeHint::with_exact(0);
        }
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ConnLimits = ConnLimits {
        header_read_timeout: Duration::from_secs(10),
        connection_idle_timeout: Duration::from_secs(120),
        body_read_timeout: Duration::from_secs(60),
    };

    /// Starts the watchdog and lets it arm; returns when it fires.
    async fn watchdog(w: &Arc<ConnWatch>) -> tokio::task::JoinHandle<Instant> {
        let watch = w.clone();
        let fired = tokio::spawn(async move {
            watch.expired().await;
            Instant::now()
        });
        tokio::task::yield_now().await;
        fired
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_head_is_held_to_the_header_read_timeout_from_its_own_first_byte() {
        let w = ConnWatch::new(LIMITS);
        let fired = watchdog(&w).await;
        w.on_bytes();
        let first = w.begin();
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(first);
        tokio::time::advance(Duration::from_secs(4)).await;
        // A second head begins 5 s in and never completes.
        w.on_bytes();
        let head = Instant::now();
        let at = fired.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(at - head, LIMITS.header_read_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_long_after_the_last_request_wakes_the_watchdog_for_its_sooner_deadline() {
        let w = ConnWatch::new(LIMITS);
        let fired = watchdog(&w).await;
        w.on_bytes();
        drop(w.begin());
        let idle = Instant::now();
        // Past the first head's deadline: the watchdog wakes and re-arms for the idle timeout.
        tokio::time::advance(Duration::from_secs(20)).await;
        let idle_deadline = Some(idle + LIMITS.connection_idle_timeout);
        for _ in 0..10 {
            if w.lock().armed == idle_deadline {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(w.lock().armed, idle_deadline);
        assert!(!fired.is_finished());
        // Asleep until then, it must be woken for the new head's deadline.
        w.on_bytes();
        let head = Instant::now();
        let at = fired.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(at - head, LIMITS.header_read_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_read_while_serving_re_arms_the_watchdog_in_the_same_poll() {
        use std::sync::atomic::AtomicUsize;
        let w = ConnWatch::new(LIMITS);
        // A connection whose socket read happens when the test says, inside its own poll, as
        // hyper's does.
        let read_now = Arc::new(AtomicBool::new(false));
        let conn_waker: Arc<Mutex<Option<Waker>>> = Arc::default();
        let polls = Arc::new(AtomicUsize::new(0));
        let (w2, r2, cw2, p2) = (
            w.clone(),
            read_now.clone(),
            conn_waker.clone(),
            polls.clone(),
        );
        let conn = std::future::poll_fn(move |cx| {
            p2.fetch_add(1, Ordering::SeqCst);
            *cw2.lock() = Some(cx.waker().clone());
            if r2.swap(false, Ordering::SeqCst) {
                w2.on_bytes();
            }
            Poll::<()>::Pending
        });
        let w3 = w.clone();
        let fired = tokio::spawn(async move {
            assert!(watched(&w3, conn).await.is_none());
            Instant::now()
        });
        tokio::task::yield_now().await;
        // One request served; then idle past the first head's deadline, so that the watchdog
        // sleeps until the idle timeout.
        drop(w.begin());
        let idle = Instant::now();
        tokio::time::advance(Duration::from_secs(20)).await;
        for _ in 0..10 {
            if w.lock().armed == Some(idle + LIMITS.connection_idle_timeout) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(w.lock().armed, Some(idle + LIMITS.connection_idle_timeout));
        // The socket turns readable: the connection's task is woken once and reads a head.
        let before = polls.load(Ordering::SeqCst);
        read_now.store(true, Ordering::SeqCst);
        let head = Instant::now();
        conn_waker.lock().take().unwrap().wake();
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        // Re-armed for the head's sooner deadline within that one poll: no second wake-up.
        assert_eq!(polls.load(Ordering::SeqCst), before + 1);
        assert_eq!(w.lock().armed, Some(head + LIMITS.header_read_timeout));
        let at = fired.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(at - head, LIMITS.header_read_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_idle_timeout_after_its_last_request() {
        let w = ConnWatch::new(LIMITS);
        let fired = watchdog(&w).await;
        w.on_bytes();
        let req = w.begin();
        // In flight far longer than both timeouts: not closed.
        tokio::time::advance(Duration::from_secs(300)).await;
        assert!(!fired.is_finished());
        drop(req);
        let done = Instant::now();
        let at = fired.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(at - done, LIMITS.connection_idle_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_http2_connection_is_asked_for_goaway_then_dropped_after_the_header_timeout() {
        let w = ConnWatch::new(LIMITS);
        w.speaks_frames();
        drop(w.begin());
        let idle = Instant::now();
        // Frames between requests (a ping) begin no head.
        w.on_bytes();
        let (w2, w3) = (w.clone(), w.clone());
        let asked = tokio::spawn(async move {
            w2.goaway_due().await;
            Instant::now()
        });
        // A connection that never ends itself (its streams wait for credit forever).
        let dropped = tokio::spawn(async move {
            assert!(watched(&w3, std::future::pending::<()>()).await.is_none());
            Instant::now()
        });
        let asked = asked.await.unwrap();
        assert_eq!(asked - idle, LIMITS.connection_idle_timeout);
        let dropped = dropped.await.unwrap();
        assert_eq!(dropped - asked, LIMITS.header_read_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_that_never_delivered_a_request_is_dropped_at_the_header_timeout() {
        let w = ConnWatch::new(LIMITS);
        w.speaks_frames();
        let accepted = Instant::now();
        // Its preface and a request head's first frames came, and no whole request.
        w.on_bytes();
        let w2 = w.clone();
        let dropped = tokio::spawn(async move {
            assert!(watched(&w2, std::future::pending::<()>()).await.is_none());
            Instant::now()
        });
        let dropped = dropped.await.unwrap();
        assert_eq!(dropped - accepted, LIMITS.header_read_timeout);
        assert!(!w.lock().goaway);
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_http2_connection_says_goaway_at_once_then_gets_the_usual_grace() {
        let w = ConnWatch::new(LIMITS);
        w.speaks_frames();
        drop(w.begin());
        tokio::time::advance(EVICTABLE_AFTER).await;
        let (w2, w3) = (w.clone(), w.clone());
        let asked = tokio::spawn(async move {
            w2.goaway_due().await;
            Instant::now()
        });
        let dropped = tokio::spawn(async move {
            assert!(watched(&w3, std::future::pending::<()>()).await.is_none());
            Instant::now()
        });
        tokio::task::yield_now().await;
        let evicted = Instant::now();
        assert!(w.evict_if_idle(evicted));
        let asked = asked.await.unwrap();
        assert_eq!(asked, evicted);
        // Closed for a new peer that waits on it, it gets a short grace, not
        // `header_read_timeout`: a client that never reads its idle connection (and so never
        // answers the GOAWAY's PING) holds the slot no longer than that.
        let dropped = dropped.await.unwrap();
        assert_eq!(dropped - asked, EVICTED_GRACE);
    }

    /// A watched connection with a request in flight, over a socket that holds 1 KiB: the
    /// watch, the caller's end, the connection's end and the request.
    fn answering() -> (
        Arc<ConnWatch>,
        tokio::io::DuplexStream,
        WatchedIo<tokio::io::DuplexStream>,
        InFlight,
    ) {
        let w = ConnWatch::new(LIMITS);
        let (caller, server) = tokio::io::duplex(1024);
        let io = WatchedIo::new(server, w.clone());
        let req = w.begin();
        (w, caller, io, req)
    }

    /// A request in flight whose answer the caller stops taking: the deadline counts from the
    /// last write the socket took, so a reader taking 1 KiB every 100 s of a 120 s limit is
    /// served for as long as it reads, and one that stops is closed 120 s after its last read.
    #[tokio::test(start_paused = true)]
    async fn a_caller_that_stops_taking_its_answer_is_closed_idle_timeout_after_its_last_read() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (w, mut caller, mut io, req) = answering();
        let conn = async move {
            let chunk = [b'z'; 4096];
            while io.write_all(&chunk).await.is_ok() {}
        };
        let w2 = w.clone();
        let closed = tokio::spawn(async move {
            assert!(watched(&w2, conn).await.is_none(), "the writer never ends");
            Instant::now()
        });
        let mut buf = [0u8; 1024];
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(100)).await;
            assert!(caller.read(&mut buf).await.unwrap() > 0);
        }
        assert!(!closed.is_finished(), "closed while the caller still reads");
        let last_read = Instant::now();
        // An hour of the paused clock: without the deadline the connection would stay.
        let at = tokio::time::timeout(Duration::from_secs(3600), closed)
            .await
            .expect("the connection is closed")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(at - last_read, LIMITS.connection_idle_timeout);
        drop(req);
    }

    /// Once the caller has taken all that was written, a request in flight is bounded by its
    /// own timeouts again: a stream waiting on its provider is not cut for a write that once
    /// waited.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_waited_and_went_through_leaves_no_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (w, mut caller, mut io, req) = answering();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let conn = async move {
            io.write_all(&[b'z'; 8192]).await.unwrap();
            // Then nothing to write for a long time, as while a provider thinks.
            let _ = rx.await;
        };
        let w2 = w.clone();
        let served = tokio::spawn(async move { watched(&w2, conn).await.is_some() });
        let mut got = 0;
        let mut buf = [0u8; 1024];
        while got < 8192 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            got += caller.read(&mut buf).await.unwrap();
        }
        tokio::time::sleep(LIMITS.connection_idle_timeout * 3).await;
        assert!(
            !served.is_finished(),
            "closed while nothing waited to be written"
        );
        tx.send(()).unwrap();
        assert!(served.await.unwrap(), "the connection ended on its own");
        drop(req);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_owes_its_first_request_within_the_header_read_timeout() {
        let w = ConnWatch::new(LIMITS);
        let accepted = Instant::now();
        let fired = watchdog(&w).await;
        let at = fired.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(at - accepted, LIMITS.header_read_timeout);
    }
}
