//! The HTTP client of one upstream: its connections (see [`conns`](super::conns)), how a
//! request is put on one, and the one retry that lives below the attempt loop (SPEC §6): a
//! request that fails on a *reused* connection before any byte of its response arrived is sent
//! once more, at once, on a fresh connection, and is not an attempt.
//!
//! That failure is the keep-alive race: the provider closed (or reset) an idle connection just
//! as legate wrote a request on it. A server closing an idle connection does not run what
//! arrives on it, so sending the request again does not run it twice; any byte of an answer
//! means the provider took it, and then it is never sent again here. Nor is a request whose
//! connection failed longer after it was sent than the connection's race window: the race's
//! close reaches legate within a round trip of the write (a close that came before it is seen
//! when the connection is taken from the pool, and the connection is not used), so the window
//! is [`RACE_WINDOW`], or one and a half times the time the connection took to open (at least
//! one round trip) for a provider that far away, at most [`MAX_RACE_WINDOW`]; while a provider that
//! held the request longer may have been running it (a worker that died mid-generation, an
//! intermediary's timeout) — sent again unseen, it would run twice for one attempt. Such a
//! failure is an ordinary attempt: counted, and retried or not by the attempt loop. The
//! request is written from a borrow, so it is still at hand to send again.
//!
//! Only HTTP/1 connections qualify for the first case. On an HTTP/2 connection requests share
//! the bytes, so "no response byte" cannot be told per request; only a request the provider
//! says it did not process (its stream refused, or past the last one its GOAWAY names: RFC 9113
//! §8.7) and one hyper hands back unwritten (the connection closed, or said GOAWAY, before it
//! was written) are sent again, once, and other failures stay ordinary attempts.
//!
//! The pool is legate's own rather than hyper-util's pooled client: that one races every
//! request that finds no idle connection against a new connection and keeps whichever comes
//! second too, so under bursts it grew to hundreds of mostly idle connections (tens of KiB of
//! buffers each), and it hashes its pool key and formats the `host` header on every request.
//! tower's layers do not fit below a single request either: the retry here depends on the
//! connection the request went out on, which only this layer knows.

use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use std::sync::Arc;

use super::body::ResponseBody;
use super::conns::{Conn, Conns, Key, Sender};
use super::dial::{Connector, SendError, dial};
use super::h1::body::H1Body;

/// The longest a reused connection may take to fail, from the request's sending, for the
/// failure to be taken for the keep-alive race (see the module doc): a round trip to a
/// provider across a continent, with room. A connection that took longer to open gets more.
const RACE_WINDOW: Duration = Duration::from_millis(250);

/// The most any connection's race window grows to: its opening's time includes the name
/// lookup, and a slow resolver is not a far provider.
const MAX_RACE_WINDOW: Duration = Duration::from_secs(1);

/// The race window of a connection that took `opening` to open (TCP, TLS, HTTP/2 handshake:
/// at least one round trip to the provider).
fn race_window(opening: Duration) -> Duration {
    (opening * 3 / 2).clamp(RACE_WINDOW, MAX_RACE_WINDOW)
}

/// How an upstream's connections are kept.
pub struct PoolOptions {
    /// An idle connection is closed after this long.
    pub idle_timeout: Duration,
    /// At most this many connections are kept per list.
    pub max_conns: usize,
    /// One list of connections per data-plane worker (see [`crate::server::workers`]).
    pub lists: usize,
    /// The largest HTTP/1 read buffer of a connection (and so response head; an HTTP/2
    /// head's list of headers is held to about the same).
    pub max_buf: usize,
    /// TCP connect and TLS handshake together.
    pub connect_timeout: Duration,
}

/// The client requests to one upstream go through.
pub struct PooledClient {
    connector: Connector,
    /// Per worker: a connection's task runs on the worker that opened it, so a request takes
    /// only connections its own worker drives, and hands over to them without waking a thread.
    conns: Box<[Arc<Conns>]>,
    max_buf: usize,
    connect_timeout: Duration,
    /// The `host` header of requests to the base URL's scheme and authority, rendered once.
    host: Option<(Key, HeaderValue)>,
}

impl PooledClient {
    /// The client of the provider at `base` (its `host` header rendered once).
    pub fn new(connector: Connector, base: Option<&Uri>, opts: PoolOptions) -> Self {
        let host = base.and_then(|uri| Some((Key::of(uri)?, host_value(uri)?)));
        PooledClient {
            connector,
            conns: (0..opts.lists.max(1))
                .map(|_| Conns::new(opts.idle_timeout, opts.max_conns.max(1)))
                .collect(),
            max_buf: opts.max_buf,
            connect_timeout: opts.connect_timeout,
            host,
        }
    }

    /// [`request_on`](Self::request_on) for a caller that never retires the connection.
    #[cfg(test)]
    pub async fn request(
        &self,
        req: Request<Full<Bytes>>,
        sent: Instant,
    ) -> Result<Response<ResponseBody>, SendError> {
        self.request_on(req, None, sent, &Sent::default()).await
    }

    /// Sends `req` (an absolute URI; `sent`, the moment the caller counts it sent from) on an
    /// idle connection, or a new one; on a reused connection that failed before any response
    /// byte, within the connection's race window from `sent`, sends it once more on a fresh one.
    /// `on` is told the HTTP/2 connection it goes out on. `verbatim`, the caller's lines `req`
    /// was built to go with, are written before its map's on HTTP/1, and added to its map on
    /// HTTP/2.
    pub async fn request_on(
        &self,
        mut req: Request<Full<Bytes>>,
        mut verbatim: Option<&crate::verbatim::Verbatim>,
        sent: Instant,
        on: &Sent,
    ) -> Result<Response<ResponseBody>, SendError> {
        let key = Key::of(req.uri()).ok_or(SendError::NotAbsolute)?;
        let uri = req.uri().clone();
        let mut conn = match self.conns().checkout(&key, sent.into_std()) {
            Some(c) => c,
            None => Box::pin(self.open(&key, &uri)).await?,
        };
        let mut resent = false;
        loop {
            let h1 = match &mut conn.sender {
                Sender::H1(h1) => h1,
                Sender::H2(s, streams) => {
                    on.on(streams);
                    // Once in the map, they go with it (and with a copy sent again, or a
                    // request handed back to go on a fresh connection, of either kind).
                    if let Some(lines) = verbatim.take() {
                        lines.append_to(req.headers_mut());
                    }
                    // Kept to send again if the provider leaves the stream unprocessed.
                    let copy = (!resent).then(|| copy_of(&req));
                    let mut err = match s.try_send_request(req).await {
                        // The stream stays counted until the answer's body is done with.
                        Ok(resp) => {
                            let slot = conn.slot.take();
                            return Ok(resp.map(|b| ResponseBody::H2(b, slot)));
                        }
                        Err(err) => err,
                    };
                    // Refused, or past the last stream a GOAWAY kept: the provider did not
                    // process it (RFC 9113 §8.7, §6.8), so it is sent once more, on another
                    // connection, and is not an attempt.
                    if let Some((copy, why)) = copy.zip(unprocessed(err.error())) {
                        tracing::debug!(
                            error = %err.error(),
                            "the provider left an HTTP/2 stream unprocessed; sending it once more"
                        );
                        resent = true;
                        req = copy;
                        on.clear();
                        // A refusal is this connection's; after a GOAWAY another listed one
                        // may have room (the one going away takes no new stream).
                        let listed = match why {
                            Unprocessed::Refused => None,
                            Unprocessed::GoneAway => {
                                self.conns().checkout(&key, std::time::Instant::now())
                            }
                        };
                        conn = match listed {
                            Some(c) => c,
                            None => Box::pin(self.open(&key, &uri)).await?,
                        };
                        continue;
                    }
                    // Handed back unwritten: the connection closed under a request put on it
                    // as it was reused, or said GOAWAY before hyper wrote a fresh one's.
                    let gone_away = streams.going_away() && !resent;
                    let Some(unsent) = err.take_message().filter(|_| conn.reused || gone_away)
                    else {
                        return Err(SendError::Http(err.into_error()));
                    };
                    resent |= gone_away;
                    on.clear();
                    tracing::debug!(
                        error = %err.error(),
                        "an upstream connection closed, or said GOAWAY, before the request was written; sending it on a fresh one"
                    );
                    req = unsent;
                    *req.uri_mut() = uri.clone();
                    conn = Box::pin(self.open(&key, &uri)).await?;
                    continue;
                }
            };
            self.to_http1(&mut req, &key);
            let err = match h1.send(&req, verbatim).await {
                Ok(head) => {
                    // Written and answered: its map is kept for the next request's.
                    crate::header_maps::give(std::mem::take(req.headers_mut()));
                    let home = self.conns().clone();
                    let (parts, framing, keep_alive) = (head.parts, head.framing, head.keep_alive);
                    let body = H1Body::new(conn, framing, keep_alive, home);
                    return Ok(Response::from_parts(parts, ResponseBody::H1(body)));
                }
                Err(e) => e,
            };
            // The clock is read only on this path, which a request rarely takes.
            let raced = conn.reused
                && conn.count.silent_since_request()
                && sent.elapsed() <= conn.race_window;
            if !raced {
                return Err(SendError::H1(err));
            }
            tracing::debug!(
                error = %err,
                "a reused upstream connection failed before answering; sending once more on a fresh one"
            );
            *req.uri_mut() = uri.clone();
            // The request went out on the reused connection: if no fresh one can be had, the
            // failure is that one's, after sending (not "could not connect", which would say
            // the provider never got it).
            conn = match Box::pin(self.open(&key, &uri)).await {
                Ok(fresh) => fresh,
                Err(_) => return Err(SendError::H1(err)),
            };
        }
    }

    /// A new connection to `uri`; an HTTP/2 one is listed at once, to be shared. Callers box
    /// it: dialing (TCP, TLS, handshake) is a large future that most requests never run, and
    /// inline it would be carried, and copied, with every request's.
    async fn open(&self, key: &Key, uri: &Uri) -> Result<Box<Conn>, SendError> {
        let began = Instant::now();
        let (sender, count) =
            dial(&self.connector, uri, self.max_buf, self.connect_timeout).await?;
        let conn = Box::new(Conn::new(
            sender,
            count,
            key.clone(),
            race_window(began.elapsed()),
        ));
        Ok(match conn.shared_handle(true) {
            Some(handle) => {
                self.conns().put(conn);
                Box::new(handle)
            }
            None => conn,
        })
    }

    /// What an HTTP/1 request carries that an absolute URI implies: a `host` header (unless
    /// the caller set one; the host, with the port unless it is the scheme's default) and the
    /// origin-form target (path and query).
    fn to_http1<B>(&self, req: &mut Request<B>, key: &Key) {
        if !req.headers().contains_key(http::header::HOST) {
            let value = match &self.host {
                Some((k, v)) if k == key => Some(v.clone()),
                _ => host_value(req.uri()),
            };
            if let Some(v) = value {
                req.headers_mut().insert(http::header::HOST, v);
            }
        }
        let origin = match req.uri().path_and_query() {
            Some(p) if p.as_str() != "/" => Uri::from(p.clone()),
            _ => Uri::default(),
        };
        *req.uri_mut() = origin;
    }

    /// The calling worker's connections (the first list's on a thread that is no worker).
    fn conns(&self) -> &Arc<Conns> {
        let i = crate::server::workers::current();
        self.conns.get(i).unwrap_or(&self.conns[0])
    }

    /// How many connections are listed, for tests.
    #[cfg(test)]
    pub(super) fn listed(&self) -> usize {
        self.conns.iter().map(|c| c.len()).sum()
    }
}

#[cfg(test)]
mod tests;

/// A copy of an HTTP/2 request to send again (the body's bytes are shared, not copied).
fn copy_of(req: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let mut copy = Request::new(req.body().clone());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    copy
}

/// The HTTP/2 connection a request went out on, held by its caller, which retires it
/// ([`Sent::retire`]) when the request got no answer in time: no new request goes on it, its
/// other streams go on, and it is let go once they are done. A connection that never answers
/// (a stalled upload holding its flow-control window, a peer gone without a FIN) would
/// otherwise take every retry and every later request, each timing out in turn, for as long as
/// requests kept it from idling out. An HTTP/1 connection whose request is dropped is closed
/// with it.
#[derive(Default)]
pub struct Sent(parking_lot::Mutex<Option<Arc<super::streams::Streams>>>);

impl Sent {
    fn on(&self, streams: &Arc<super::streams::Streams>) {
        *self.0.lock() = Some(streams.clone());
    }

    /// The request left the connection it was on (it is sent again elsewhere).
    fn clear(&self) {
        *self.0.lock() = None;
    }

    /// No new request goes on the connection (the request got no answer within the
    /// provider's `first_byte_timeout`).
    pub fn retire(&self) {
        if let Some(streams) = self.0.lock().as_ref() {
            streams.retire();
        }
    }
}

/// How the provider said it did not process a stream.
#[derive(Clone, Copy)]
enum Unprocessed {
    /// RST_STREAM(REFUSED_STREAM).
    Refused,
    /// A GOAWAY naming a last stream below this one.
    GoneAway,
}

/// Whether hyper's error says the provider did not process the stream: its
/// RST_STREAM(REFUSED_STREAM), or its GOAWAY naming a last stream below this one. h2 hands a
/// GOAWAY's error to exactly those streams, and to streams opened after it; a stream the GOAWAY
/// kept that then ends with the connection gets a broken pipe, an ordinary failure, as the
/// provider may have run it. Providers' front ends send GOAWAY routinely, to retire a
/// connection after so many streams or so long.
///
/// That holds as long as hyper's connection task and the request's task run on one thread (a
/// worker's current-thread runtime, as every data-plane client here does): on a multi-thread
/// runtime a GOAWAY read between hyper opening a stream and its next readiness check could
/// fail a stream the GOAWAY kept with the GOAWAY's error.
fn unprocessed(err: &hyper::Error) -> Option<Unprocessed> {
    let e = std::error::Error::source(err)?.downcast_ref::<h2::Error>()?;
    if !e.is_remote() {
        None
    } else if e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM) {
        Some(Unprocessed::Refused)
    } else if e.is_go_away() {
        Some(Unprocessed::GoneAway)
    } else {
        None
    }
}

/// The `host` header for `uri`: the host, with the port unless it is the scheme's default.
fn host_value(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let secure = matches!(uri.scheme_str(), Some("https" | "wss"));
    let value = match uri.port() {
        Some(p) if !matches!((p.as_u16(), secure), (443, true) | (80, false)) => {
            format!("{host}:{}", p.as_str())
        }
        _ => host.to_string(),
    };
    HeaderValue::from_str(&value).ok()
}
