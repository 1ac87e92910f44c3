//! An HTTP/1 answer's body, read off the connection it came on by whoever polls it. It owns
//! the connection meanwhile: once the body ended as its framing says, the connection goes back
//! to its list (if it may carry another request); on an error, or when the body is dropped
//! before its end, the connection is closed.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::H1Error;
use super::chunked::{Decoder, Step};
use super::head::Framing;
use crate::upstream::conns::{Conn, Conns};

enum Reading {
    Length(u64),
    Chunked(Decoder),
    Close,
}

pub struct H1Body {
    /// The connection, while the body is being read.
    conn: Option<Box<Conn>>,
    reading: Reading,
    /// The connection may carry another request once this body ended.
    keep_alive: bool,
    /// The list it goes back to.
    home: Arc<Conns>,
    /// An error ended it: it is over, but not complete.
    broken: bool,
    /// Delimited by the connection's close (no length, no chunked coding): a cut cannot be
    /// told from its end.
    until_close: bool,
}

impl H1Body {
    pub(in crate::upstream) fn new(
        conn: Box<Conn>,
        framing: Framing,
        keep_alive: bool,
        home: Arc<Conns>,
    ) -> Self {
        let reading = match framing {
            Framing::Empty => Reading::Length(0),
            Framing::Length(n) => Reading::Length(n),
            Framing::Chunked => Reading::Chunked(Decoder::new()),
            Framing::Close => Reading::Close,
        };
        let mut body = H1Body {
            conn: Some(conn),
            reading,
            keep_alive,
            home,
            broken: false,
            until_close: framing == Framing::Close,
        };
        if framing == Framing::Empty {
            body.ended(true);
        }
        body
    }

    /// Whether the body ends where the connection does (see the field).
    pub fn until_close(&self) -> bool {
        self.until_close
    }

    /// The body is over: the connection goes back to its list when `clean` and nothing was
    /// read past the body's end, and is closed otherwise.
    fn ended(&mut self, clean: bool) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let spare = conn.h1().is_none_or(|h| !h.buf.is_empty());
        if clean && self.keep_alive && !spare {
            self.home.put(conn);
        }
    }

    fn failed(&mut self, e: H1Error) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        self.ended(false);
        self.broken = true;
        Poll::Ready(Some(Err(e)))
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let this = self.get_mut();
        loop {
            let Some(h1) = this.conn.as_deref_mut().and_then(Conn::h1_mut) else {
                return Poll::Ready(None);
            };
            let taken = match &mut this.reading {
                Reading::Length(left) if !h1.buf.is_empty() => {
                    let n = (*left).min(h1.buf.len() as u64);
                    *left -= n;
                    Some((h1.buf.split_to(n as usize).freeze(), *left == 0))
                }
                Reading::Length(_) => None,
                Reading::Close if !h1.buf.is_empty() => Some((h1.buf.split().freeze(), false)),
                Reading::Close => None,
                Reading::Chunked(dec) => match dec.step(&mut h1.buf) {
                    Ok(Step::Data(data)) => Some((data, false)),
                    Ok(Step::Done) => {
                        this.ended(true);
                        return Poll::Ready(None);
                    }
                    Ok(Step::More) => None,
                    Err(why) => return this.failed(H1Error::Chunked(why)),
                },
            };
            if let Some((data, last)) = taken {
                if last {
                    this.ended(true);
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            match ready!(h1.poll_fill(cx)) {
                Ok(0) if matches!(this.reading, Reading::Close) => {
                    this.ended(false);
                    return Poll::Ready(None);
                }
                Ok(0) => return this.failed(H1Error::Closed),
                Ok(_) => {}
                Err(e) => return this.failed(H1Error::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() && !self.broken
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.conn, &self.reading) {
            (None, _) if !self.broken => SizeHint::with_exact(0),
            (None, _) => SizeHint::default(),
            (Some(_), Reading::Length(left)) => SizeHint::with_exact(*left),
            _ => SizeHint::default(),
        }
    }
}
