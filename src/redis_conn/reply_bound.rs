//! A bound on the size of one Redis reply, kept on the connection's byte stream.
//!
//! The Redis client reads a reply whole before it hands it over, and takes a server's word for
//! its size: a bulk string declared 4 GiB long is read until 4 GiB have arrived, and an array
//! declared to hold 2^31 items is waited for item by item. A Redis that is broken, or not Redis
//! at all, could so make legate hold any amount of memory. [`Capped`] follows the replies'
//! framing (RESP2 and RESP3) as the bytes go by, without copying them, and fails the connection
//! as soon as one reply is, or is declared to be, larger than its bound: the call then fails as
//! any broken connection's does, and the next one connects afresh.
//!
//! What is measured is what the reply will take once parsed: its bytes, and for each item of an
//! array, map or set the value the client builds for it (a `_` of 3 bytes becomes a value of
//! several dozen), charged as soon as the count is read.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const LARGER: &str = "a Redis reply is larger than legate takes";
const DECLARED_LARGER: &str = "a Redis reply is declared larger than legate takes";

/// Nesting deeper than this is refused (the client's own parser refuses past 100).
const MAX_DEPTH: usize = 128;

/// What each item of an aggregate costs besides its bytes: the client's value for it, and
/// room for the vector that holds it.
const ITEM_COST: u64 = std::mem::size_of::<redis::Value>() as u64 + 8;

/// Follows RESP framing across reads and measures each top-level reply.
#[derive(Debug)]
pub(super) struct ReplyBound {
    max: u64,
    /// Bytes of the reply being read so far.
    used: u64,
    /// Items still to come in each aggregate being read, innermost last.
    open: Vec<u64>,
    state: State,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// The next byte starts an item.
    Type,
    /// Inside an item's first line; `len` is its number as read so far, for the types that
    /// carry one; `cr`: the last byte was `\r` (a line ends at CRLF only, as the client's
    /// parser reads it: a bare `\n` is part of the line).
    Line { kind: u8, len: Number, cr: bool },
    /// Bytes of a blob still to come, its closing CRLF included.
    Body(u64),
}

#[derive(Debug, Clone, Copy, Default)]
struct Number {
    negative: bool,
    value: u64,
    digits: bool,
}

impl ReplyBound {
    pub(super) fn new(max: usize) -> Self {
        ReplyBound {
            max: max as u64,
            used: 0,
            open: Vec::new(),
            state: State::Type,
        }
    }

    /// Takes the next bytes of the stream; an error says the stream is no longer followed.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), &'static str> {
        while !bytes.is_empty() {
            if let State::Body(left) = self.state {
                let take = left.min(bytes.len() as u64);
                self.count(take)?;
                bytes = &bytes[take as usize..];
                if take == left {
                    self.state = State::Type;
                    self.item_done();
                } else {
                    self.state = State::Body(left - take);
                }
                continue;
            }
            let b = bytes[0];
            bytes = &bytes[1..];
            self.count(1)?;
            self.state = match self.state {
                State::Type => State::Line {
                    kind: b,
                    len: Number::default(),
                    cr: false,
                },
                State::Line {
                    kind,
                    len,
                    cr: true,
                } if b == b'\n' => self.line_done(kind, len)?,
                State::Line { kind, mut len, .. } => {
                    if carries_length(kind) && b != b'\r' {
                        len.push(b)?;
                    }
                    State::Line {
                        kind,
                        len,
                        cr: b == b'\r',
                    }
                }
                State::Body(_) => unreachable!("handled above"),
            };
        }
        Ok(())
    }

    fn count(&mut self, n: u64) -> Result<(), &'static str> {
        self.used += n;
        if self.used > self.max {
            return Err(LARGER);
        }
        Ok(())
    }

    fn room(&self) -> u64 {
        self.max - self.used
    }

    /// What follows an item's first line.
    fn line_done(&mut self, kind: u8, len: Number) -> Result<State, &'static str> {
        if !carries_length(kind) {
            if !matches!(kind, b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(') {
                return Err("a Redis reply is not RESP");
            }
            self.item_done();
            return Ok(State::Type);
        }
        if !len.digits {
            return Err("a Redis reply has no length where one belongs");
        }
        let n = len.value;
        match kind {
            // A bulk string of -1 is nil; other blobs have no such form.
            b'$' | b'!' | b'=' => {
                if len.negative {
                    if kind != b'$' {
                        return Err("a Redis reply has a negative length");
                    }
                    self.item_done();
                    return Ok(State::Type);
                }
                let body = n.checked_add(2).filter(|&b| b <= self.room());
                match body {
                    Some(b) => Ok(State::Body(b)),
                    None => Err(DECLARED_LARGER),
                }
            }
            // Aggregates: -1 (RESP2's nil) and 0 are complete at once.
            _ => {
                let items = match kind {
                    b'%' if !len.negative => n.checked_mul(2),
                    b'|' if !len.negative => n.checked_mul(2).and_then(|i| i.checked_add(1)),
                    b'*' | b'~' | b'>' => Some(if len.negative { 0 } else { n }),
                    _ => None,
                };
                let Some(items) = items else {
                    return Err("a Redis reply has a negative count");
                };
                if items == 0 {
                    self.item_done();
                    return Ok(State::Type);
                }
                // Each item will be a value, and is at least 3 bytes more on the wire.
                if items.saturating_mul(ITEM_COST + 3) > self.room() {
                    return Err(DECLARED_LARGER);
                }
                self.count(items * ITEM_COST)?;
                if self.open.len() >= MAX_DEPTH {
                    return Err("a Redis reply is nested too deep");
                }
                self.open.push(items);
                Ok(State::Type)
            }
        }
    }

    /// One item is complete: count it in its aggregates, and end the reply at the top.
    fn item_done(&mut self) {
        loop {
            match self.open.last_mut() {
                None => {
                    self.used = 0;
                    return;
                }
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        return;
                    }
                    self.open.pop();
                }
            }
        }
    }
}

/// The types whose first line is a length or a count.
fn carries_length(kind: u8) -> bool {
    matches!(kind, b'$' | b'!' | b'=' | b'*' | b'~' | b'>' | b'%' | b'|')
}

impl Number {
    fn push(&mut self, b: u8) -> Result<(), &'static str> {
        match b {
            b'0'..=b'9' => {
                self.value = self
                    .value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .ok_or("a Redis reply's length does not fit")?;
                self.digits = true;
            }
            b'-' if !self.digits && !self.negative => self.negative = true,
            b' ' => {}
            _ => return Err("a Redis reply's length is not a number"),
        }
        Ok(())
    }
}

/// A Redis connection's stream, failed when a reply passes its bound.
pub(super) struct Capped<S> {
    inner: S,
    bound: ReplyBound,
    /// Set before the stream fails for a reply's size: the client hands that error to one
    /// waiting call only (the others see a closed connection), and whoever handles the
    /// failure must tell a refusal from an outage.
    too_large: Arc<AtomicBool>,
}

impl<S> Capped<S> {
    pub(super) fn new(inner: S, max_reply: usize, too_large: Arc<AtomicBool>) -> Self {
        Capped {
            inner,
            bound: ReplyBound::new(max_reply),
            too_large,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled
            && let Err(why) = this.bound.feed(&buf.filled()[before..])
        {
            if why == LARGER || why == DECLARED_LARGER {
                this.too_large.store(true, Ordering::Release);
            }
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
