//! legate's own HTTP/1.1 server connection: a caller's requests read, handed to the handler
//! and answered, one at a time, all in the connection's task.
//!
//! hyper's server connection hands each request body to the handler through a channel whose
//! every read wakes the connection's task, keeps a service future and a dispatcher between
//! them, and takes a fresh read buffer per request. legate's callers send one request at a
//! time, its body nearly always whole with its head, and read the answer as it comes, so the
//! connection can be plain: read a head ([`request`]), hand the handler the body as a view of
//! the read buffer ([`body`]), poll the handler, write the head ([`response`]) and the body's
//! frames as they come, and begin again. While the handler works and while the answer
//! streams, the socket is watched for the caller leaving: its end of the stream cancels the
//! request at once (SPEC §8).
//!
//! Every buffer has a bound: the head at `max_buf` (431 beyond it), the bytes read ahead of
//! the next request at `max_buf`, a chunk-size line and the trailers in the chunked decoder,
//! and the bytes written ahead at [`FLUSH_AT`]; a caller that sends the body slowly is held to
//! `body_read_timeout` by the handler, and one that sends nothing, or stops taking its answer,
//! to the connection's own deadlines by [`super::conn`].
//!
//! A request answered before its body was read (a refusal: a bad key, an unknown route, a body
//! over the limit) leaves the rest of that body on its way. Closing then would reset the
//! connection under a client still writing it, which most clients (Node's `fetch` among them)
//! report as a failed connection without reading the answer, and retry. So the connection
//! reads the rest after the answer and throws it away, as HTTP/2 does for a stream
//! (`proxy::buffers::discard`): up to [`REFUSED_BODY_MAX`](super::REFUSED_BODY_MAX) bytes on
//! the wire (a chunked rest's size lines and extensions count) and within `body_read_timeout`,
//! a shutdown meanwhile included, and then carries the next request. A rest larger than that,
//! a body never asked for (`Expect: 100-continue` unanswered), or a handler that says
//! `connection: close` ends the connection instead.

pub(crate) mod body;
mod request;
mod response;

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::CallerBody;
use super::conn::ConnWatch;
use super::listener::{BoxError, OnRefused, RefusedHead};
use crate::upstream::h1::chunked::{Decoder, Step};
use body::{Pipe, RequestBody, Want};
use request::{Framing, Refusal};
use response::Out;

/// Written bytes are sent once this many are queued, or when the body has nothing ready.
const FLUSH_AT: usize = 64 << 10;
/// A body chunk larger than this is written from where it is instead of copied to the queue.
const COPY_MAX: usize = 16 << 10;
/// The read buffer grows by this much when less than [`MIN_READ`] is free.
const READ_SIZE: usize = 8 << 10;
const MIN_READ: usize = 1 << 10;
/// Room made in the read buffer for a body still on its way.
const BODY_READ: usize = 64 << 10;
/// The most of each buffer an idle connection keeps.
const KEEP: usize = 16 << 10;
/// After answering a request whose body was not read, the connection reads and drops what the
/// caller still sends, up to this much and this long, before closing: a close with unread
/// bytes is a reset, which can destroy the answer before the caller reads it.
const LINGER_BYTES: usize = 1 << 20;
const LINGER: Duration = Duration::from_secs(1);

/// The HTTP/2 connection preface (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The bytes a connection starts with: an HTTP/2 preface, or not.
pub(super) enum Start {
    H1,
    H2,
    /// Closed, or failed, before telling.
    Gone,
}

/// Reads until the first bytes tell an HTTP/2 preface from an HTTP/1 request; a connection
/// that has sent nothing when `stop` fires is done.
pub(super) async fn start<T: AsyncRead + Unpin>(
    io: &mut T,
    buf: &mut BytesMut,
    stop: &CancellationToken,
) -> Start {
    loop {
        let n = buf.len().min(PREFACE.len());
        if buf[..n] != PREFACE[..n] {
            return Start::H1;
        }
        if n == PREFACE.len() {
            return Start::H2;
        }
        buf.reserve(READ_SIZE);
        let read = tokio::select! {
            biased;
            read = io.read_buf(buf) => read,
            _ = stop.cancelled(), if buf.is_empty() => return Start::Gone,
        };
        match read {
            Ok(0) | Err(_) => return Start::Gone,
            Ok(_) => {}
        }
    }
}

/// Serves HTTP/1 requests on `io` (whose first bytes are in `buf`) with `handler` until the
/// caller closes, a request asks to, or `stop` fires between requests. A head refused before
/// the handler could see it is told to `on_refused`, when there is one.
pub(super) async fn serve<T, H, F, B>(
    io: T,
    buf: BytesMut,
    (handler, on_refused): (&H, Option<&OnRefused>),
    peer: SocketAddr,
    watch: &Arc<ConnWatch>,
    stop: &CancellationToken,
    max_buf: usize,
) -> io::Result<()>
where
    T: AsyncRead + AsyncWrite + Unpin,
    H: Fn(Request<CallerBody>, SocketAddr) -> F,
    F: Future<Output = Result<Response<B>, Infallible>>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut conn = Conn {
        io,
        buf,
        out: Vec::new(),
        big: Bytes::new(),
        after_big: b"",
        max_buf,
        head_seen: 0,
        blank_only: false,
    };
    let mut stopped = pin!(stop.cancelled());
    loop {
        let head = poll_fn(|cx| {
            let head = conn.poll_head(cx, stopped.as_mut());
            if std::mem::take(&mut conn.blank_only) && conn.buf.is_empty() {
                watch.head_withdrawn();
            }
            head
        });
        let head = match head.await {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(()),
            Err(refused) => {
                // In the caller's API shape, as every refusal (SPEC §5), though no route is
                // known yet: the shape is read off what there is of the head. Recorded as a
                // request, when the plane records them, under a request id of its own.
                let seen = RefusedHead {
                    api: refused.api,
                    error: refused.why.error(),
                    method: refused.method,
                    path: refused.path,
                };
                let rid = on_refused.and_then(|record| record(&seen));
                let rid = rid.as_deref();
                let body = seen.error.render(seen.api, rid.unwrap_or("")).into_body();
                response::refusal(seen.error.status(), &body, rid, &mut conn.out);
                poll_fn(|cx| conn.poll_write_out(cx)).await?;
                // The caller may still be sending the head: read it away, so the close does
                // not reset the answer.
                return conn.close(true).await;
            }
        };
        let inflight = watch.begin();
        let method = head.parts.method.clone();
        let http10 = head.parts.version == Version::HTTP_10;
        let mut keep_alive = head.keep_alive;
        let (mut inbound, body) = conn.body_for(&head);
        let body = body.with_verbatim(head.verbatim);
        let req = Request::from_parts(head.parts, CallerBody::Left(body));
        let resp = {
            let mut fut = pin!(handler(req, peer));
            poll_fn(|cx| {
                loop {
                    if let Poll::Ready(Ok(resp)) = fut.as_mut().poll(cx) {
                        return Poll::Ready(Some(resp));
                    }
                    match conn.poll_inbound(cx, &mut inbound) {
                        Poll::Ready(true) => {}
                        Poll::Ready(false) => return Poll::Ready(None),
                        Poll::Pending => return Poll::Pending,
                    }
                }
            })
            .await
        };
        // The caller left: dropping the handler's future cancelled the request.
        let Some(resp) = resp else { return Ok(()) };
        if let Some(pipe) = inbound.pipe.take() {
            // Answered before the body was read to its end: the rest stays unread, and a
            // reader elsewhere learns so now rather than when the connection ends.
            pipe.abandon();
            inbound.abandoned = true;
        }
        // The rest of a body left unread is read after the answer, if it may be.
        keep_alive &= (inbound.complete() || inbound.drainable()) && !stop.is_cancelled();
        let (mut parts, mut body) = resp.into_parts();
        let length = body.size_hint().exact();
        let out = response::encode(
            &parts,
            &method,
            http10,
            length,
            &mut keep_alive,
            &mut conn.out,
        );
        // Written: its map is kept for the next head (`header_maps`).
        crate::header_maps::give(std::mem::take(&mut parts.headers));
        drop(parts);
        let written = {
            let mut writer = Writer { out, done: false };
            poll_fn(|cx| conn.poll_response(cx, &mut writer, &mut body, &mut inbound)).await
        };
        drop(body);
        if keep_alive && matches!(written, Ok(false)) && !inbound.complete() {
            // Still in flight meanwhile: the drain's own bound holds it, not the idle one.
            let within = watch.limits().body_read_timeout;
            keep_alive = conn.drain(&mut inbound, within).await;
        }
        drop(inflight);
        if conn.buf.is_empty() {
            conn.trim();
        } else {
            // Part of the next head came while this request was served: its deadline runs
            // from now, as if its first byte came now.
            watch.head_begun();
        }
        match written {
            Ok(true) => keep_alive = false,
            Ok(false) => {}
            // The caller left, or the answer broke off: the connection cannot go on.
            Err(e) => return Err(e),
        }
        if !keep_alive {
            return conn.close(!inbound.complete()).await;
        }
    }
}

/// The request body as the connection reads it.
struct Inbound {
    /// `None` once the body is complete (or there is none).
    pipe: Option<Arc<Pipe>>,
    framing: Left,
    /// A `100 Continue` is owed before the first read of the body.
    continue_due: bool,
    /// The body broke off: the caller closed, or sent bad chunked coding.
    broken: bool,
    /// The reader went away before the end: the rest stays unread.
    abandoned: bool,
}

enum Left {
    Bytes(u64),
    Chunked(Decoder),
}

impl Drop for Inbound {
    fn drop(&mut self) {
        if let Some(pipe) = &self.pipe {
            pipe.abandon();
        }
    }
}

impl Inbound {
    fn complete(&self) -> bool {
        self.pipe.is_none() && !self.broken && !self.abandoned
    }

    /// Whether the rest of a body the handler left unread may be read and dropped after the
    /// answer: the caller was asked for it (no `100 Continue` still owed) and it did not break
    /// off, and a declared rest is within [`REFUSED_BODY_MAX`](super::REFUSED_BODY_MAX) (a
    /// chunked one is counted as it comes).
    fn drainable(&self) -> bool {
        self.abandoned
            && !self.broken
            && !self.continue_due
            && match self.framing {
                Left::Bytes(n) => n <= super::REFUSED_BODY_MAX,
                Left::Chunked(_) => true,
            }
    }
}

struct Conn<T> {
    io: T,
    /// Bytes read and not yet taken: a head being parsed, body bytes, a next request.
    buf: BytesMut,
    /// Bytes to write, in order: `out`, then `big`, then `after_big`.
    out: Vec<u8>,
    big: Bytes,
    after_big: &'static [u8],
    max_buf: usize,
    /// How much of `buf` a parse found to be a head without its end (0: none yet).
    head_seen: usize,
    /// What had come of a next head was only blank lines, now skipped (RFC 9112 §2.2: some
    /// clients send a CRLF after a body): the connection is idle again, not reading a head.
    blank_only: bool,
}

/// Where the writing of one response is.
struct Writer {
    out: Out,
    /// The body ended and its end is queued.
    done: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Conn<T> {
    /// The next request head; `Ok(None)` when the caller closed, or `stop` fired, between
    /// requests.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        mut stopped: Pin<&mut tokio_util::sync::WaitForCancellationFuture<'_>>,
    ) -> Poll<Result<Option<request::Head>, Refusal>> {
        loop {
            // A head is parsed again only once its end may be in: a caller that sends its head
            // a byte at a time must not make each byte cost a parse of all before it.
            let from = self.head_seen.saturating_sub(3);
            if self.head_seen == 0 || self.buf.len() >= self.max_buf || ends_head(&self.buf[from..])
            {
                let had = self.buf.len();
                if let Some(head) = request::parse(&mut self.buf, self.max_buf)? {
                    self.head_seen = 0;
                    return Poll::Ready(Ok(Some(head)));
                }
                // Emptied by the parse: there were only blank lines.
                self.blank_only = had > 0 && self.buf.is_empty();
                self.head_seen = self.buf.len();
            }
            // A head begun is awaited (within the header read timeout); none is not.
            if self.buf.is_empty() && stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(None));
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) | Err(_) => return Poll::Ready(Ok(None)),
                Ok(_) => {}
            }
        }
    }

    /// The handler's body: whole if it is all in the buffer, else piped.
    fn body_for(&mut self, head: &request::Head) -> (Inbound, RequestBody) {
        let mut inbound = Inbound {
            pipe: None,
            framing: Left::Bytes(0),
            continue_due: false,
            broken: false,
            abandoned: false,
        };
        match head.framing {
            Framing::Length(n) if n <= self.buf.len() as u64 => {
                let bytes = self.buf.split_to(n as usize).freeze();
                (inbound, RequestBody::whole(bytes))
            }
            framing => {
                let pipe = Arc::new(Pipe::default());
                inbound.pipe = Some(pipe.clone());
                inbound.framing = match framing {
                    Framing::Length(n) => Left::Bytes(n),
                    Framing::Chunked => Left::Chunked(Decoder::new()),
                };
                inbound.continue_due = head.expects_continue && self.buf.is_empty();
                (inbound, RequestBody::piped(pipe))
            }
        }
    }

    /// Reads for the request while its handler works: the body's next chunk when the handler
    /// wants it, else the end of the stream if the caller leaves. `Ready(true)`: something
    /// changed, poll the handler again; `Ready(false)`: the caller is gone.
    fn poll_inbound(&mut self, cx: &mut Context<'_>, inbound: &mut Inbound) -> Poll<bool> {
        let Some(pipe) = inbound.pipe.clone() else {
            return self.poll_gone(cx, inbound).map(|()| false);
        };
        match pipe.want(cx) {
            Want::Nothing => return Poll::Pending,
            Want::Gone => {
                inbound.pipe = None;
                inbound.abandoned = true;
                return Poll::Pending;
            }
            Want::Data => {}
        }
        if inbound.continue_due {
            inbound.continue_due = false;
            self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        if ready!(self.poll_write_out(cx)).is_err() {
            pipe.fail(cx, "the caller closed the connection");
            inbound.pipe = None;
            inbound.broken = true;
            return Poll::Ready(true);
        }
        loop {
            let step = match &mut inbound.framing {
                Left::Bytes(0) => Ok(Step::Done),
                Left::Bytes(_) if self.buf.is_empty() => Ok(Step::More),
                Left::Bytes(left) => {
                    let n = (*left).min(self.buf.len() as u64);
                    *left -= n;
                    Ok(Step::Data(self.buf.split_to(n as usize).freeze()))
                }
                Left::Chunked(decoder) => decoder.step(&mut self.buf),
            };
            match step {
                Ok(Step::Data(data)) => {
                    let last = matches!(inbound.framing, Left::Bytes(0));
                    pipe.deliver(cx, Some(data), last);
                    if last {
                        inbound.pipe = None;
                    }
                    return Poll::Ready(true);
                }
                Ok(Step::Done) => {
                    pipe.deliver(cx, None, true);
                    inbound.pipe = None;
                    return Poll::Ready(true);
                }
                Err(why) => {
                    pipe.fail(cx, why);
                    inbound.pipe = None;
                    inbound.broken = true;
                    return Poll::Ready(true);
                }
                Ok(Step::More) => match ready!(self.poll_fill_body(cx, &inbound.framing)) {
                    Ok(0) | Err(_) => {
                        pipe.fail(
                            cx,
                            "the caller closed the connection before the body was complete",
                        );
                        inbound.pipe = None;
                        inbound.broken = true;
                        return Poll::Ready(true);
                    }
                    Ok(_) => {}
                },
            }
        }
    }

    /// Resolves when the caller has left (the end of its stream, or an error); bytes it sends
    /// meanwhile (a next request) are kept, up to `max_buf`. A body left unread or broken is
    /// not read past, and a caller that pipelined `max_buf` is not watched until its requests
    /// are taken: its leaving is then seen at the next read. (legate's handlers read the body
    /// before anything that waits long, so an unread body means an answer is coming.)
    fn poll_gone(&mut self, cx: &mut Context<'_>, inbound: &Inbound) -> Poll<()> {
        if !inbound.complete() {
            return Poll::Pending;
        }
        while self.buf.len() < self.max_buf {
            match ready!(self.poll_fill(cx)) {
                Ok(0) | Err(_) => return Poll::Ready(()),
                Ok(_) => {}
            }
        }
        Poll::Pending
    }

    /// Writes the response: the queued head, then the body's frames as they come, sent
    /// whenever the body has nothing more ready. `Ok(true)`: written, but the connection must
    /// close (the body was shorter than its declared length).
    fn poll_response<B>(
        &mut self,
        cx: &mut Context<'_>,
        w: &mut Writer,
        body: &mut B,
        inbound: &mut Inbound,
    ) -> Poll<io::Result<bool>>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        loop {
            if !self.big.is_empty() || self.out.len() >= FLUSH_AT || w.done {
                ready!(self.poll_write_out(cx))?;
            }
            if w.done {
                return Poll::Ready(Ok(matches!(w.out, Out::Length(n) if n > 0)));
            }
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.queue(&mut w.out, data);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    let e: BoxError = e.into();
                    return Poll::Ready(Err(io::Error::other(e)));
                }
                Poll::Ready(None) => {
                    if w.out == Out::Chunked {
                        self.out.extend_from_slice(b"0\r\n\r\n");
                    }
                    w.done = true;
                }
                Poll::Pending => {
                    ready!(self.poll_write_out(cx))?;
                    // All written: while the body waits, watch for the caller leaving.
                    if self.poll_gone(cx, inbound).is_ready() {
                        return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// Queues a chunk of the body in its framing (bytes beyond a declared length are dropped).
    fn queue(&mut self, out: &mut Out, mut data: Bytes) {
        match out {
            Out::None => return,
            Out::Length(left) => {
                data.truncate((*left).min(data.len() as u64) as usize);
                *left -= data.len() as u64;
            }
            Out::Chunked if !data.is_empty() => {
                let mut hex = [0u8; 16];
                let mut i = hex.len();
                let mut n = data.len();
                while n > 0 || i == hex.len() {
                    i -= 1;
                    hex[i] = b"0123456789abcdef"[n % 16];
                    n /= 16;
                }
                self.out.extend_from_slice(&hex[i..]);
                self.out.extend_from_slice(b"\r\n");
            }
            Out::Chunked | Out::Close => {}
        }
        if data.is_empty() {
            return;
        }
        let tail: &'static [u8] = if *out == Out::Chunked { b"\r\n" } else { b"" };
        if data.len() > COPY_MAX {
            self.big = data;
            self.after_big = tail;
        } else {
            self.out.extend_from_slice(&data);
            self.out.extend_from_slice(tail);
        }
    }

    /// Writes everything queued.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.drain(..n);
        }
        while !self.big.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.big))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let _ = self.big.split_to(n);
        }
        if !self.after_big.is_empty() {
            self.out.extend_from_slice(self.after_big);
            self.after_big = b"";
            return self.poll_write_out(cx);
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Between requests, an idle connection keeps no more than [`KEEP`] of either buffer: one
    /// large upload or answer must not stay allocated for the connection's life.
    fn trim(&mut self) {
        if self.out.capacity() > KEEP {
            self.out = Vec::new();
        }
        if self.buf.capacity() > KEEP {
            self.buf = BytesMut::new();
        }
    }

    /// Reads more of a body into the buffer: room for up to [`BODY_READ`] at once, so that a
    /// large upload moves in few reads and hand-overs.
    fn poll_fill_body(&mut self, cx: &mut Context<'_>, left: &Left) -> Poll<io::Result<usize>> {
        let want = match left {
            Left::Bytes(n) => (*n).min(BODY_READ as u64) as usize,
            Left::Chunked(_) => BODY_READ,
        };
        if self.buf.capacity() - self.buf.len() < want {
            self.buf.reserve(want);
        }
        self.poll_fill(cx)
    }

    /// Reads more into the buffer; `Ok(0)` at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < MIN_READ {
            self.buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    /// Reads and drops the rest of a body its handler left unread (see the module's doc),
    /// within `within`; whether it ended there, so that the connection can go on. Bytes after
    /// it are the next request's, and stay in the buffer. A shutdown does not cut it short:
    /// its answer went out without `connection: close`, so the caller may still be writing,
    /// and closing under it would reset that answer away (the shutdown's grace bounds it).
    async fn drain(&mut self, inbound: &mut Inbound, within: Duration) -> bool {
        let mut seen = 0;
        let rest = poll_fn(|cx| self.poll_drain(cx, &mut inbound.framing, &mut seen));
        let drained = tokio::time::timeout(within, rest).await.unwrap_or(false);
        // Nothing of the body is left unread now.
        inbound.abandoned &= !drained;
        drained
    }

    /// [`Self::drain`]'s reads: `Ready(false)` if the caller left, the chunked coding broke or
    /// the bytes it took went past [`REFUSED_BODY_MAX`](super::REFUSED_BODY_MAX) (`seen`
    /// counts them).
    fn poll_drain(&mut self, cx: &mut Context<'_>, left: &mut Left, seen: &mut u64) -> Poll<bool> {
        loop {
            match left {
                Left::Bytes(0) => return Poll::Ready(true),
                Left::Bytes(n) if !self.buf.is_empty() => {
                    let k = (*n).min(self.buf.len() as u64);
                    *n -= k;
                    bytes::Buf::advance(&mut self.buf, k as usize);
                    continue;
                }
                Left::Bytes(_) => {}
                Left::Chunked(decoder) => {
                    // Counted on the wire, not as data: size lines, extensions and trailers
                    // are bytes the caller makes legate read too.
                    let before = self.buf.len();
                    let step = decoder.step(&mut self.buf);
                    *seen += (before - self.buf.len()) as u64;
                    if *seen > super::REFUSED_BODY_MAX {
                        return Poll::Ready(false);
                    }
                    match step {
                        Ok(Step::Data(_)) => continue,
                        Ok(Step::Done) => return Poll::Ready(true),
                        Ok(Step::More) => {}
                        Err(_) => return Poll::Ready(false),
                    }
                }
            }
            match ready!(self.poll_fill_body(cx, left)) {
                Ok(0) | Err(_) => return Poll::Ready(false),
                Ok(_) => {}
            }
        }
    }

    /// Ends the connection after its last answer. With `linger`, what the caller still sends
    /// (the body nobody read) is read and dropped for a moment first, so that the close does
    /// not reset the answer away.
    async fn close(&mut self, linger: bool) -> io::Result<()> {
        let _ = self.io.shutdown().await;
        if linger {
            let drain = async {
                let mut seen = 0;
                while seen < LINGER_BYTES {
                    self.buf.clear();
                    match self.io.read_buf(&mut self.buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen += n,
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
        }
        Ok(())
    }
}

/// Whether `bytes` hold the blank line that ends a head.
fn ends_head(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, b"\n\r\n").is_some()
        || memchr::memmem::find(bytes, b"\n\n").is_some()
}

#[cfg(test)]
mod tests;
