//! legate's own HTTP/1.1 client connection: a request written, its response head read, and
//! (in [`body`]) its body read, all by the request's own task.
//!
//! hyper's client connection runs as a task of its own, and hands each request and answer
//! across channels to it; that dispatch was about 10,500 of the 28,000 instructions a bare
//! hyper proxy spends per request. legate's upstream use of HTTP/1 is narrow — one request at a
//! time on a connection, a body that is whole bytes, an answer read to its end or dropped — so
//! the connection is driven where the request is: the request's future writes it and reads the
//! head; the answer's body owns the connection while it is read and hands it back to its list
//! once it ended cleanly (see [`conns`](super::conns)). A body dropped early closes it.
//!
//! What this side of the wire has to get right, and where: the response head and its framing
//! (RFC 9112 §6.3) in [`head`], the chunked coding in [`chunked`]; every buffer has a bound
//! (the head at `max_head`, a chunk-size line and the trailers in `chunked`), so a hostile
//! provider can make a request fail but not make legate hold more.

pub(crate) mod body;
pub(crate) mod chunked;
pub(crate) mod head;
pub(crate) mod lines;

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::Request;
use http_body::Body as _;
use http_body_util::Full;
use tokio::io::AsyncWriteExt;

pub(crate) use head::Head;
use head::HeadError;

use super::dial::Counted;
use crate::verbatim::Verbatim;

/// A body up to this size goes out in the same write as the head.
const INLINE_BODY: usize = 16 << 10;
/// The read buffer grows by this much when less than [`MIN_READ`] is free.
const READ_SIZE: usize = 8 << 10;
const MIN_READ: usize = 1 << 10;

/// Why a request or its answer failed on a connection.
#[derive(Debug)]
pub enum H1Error {
    Io(io::Error),
    Head(HeadError),
    /// The body's bytes are not valid chunked coding.
    Chunked(&'static str),
    /// The provider closed the connection before the head, or the body, was complete.
    Closed,
}

impl std::fmt::Display for H1Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            H1Error::Io(e) => write!(f, "{e}"),
            H1Error::Head(e) => write!(f, "{e}"),
            H1Error::Chunked(why) => write!(f, "broken chunked body: {why}"),
            H1Error::Closed => f.write_str("the connection closed before the answer was complete"),
        }
    }
}

impl std::error::Error for H1Error {}

/// One HTTP/1.1 connection to a provider (after TLS, if any).
pub(crate) struct H1Conn {
    io: Counted,
    /// Bytes read and not yet taken: a head being parsed, or body bytes not yet handed out.
    buf: BytesMut,
    /// The request head (and a small body) is written from here; kept between requests.
    out: Vec<u8>,
    /// The largest response head accepted.
    max_head: usize,
}

impl H1Conn {
    pub(super) fn new(io: Counted, max_head: usize) -> Self {
        H1Conn {
            io,
            buf: BytesMut::new(),
            out: Vec::new(),
            max_head,
        }
    }

    /// Writes `req` (origin-form URI, `host` set) and the caller's `verbatim` lines it goes
    /// with, and reads its response head.
    pub(super) async fn send(
        &mut self,
        req: &Request<Full<Bytes>>,
        verbatim: Option<&Verbatim>,
    ) -> Result<Head, H1Error> {
        if let Err(e) = self.write(req, verbatim).await {
            // A provider may answer before it read the whole request (a 413, say) and close:
            // that answer, if it came, is the answer, and the connection is done.
            return match self.read_head(req.method()).await {
                Ok(mut head) => {
                    head.keep_alive = false;
                    Ok(head)
                }
                Err(_) => Err(H1Error::Io(e)),
            };
        }
        self.read_head(req.method()).await
    }

    async fn write(
        &mut self,
        req: &Request<Full<Bytes>>,
        verbatim: Option<&Verbatim>,
    ) -> io::Result<()> {
        let body = whole(req.body());
        self.out.clear();
        head::encode(req, verbatim, body.len(), &mut self.out);
        let inline = body.len() <= INLINE_BODY;
        if inline {
            self.out.extend_from_slice(&body);
        }
        self.io.write_all(&self.out).await?;
        if !inline {
            self.io.write_all(&body).await?;
        }
        self.io.flush().await?;
        if self.out.capacity() > 4 * INLINE_BODY {
            self.out = Vec::new();
        }
        Ok(())
    }

    async fn read_head(&mut self, method: &http::Method) -> Result<Head, H1Error> {
        loop {
            if !self.buf.is_empty() {
                let parsed = head::parse(&mut self.buf, method, self.max_head);
                if let Some(head) = parsed.map_err(H1Error::Head)? {
                    return Ok(head);
                }
            }
            if poll_fn(|cx| self.poll_fill(cx))
                .await
                .map_err(H1Error::Io)?
                == 0
            {
                return Err(H1Error::Closed);
            }
        }
    }

    /// Whether an idle connection can no longer carry a request: the provider closed it, or
    /// sent something nobody asked for (a `408` before closing, say), which must not be read as
    /// the next request's answer. The socket's readiness, as the runtime last saw it, is asked
    /// first, so a quiet connection costs no system call; only one that became readable is
    /// read (a TLS record with no data in it, such as a session ticket, leaves it usable).
    pub(super) fn idle_unusable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        if !self.buf.is_empty() {
            return true;
        }
        match self.io.tcp().poll_read_ready(&mut cx) {
            Poll::Pending => return false,
            Poll::Ready(Err(_)) => return true,
            Poll::Ready(Ok(())) => {}
        }
        !matches!(self.poll_fill(&mut cx), Poll::Pending)
    }

    /// Reads more into the buffer; `Ok(0)` at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < MIN_READ {
            self.buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }
}

/// The bytes of a whole body (a `Full` yields them at its first poll, without waiting).
fn whole(body: &Full<Bytes>) -> Bytes {
    let mut body = body.clone();
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

#[cfg(test)]
mod tests;
