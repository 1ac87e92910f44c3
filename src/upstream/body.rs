//! An upstream answer's body, whichever connection it came on: legate's own HTTP/1 one (see
//! [`h1`](super::h1)) or hyper's HTTP/2 one.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::h1::body::H1Body;
use super::streams::StreamSlot;

/// An HTTP/2 answer's body keeps its stream counted on its connection until it is dropped.
pub enum ResponseBody {
    H1(H1Body),
    H2(Incoming, Option<StreamSlot>),
}

// Carried in the answer, the exchange's outcome and the pending stream, each moved a few
// times per request: small, with the connection it reads from boxed (`conns::Conns`).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<ResponseBody>() <= 64);

/// Why an upstream body could not be read to its end.
#[derive(Debug)]
pub struct BodyError(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BodyError {}

impl ResponseBody {
    /// An HTTP/1 body delimited by the connection's close, whose cut looks like its end.
    pub fn until_close(&self) -> bool {
        matches!(self, ResponseBody::H1(b) if b.until_close())
    }

    /// An HTTP/2 answer's connection takes no new request, and is let go once its other
    /// streams are done: the answer stalled past the provider's `idle_timeout`, and what
    /// stalled it (a peer gone without a FIN, a connection whose flow-control window is never
    /// granted again) would stall every stream put on it next. An HTTP/1 answer's connection
    /// is closed with the body anyway.
    pub fn retire_connection(&self) {
        if let ResponseBody::H2(_, Some(slot)) = self {
            slot.retire();
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let boxed = |e: Box<dyn std::error::Error + Send + Sync>| BodyError(e);
        match self.get_mut() {
            ResponseBody::H1(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|e| boxed(Box::new(e))))),
            ResponseBody::H2(b, _) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|e| boxed(Box::new(e))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::H1(b) => b.is_end_stream(),
            ResponseBody::H2(b, _) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::H1(b) => b.size_hint(),
            ResponseBody::H2(b, _) => b.size_hint(),
        }
    }
}
