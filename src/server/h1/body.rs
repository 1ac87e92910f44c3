//! A caller's HTTP/1 request body, as the handler reads it.
//!
//! Nearly every request arrives whole with its head; its body is then a view of the
//! connection's read buffer, handed over in one frame without a channel or a wake-up. A body
//! still on its way is read by the connection, in the same task as the handler that awaits
//! it: the handler's read says it wants data through a [`Pipe`], the connection reads the
//! socket and passes one chunk over, and polls the handler again — no wake-up unless the body
//! was handed to another task.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;

/// Why a request body could not be read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadError(pub(super) &'static str);

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ReadError {}

/// A request body on an HTTP/1 connection.
pub struct RequestBody(Kind, Option<Box<crate::verbatim::Verbatim>>);

enum Kind {
    /// Arrived with the head (`None` once taken, or when there is none).
    Whole(Option<Bytes>),
    /// Read by the connection as the handler asks for it.
    Piped(Arc<Pipe>),
}

impl RequestBody {
    pub(super) fn whole(bytes: Bytes) -> Self {
        RequestBody(Kind::Whole((!bytes.is_empty()).then_some(bytes)), None)
    }

    pub(super) fn piped(pipe: Arc<Pipe>) -> Self {
        RequestBody(Kind::Piped(pipe), None)
    }

    /// The head's lines that go upstream as the caller wrote them, carried with the body to
    /// the handler, which takes them ([`crate::verbatim`]).
    pub(super) fn with_verbatim(
        mut self,
        verbatim: Option<Box<crate::verbatim::Verbatim>>,
    ) -> Self {
        self.1 = verbatim;
        self
    }

    /// Takes the head's verbatim lines, if the connection found them all keepable.
    pub fn take_verbatim(&mut self) -> Option<Box<crate::verbatim::Verbatim>> {
        self.1.take()
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = ReadError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ReadError>>> {
        match &mut self.get_mut().0 {
            Kind::Whole(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Piped(pipe) => pipe.poll_read(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.0, Kind::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Piped(_) => SizeHint::default(),
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let Kind::Piped(pipe) = &self.0 {
            pipe.reader_gone();
        }
    }
}

/// What passes between the connection and the reader of a body still on its way. It holds at
/// most one chunk: the connection reads on only once the reader took it.
#[derive(Default)]
pub(super) struct Pipe(Mutex<Shared>);

#[derive(Default)]
struct Shared {
    chunk: Option<Bytes>,
    /// The body is complete once `chunk` is taken.
    ended: bool,
    failed: Option<ReadError>,
    /// The reader found nothing and waits.
    wants: bool,
    reader_gone: bool,
    reader: Option<Waker>,
    conn: Option<Waker>,
}

/// What the connection should do for the reader.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Want {
    /// Read a chunk and pass it over.
    Data,
    /// Nothing now: the reader has not asked, or has a chunk still.
    Nothing,
    /// The reader is gone; what is left of the body will not be read.
    Gone,
}

impl Pipe {
    fn poll_read(&self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ReadError>>> {
        let mut s = self.0.lock();
        if let Some(chunk) = s.chunk.take() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some(e) = s.failed {
            return Poll::Ready(Some(Err(e)));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        s.wants = true;
        set_waker(&mut s.reader, cx.waker());
        // The connection usually polls this reader itself and sees the want when the handler
        // returns; only a reader on another task must wake it.
        if let Some(conn) = &s.conn
            && !conn.will_wake(cx.waker())
        {
            conn.wake_by_ref();
        }
        Poll::Pending
    }

    fn reader_gone(&self) {
        let mut s = self.0.lock();
        s.reader_gone = true;
        if let Some(conn) = s.conn.take() {
            conn.wake();
        }
    }

    /// Asked by the connection (`cx` is its task's context).
    pub(super) fn want(&self, cx: &Context<'_>) -> Want {
        let mut s = self.0.lock();
        set_waker(&mut s.conn, cx.waker());
        if s.reader_gone {
            Want::Gone
        } else if s.wants && s.chunk.is_none() {
            Want::Data
        } else {
            Want::Nothing
        }
    }

    /// Passes `chunk` over (the last one with `last`); `None` with `last` ends an empty rest.
    pub(super) fn deliver(&self, cx: &Context<'_>, chunk: Option<Bytes>, last: bool) {
        let mut s = self.0.lock();
        s.chunk = chunk;
        s.ended = last;
        s.wants = false;
        wake_reader(&mut s, cx);
    }

    pub(super) fn fail(&self, cx: &Context<'_>, why: &'static str) {
        let mut s = self.0.lock();
        s.failed = Some(ReadError(why));
        s.wants = false;
        wake_reader(&mut s, cx);
    }
}

impl Pipe {
    /// The connection stopped reading the body (it answered, or ended): a reader still
    /// waiting, on whatever task, gets an error instead of waiting forever.
    pub(super) fn abandon(&self) {
        let mut s = self.0.lock();
        if s.ended || s.failed.is_some() {
            return;
        }
        s.failed = Some(ReadError("the connection stopped reading the request body"));
        if let Some(reader) = s.reader.take() {
            reader.wake();
        }
    }
}

fn set_waker(slot: &mut Option<Waker>, waker: &Waker) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
        *slot = Some(waker.clone());
    }
}

/// Wakes a reader on another task; one on the connection's own task is polled next anyway.
fn wake_reader(s: &mut Shared, cx: &Context<'_>) {
    if let Some(reader) = &s.reader
        && !reader.will_wake(cx.waker())
    {
        reader.wake_by_ref();
    }
}
