//! The open connections of one upstream, and which one a request takes.
//!
//! An HTTP/1 connection carries one request at a time: a request takes an idle one out of the
//! list, and its answer's body puts it back once it was read to its end (see
//! [`h1`](super::h1)). No task is spawned per request to hand it back, and a request never
//! opens a connection while an idle one is there: the list holds about as many connections as
//! requests were ever in flight at once. The most recently used idle one is taken first, so
//! that a quiet spell lets the others age out. An HTTP/2 connection stays in the list and is
//! shared.
//!
//! A connection idle for `pool_idle_timeout` is closed: checked when requests pass over it, and
//! by a sweep every quarter of that time while the list is not empty (the sweep task ends when
//! the list does, and with the pool). The same two moments drop an idle HTTP/1 connection the
//! provider closed or spoke on unasked (no task watches it). Idle time is counted from the
//! connection's last request, or, for an HTTP/2 one, from the last sweep that saw it still
//! carrying one. The list is bounded (`cap`, the provider's `max_concurrency`): a connection
//! that would overflow it is closed after its answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Uri;
use http::uri::Authority;
use http_body_util::Full;
use hyper::client::conn::http2;

use super::dial::ConnCount;
use super::h1::H1Conn;
use super::streams::{StreamSlot, Streams};

/// A connection's sending half: an HTTP/1 connection itself (listed only while idle), or a
/// handle on hyper's HTTP/2 connection task and the count of its streams.
pub(super) enum Sender {
    H1(Box<H1Conn>),
    H2(http2::SendRequest<Full<Bytes>>, Arc<Streams>),
}

impl Sender {
    /// Carrying a request (an HTTP/2 connection with a stream open; a listed HTTP/1 one is
    /// idle by being listed).
    fn is_busy(&self) -> bool {
        match self {
            Sender::H1(_) => false,
            Sender::H2(_, streams) => streams.busy(),
        }
    }

    /// An idle HTTP/1 connection is not watched by a task of its own: it is asked when it is
    /// about to be taken and at each sweep (see [`H1Conn::idle_unusable`]). hyper closes an
    /// HTTP/2 one to new requests once its provider said GOAWAY; one retired (see
    /// [`Sent`](super::pool::Sent)) is done with once its streams are, and, unlisted, closed.
    fn is_closed(&mut self) -> bool {
        match self {
            Sender::H1(h) => h.idle_unusable(),
            Sender::H2(s, streams) => s.is_closed() || (streams.going_away() && !streams.busy()),
        }
    }
}

/// Where a connection leads: the scheme and authority it was opened for.
#[derive(Clone, Eq, Debug)]
pub(super) struct Key {
    https: bool,
    authority: Authority,
}

/// Byte for byte rather than `Authority`'s case-insensitive comparison (a few hundred
/// instructions per checkout): the keys compared come from the same configured base URL, and
/// two spellings of one host would only keep separate connections.
impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.https == other.https && self.authority.as_str() == other.authority.as_str()
    }
}

impl Key {
    /// The key of an absolute URI (`None` for a relative one).
    pub(super) fn of(uri: &Uri) -> Option<Key> {
        Some(Key {
            https: uri.scheme_str() == Some("https"),
            authority: uri.authority()?.clone(),
        })
    }
}

/// One open connection.
pub(super) struct Conn {
    pub(super) sender: Sender,
    pub(super) count: Arc<ConnCount>,
    key: Key,
    /// When it was last handed out, put back, or seen reading an answer.
    used: Instant,
    /// It has carried a request before the current one.
    pub(super) reused: bool,
    /// How long after a request's sending a failure on it may still be the keep-alive race
    /// (scaled by how long the connection took to open; see [`super::pool`]).
    pub(super) race_window: Duration,
    /// A handle's stream on an HTTP/2 connection, for its request (then its answer's body).
    pub(super) slot: Option<StreamSlot>,
}

impl Conn {
    pub(super) fn new(
        sender: Sender,
        count: Arc<ConnCount>,
        key: Key,
        race_window: Duration,
    ) -> Conn {
        Conn {
            sender,
            count,
            key,
            used: Instant::now(),
            reused: false,
            race_window,
            slot: None,
        }
    }

    /// The HTTP/1 connection (`None` for an HTTP/2 handle).
    pub(super) fn h1(&self) -> Option<&H1Conn> {
        match &self.sender {
            Sender::H1(h) => Some(h),
            Sender::H2(..) => None,
        }
    }

    pub(super) fn h1_mut(&mut self) -> Option<&mut H1Conn> {
        match &mut self.sender {
            Sender::H1(h) => Some(h),
            Sender::H2(..) => None,
        }
    }

    /// A handle on a shared (HTTP/2) connection holding one of its streams, if the provider
    /// allows another (`forced`: a connection just opened for the request takes it anyway);
    /// `None` for an HTTP/1 one, or a connection with no stream to spare.
    pub(super) fn shared_handle(&self, forced: bool) -> Option<Conn> {
        match &self.sender {
            Sender::H2(s, streams) => Some(Conn {
                slot: Some(if forced {
                    streams.take()
                } else {
                    streams.try_take()?
                }),
                sender: Sender::H2(s.clone(), streams.clone()),
                count: self.count.clone(),
                key: self.key.clone(),
                used: self.used,
                reused: self.reused,
                race_window: self.race_window,
            }),
            Sender::H1(_) => None,
        }
    }
}

/// The connections of one upstream.
pub(super) struct Conns {
    /// Boxed, once, when opened: a connection (about 130 bytes) is carried in its answer's
    /// body, which moves through the request's layers, a copy of its full size each time. An
    /// HTTP/2 connection's per-request handle is boxed as it is made.
    #[expect(
        clippy::vec_box,
        reason = "a connection is handed out and back as its box"
    )]
    list: Mutex<Vec<Box<Conn>>>,
    idle_timeout: Duration,
    cap: usize,
    /// A sweep task is running.
    sweeping: AtomicBool,
}

impl Conns {
    pub(super) fn new(idle_timeout: Duration, cap: usize) -> Arc<Conns> {
        Arc::new(Conns {
            list: Mutex::new(Vec::new()),
            idle_timeout,
            cap,
            sweeping: AtomicBool::new(false),
        })
    }

    #[expect(clippy::vec_box, reason = "the list of `Conns::list`")]
    fn lock(&self) -> MutexGuard<'_, Vec<Box<Conn>>> {
        self.list.lock()
    }

    /// An idle connection to `key`, the most recently used first; closed and expired ones met
    /// on the way are dropped. `now`: the caller's reading of the clock, taken an instant
    /// before (a clock read is 30–45 ns on a VM, and the request path had a dozen).
    pub(super) fn checkout(&self, key: &Key, now: Instant) -> Option<Box<Conn>> {
        let mut list = self.lock();
        let mut i = list.len();
        while i > 0 {
            i -= 1;
            let c = &mut list[i];
            if c.key != *key {
                continue;
            }
            let busy = c.sender.is_busy();
            if c.sender.is_closed() || (!busy && now.duration_since(c.used) >= self.idle_timeout) {
                list.remove(i);
                continue;
            }
            if let Sender::H2(..) = c.sender {
                // Shared while the provider allows another stream on it; else the next one,
                // or a new connection.
                let Some(mut shared) = c.shared_handle(false) else {
                    continue;
                };
                c.used = now;
                c.reused = true;
                shared.reused = true;
                shared.used = now;
                return Some(Box::new(shared));
            }
            c.used = now;
            c.reused = true;
            return Some(list.remove(i));
        }
        None
    }

    /// Puts an HTTP/1 connection back once its answer was read, or a new HTTP/2 one in.
    pub(super) fn put(self: &Arc<Self>, mut conn: Box<Conn>) {
        if self.idle_timeout.is_zero() {
            return;
        }
        conn.used = Instant::now();
        {
            let mut list = self.lock();
            if list.len() >= self.cap {
                return;
            }
            list.push(conn);
        }
        self.start_sweeping();
    }

    /// Starts the sweep task unless one is running.
    fn start_sweeping(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let every = (self.idle_timeout / 4).max(Duration::from_millis(250));
        tokio::spawn(sweep_while_listed(Arc::downgrade(self), every));
    }

    /// Drops closed and expired connections; marks busy ones as used now. Returns how many are
    /// left.
    fn sweep(&self, now: Instant) -> usize {
        let mut list = self.lock();
        list.retain_mut(|c| {
            if c.sender.is_closed() {
                return false;
            }
            if c.sender.is_busy() {
                c.used = now;
                return true;
            }
            now.duration_since(c.used) < self.idle_timeout
        });
        list.len()
    }

    /// How many connections are listed (idle, or reading an answer).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Sweeps `conns` every `every` while it has connections and exists.
async fn sweep_while_listed(conns: Weak<Conns>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(c) = conns.upgrade() else {
            return;
        };
        if c.sweep(Instant::now()) > 0 {
            continue;
        }
        c.sweeping.store(false, Ordering::Release);
        // A connection put in between the sweep and the store saw the task still running.
        if c.lock().is_empty() || c.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}
