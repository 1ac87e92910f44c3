//! Accept loops: one per listener, HTTP/1.1 (legate's own connection) and HTTP/2 (hyper's),
//! every connection watched for graceful shutdown. Stopping the loop drops the listener, so new connections are
//! refused at once while the watched ones finish.
//!
//! Each plane has its own cap on open connections (SPEC §14). At the cap, one more peer is
//! accepted and the plane's longest-idle connection is closed for it ([`super::roster`]); while
//! every connection is busy that peer waits for a slot, and the rest wait in the kernel's
//! backlog instead of using up descriptors the other plane (and the upstream connections)
//! need. Every connection is held to the deadlines of [`super::conn`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;

use super::caller::{CallerBody, Rewind};
use super::conn::{ConnLimits, ConnWatch, EVICTABLE_AFTER, Guarded, WatchedIo, watched};
use super::h1;
use super::roster::Roster;
use super::stall::StallWatched;
use super::workers::Workers;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most an HTTP/1 connection's read buffer holds, on both sides: a request or response
/// head, and what a caller sends ahead of its next request. (hyper's default was about
/// 400 KiB, and a buffer grown for one long prompt stayed that large for the connection's
/// life: a hundred agents would hold 40 MiB of empty buffers.) 64 KiB reads still move a
/// large body in few system calls.
pub const HTTP1_MAX_BUF: usize = 64 << 10;

/// How one plane holds its connections: the deadlines (read at each accept, so a reload
/// applies to new connections), the cap, the gauge of open connections, and the workers that
/// run them (`None`: the accepting runtime).
pub struct Plane<L> {
    pub limits: L,
    pub max_connections: usize,
    pub gauge: prometheus::IntGauge,
    pub workers: Option<Arc<Workers>>,
    /// Told of each HTTP/1 request head refused before a handler could see it (the data
    /// plane records it as a request); `None`: refused without a record (the admin plane).
    pub on_refused: Option<OnRefused>,
    /// Whether a connection's end counts for the idle trim ([`connections_ended`]): the data
    /// plane's, whose connections hold callers' answers; not the admin plane's, where every
    /// kubelet probe opens and ends one and would wake the trim each few seconds for nothing.
    pub counts_ends: bool,
}

/// A request head an HTTP/1 connection refused (400 malformed or badly framed, 431, 501, 505),
/// answered and closed before any handler saw it.
pub struct RefusedHead {
    /// The API whose error shape the answer takes.
    pub api: crate::api::ApiKind,
    pub error: crate::error::ProxyError,
    /// From the head's first line, as far as it gives them (`-` otherwise).
    pub method: http::Method,
    pub path: String,
}

/// Records a refused head; returns the request id its answer carries.
pub type OnRefused = Arc<dyn Fn(&RefusedHead) -> Option<String> + Send + Sync>;

/// Serves `listener` with `handler` until `stop` fires; then waits for open connections to
/// finish, up to `grace`, calling `on_grace_expired` if they have not (so open streams can be
/// ended with an error event), and giving them a short final moment to flush it.
///
/// HTTP/1 is legate's own connection ([`super::h1`]); a connection that opens with the HTTP/2
/// preface is handed to hyper's HTTP/2 server. Both stop taking requests when `stop` fires:
/// an idle HTTP/1 connection closes at once, a busy one after its answer, and HTTP/2 sends
/// GOAWAY and finishes its open streams.
pub async fn serve<H, F, B, L>(
    listener: TcpListener,
    handler: Arc<H>,
    plane: Plane<L>,
    stop: CancellationToken,
    grace: impl FnOnce() -> Duration,
    on_grace_expired: impl FnOnce(),
) where
    H: Fn(http::Request<CallerBody>, std::net::SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Result<http::Response<B>, std::convert::Infallible>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
    L: Fn() -> ConnLimits,
{
    // The connection watch bounds the preface and every request's head; hyper's HTTP/2
    // settings are its defaults but for the send buffer per stream, set to the size the watch
    // counts a stream cut for want of credit as holding (hyper's default too).
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.max_send_buf_size(super::conn::H2_SEND_BUF);
    let h2 = Arc::new(h2);
    let slots = Arc::new(Semaphore::new(plane.max_connections));
    let roster = Arc::new(Roster::new(plane.max_connections));
    loop {
        // A free slot, if there is one; a full plane makes room once a peer is waiting.
        let free = match slots.clone().try_acquire_owned() {
            Ok(s) => Some(s),
            Err(TryAcquireError::NoPermits) => None,
            Err(TryAcquireError::Closed) => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // Typically EMFILE: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let slot = match free {
                    Some(s) => s,
                    // One accepted peer at most waits on its descriptor beyond the cap; the
                    // others wait in the backlog.
                    None => match make_room(&slots, &roster, &stop).await {
                        Some(s) => s,
                        None => break,
                    },
                };
                let _ = stream.set_nodelay(true);
                bound_unsent(&stream);
                let limits = (plane.limits)();
                let h = handler.clone();
                let h2 = h2.clone();
                let stop = stop.clone();
                let open = Open::new(&plane.gauge, plane.counts_ends);
                let roster = roster.clone();
                let on_refused = plane.on_refused.clone();
                // Built where it runs: the socket's readiness then comes from that worker's own
                // I/O driver, not from this thread's (which would wake the worker per read).
                let serve_one = move |stream: TcpStream| async move {
                    let watch = ConnWatch::new(limits);
                    roster.enlist(&watch);
                    let mut io = WatchedIo::new(stream, watch.clone());
                    let conn = async {
                        let mut first = BytesMut::new();
                        match h1::start(&mut io, &mut first, &stop).await {
                            h1::Start::Gone => Ok(()),
                            h1::Start::H1 => {
                                let refused = on_refused.as_ref();
                                h1::serve(io, first, (&*h, refused), peer, &watch, &stop, HTTP1_MAX_BUF)
                                    .await
                                    .map_err(BoxError::from)
                            }
                            h1::Start::H2 => {
                                let io = Rewind::new(first.freeze(), io);
                                serve_h2(&h2, io, h, peer, &watch, &stop).await
                            }
                        }
                    };
                    match watched(&watch, conn).await {
                        Some(Ok(())) => {}
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        // Dropping the connection closes it: nothing is in flight on it.
                        None => {
                            tracing::debug!(peer = %peer, "connection closed: no request within its deadline");
                        }
                    }
                    drop(open);
                    drop(slot);
                };
                match &plane.workers {
                    Some(w) => w.spawn_conn(stream, serve_one),
                    None => drop(tokio::spawn(serve_one(stream))),
                }
            }
            _ = stop.cancelled() => break,
        }
    }
    drop(listener);
    // Every open connection holds a slot: all of them free means all connections are done.
    let all = u32::try_from(plane.max_connections).unwrap_or(u32::MAX);
    let all_done = slots.acquire_many(all);
    tokio::pin!(all_done);
    tokio::select! {
        _ = &mut all_done => {}
        _ = tokio::time::sleep(grace()) => {
            on_grace_expired();
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut all_done).await;
        }
    }
}

/// A slot for a peer accepted while the plane was full: the longest-idle connection is closed
/// for it ([`Roster`]). While every connection has a request in flight (or waited less than
/// [`EVICTABLE_AFTER`]), the peer waits for one to end, and the plane looks again every
/// `EVICTABLE_AFTER` for one that may be closed. `None` when stopping.
async fn make_room(
    slots: &Arc<Semaphore>,
    roster: &Roster,
    stop: &CancellationToken,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    loop {
        // A slot may have come free since the accept began.
        if let Ok(s) = slots.clone().try_acquire_owned() {
            return Some(s);
        }
        if roster.evict_longest_idle() {
            tracing::debug!(
                "connection cap reached: the longest-idle connection is closed for a new one"
            );
        }
        tokio::select! {
            s = slots.clone().acquire_owned() => return s.ok(),
            _ = tokio::time::sleep(EVICTABLE_AFTER) => {}
            _ = stop.cancelled() => return None,
        }
    }
}

/// Serves an HTTP/2 connection with hyper's server until it ends; `stop` sends GOAWAY and
/// lets the open streams finish.
async fn serve_h2<H, F, B, T>(
    builder: &http2::Builder<TokioExecutor>,
    io: T,
    handler: Arc<H>,
    peer: std::net::SocketAddr,
    watch: &Arc<ConnWatch>,
    stop: &CancellationToken,
) -> Result<(), BoxError>
where
    H: Fn(http::Request<CallerBody>, std::net::SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Result<http::Response<B>, std::convert::Infallible>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let w = watch.clone();
    let svc = service_fn(move |req: http::Request<Incoming>| {
        let inflight = w.begin();
        let conn = w.clone();
        // hyper keeps one slot of this future's size per stream: the handlers box their
        // request's state themselves, so it stays small.
        let head = req.method() == http::Method::HEAD;
        let fut = handler(req.map(CallerBody::Right), peer);
        async move {
            let mut resp = fut.await?;
            // A stream the caller gives no credit is held to the idle timeout too. The request
            // counts in flight inside the watch, so that a stream cut there no longer does:
            // hyper keeps the cut stream's shell until credit comes, which may be never, and
            // the connection must then fall under its idle deadline like any other.
            if head {
                // A HEAD answer declares the length the GET's body would have.
                if let Some(n) = resp.body().size_hint().exact() {
                    resp.headers_mut()
                        .entry(http::header::CONTENT_LENGTH)
                        .or_insert_with(|| http::HeaderValue::from(n));
                }
                return Ok(resp.map(|b| StallWatched::new(Guarded::bodiless(b, inflight), conn)));
            }
            Ok::<_, std::convert::Infallible>(
                resp.map(|b| StallWatched::new(Guarded::new(b, inflight), conn)),
            )
        }
    });
    watch.speaks_frames();
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r.map_err(Into::into),
        // Stopping, or idle past the connection's deadline: GOAWAY, then the streams taken
        // are finished.
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await.map_err(Into::into)
        }
        () = watch.goaway_due() => {
            conn.as_mut().graceful_shutdown();
            conn.await.map_err(Into::into)
        }
    }
}

/// Counts a connection in its plane's gauge until it is dropped, served or not.
struct Open(prometheus::IntGauge, bool);

/// Data-plane connections ended since start: a connection's end frees what it held (a stalled
/// reader's cut streams, buffers), which the idle trim must hear of as it hears of requests
/// (`release`).
static ENDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many connections have ended since start.
pub fn connections_ended() -> u64 {
    ENDED.load(std::sync::atomic::Ordering::Relaxed)
}

impl Open {
    fn new(gauge: &prometheus::IntGauge, counts_end: bool) -> Open {
        gauge.inc();
        Open(gauge.clone(), counts_end)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
        if self.1 {
            ENDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Descriptors kept free beside the two planes: listeners, log and key files, DNS, Redis.
const RESERVED_DESCRIPTORS: u64 = 32;

/// The data plane's connection cap, lowered when the process may not open that many
/// descriptors: each data connection may need an upstream connection too, and the admin plane
/// keeps its own share, so `/healthz` still answers when the data plane is full.
pub fn data_cap(max_connections: usize, admin_max_connections: usize) -> usize {
    let Some(limit) = open_files_limit() else {
        return max_connections;
    };
    let spare = limit.saturating_sub(admin_max_connections as u64 + RESERVED_DESCRIPTORS);
    let fits = usize::try_from(spare / 2).unwrap_or(usize::MAX).max(1);
    if fits < max_connections {
        tracing::warn!(
            max_connections,
            open_files_limit = limit,
            effective = fits,
            "server.max_connections is more than the descriptor limit allows; using the lower cap"
        );
        return fits;
    }
    max_connections
}

/// The soft RLIMIT_NOFILE, read from procfs (Linux) so that no unsafe call is needed.
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The unsent bytes a caller's socket takes before a write waits: past it, the kernel holds
/// the writer until the caller's reads let some of them go.
const NOTSENT_LOWAT: u32 = 128 << 10;

/// Bounds the bytes a caller's socket holds unsent (`TCP_NOTSENT_LOWAT`), so that a caller
/// reading slowly is seen to read. Without it a full send buffer (megabytes on loopback, where
/// the kernel grows it) wakes a waiting writer only once a third of it or more has drained: a
/// reader at tens of KB/s made no write move within `connection_idle_timeout`, and was cut as
/// one that had stopped reading ([`super::conn`]). With it, each time the caller's reads open
/// its window the kernel sends, the unsent bytes fall below the mark and the write moves. It
/// also keeps what a connection parks in the kernel to the caller's window and this mark,
/// instead of the send buffer's megabytes. Answers under the mark are written as before.
fn bound_unsent(stream: &TcpStream) {
    #[cfg(target_os = "linux")]
    {
        let _ = socket2::SockRef::from(stream).set_tcp_notsent_lowat(NOTSENT_LOWAT);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = stream;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plane full of connections that all waited less than `EVICTABLE_AFTER` (a peer opening
    /// idle connections faster than they age): a new peer gets its slot once the oldest may be
    /// closed, not a second later.
    #[tokio::test(start_paused = true)]
    async fn a_peer_waiting_on_young_connections_gets_a_slot_once_the_oldest_may_go() {
        let slots = Arc::new(Semaphore::new(1));
        let held = slots.clone().try_acquire_owned().unwrap();
        let roster = Roster::new(1);
        let young = ConnWatch::new(ConnLimits {
            header_read_timeout: Duration::from_secs(10),
            connection_idle_timeout: Duration::from_secs(120),
            body_read_timeout: Duration::from_secs(60),
        });
        roster.enlist(&young);
        let stop = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let room = async {
            let slot = make_room(&slots, &roster, &stop).await;
            (slot, start.elapsed())
        };
        // The closed connection's slot comes free when its task ends: here, once it has been
        // chosen (past the floor, a connection that may not be chosen was chosen already).
        let release = async {
            while start.elapsed() < EVICTABLE_AFTER
                || young.idleness(tokio::time::Instant::now()).is_some()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(held);
        };
        let ((slot, waited), ()) = tokio::join!(room, release);
        assert!(slot.is_some());
        // Under a kubelet probe's 1 s timeout with room to spare (it was 1 s and more).
        assert!(waited <= Duration::from_millis(250), "{waited:?}");
    }

    #[test]
    fn a_connections_end_is_counted_for_the_idle_trim() {
        let gauge = prometheus::IntGauge::new("test_open", "open").unwrap();
        let before = connections_ended();
        let open = Open::new(&gauge, true);
        assert_eq!(gauge.get(), 1);
        drop(open);
        assert_eq!(gauge.get(), 0);
        // Other tests' connections may end meanwhile: at least this one is counted.
        assert!(connections_ended() > before);
        // An admin connection's end is not (asserted on the gauge: the count is shared).
        let admin = Open::new(&gauge, false);
        assert!(!admin.1);
    }
}
