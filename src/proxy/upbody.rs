//! The upstream response body as the rest of the proxy reads it: the provider's bytes as they
//! are, or — when a chain step speaks another API — passed event by event through an
//! [`EventTranslator`], so that commit-point reading, usage metering and forwarding all see the
//! caller's shape.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::api::ApiKind;
use crate::cloud::eventstream::EventStreamSse;
use crate::sse::SseParser;
use crate::translate::StreamTranslator;
use crate::upstream::{BodyError, ResponseBody};
use crate::usage::{StreamUsage, Usage};

pub enum UpstreamBody {
    Plain(Raw),
    Translated(Box<Translated>),
}

/// Turns upstream stream bytes, in any chunking, into the caller's bytes.
pub trait EventTranslator: Send {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8>;
    /// The upstream ended; writes no terminal unless the upstream's terminal was read.
    fn finish(&mut self) -> Vec<u8>;
    /// A keep-alive in the caller's shape that commits nothing (an SSE comment by default);
    /// empty once the caller's stream has ended (its terminal or error event written).
    fn keep_alive(&self) -> &'static [u8] {
        b": ping\n\n"
    }
    /// The caller's stream has ended (its terminal or error event written): what the upstream
    /// sends after it is not the caller's.
    fn ended(&self) -> bool {
        self.keep_alive().is_empty()
    }
}

impl EventTranslator for StreamTranslator {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        StreamTranslator::push(self, chunk)
    }
    fn finish(&mut self) -> Vec<u8> {
        StreamTranslator::finish(self)
    }
    fn keep_alive(&self) -> &'static [u8] {
        StreamTranslator::keep_alive(self)
    }
}

/// At most one keep-alive per this long (or half the step's `idle_timeout`, if shorter): a
/// provider streaming reasoning a translation drops sends many events a second, and the
/// caller needs only to hear that the stream lives.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(1);

/// The provider's bytes: as they came, or a Bedrock event stream already read as SSE.
pub enum Raw {
    Http(ResponseBody),
    EventStream(Box<EventStreamSse>),
}

impl Raw {
    /// See [`ResponseBody::retire_connection`].
    fn retire_connection(&self) {
        match self {
            Raw::Http(b) => b.retire_connection(),
            Raw::EventStream(b) => b.retire_connection(),
        }
    }
}

impl Body for Raw {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Raw::Http(b) => Pin::new(b).poll_frame(cx),
            Raw::EventStream(b) => Pin::new(b.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Raw::Http(b) => b.is_end_stream(),
            Raw::EventStream(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Raw::Http(b) => b.size_hint(),
            Raw::EventStream(b) => b.size_hint(),
        }
    }
}

pub struct Translated {
    inner: Raw,
    translator: Box<dyn EventTranslator>,
    ended: bool,
    /// Usage is metered on the upstream's own events: the caller's translated stream may not
    /// carry it (an OpenAI caller who did not ask for the usage chunk).
    parser: SseParser,
    usage: StreamUsage,
    /// Largest upstream event (or unterminated line) accepted; beyond it the stream is cut.
    max_event: usize,
    /// The upstream's API, and whether its own stream carried an error event: an error in
    /// the translated stream without one was the translator's (an answer it cannot carry).
    upstream: ApiKind,
    upstream_error: bool,
    /// The stream was cut at an upstream event larger than `max_event`.
    oversize: bool,
    /// When the last keep-alive was written (see `poll_translated`), and how far apart.
    kept_alive: Option<tokio::time::Instant>,
    keep_alive_every: Duration,
}

impl UpstreamBody {
    /// The upstream's stream through `translator`; usage is read from the upstream's own
    /// events, in its API. `idle_timeout` is the step's: keep-alives come often enough for it.
    pub fn translated(
        inner: Raw,
        translator: Box<dyn EventTranslator>,
        upstream: ApiKind,
        max_event: usize,
        idle_timeout: Duration,
    ) -> Self {
        UpstreamBody::Translated(Box::new(Translated {
            inner,
            translator,
            ended: false,
            parser: SseParser::new(),
            usage: StreamUsage::new(upstream),
            max_event,
            upstream,
            upstream_error: false,
            oversize: false,
            kept_alive: None,
            keep_alive_every: KEEP_ALIVE_EVERY.min(idle_timeout / 2),
        }))
    }

    /// The stream was translated and the provider's own events held no error: an error event
    /// in it was the translator's refusal of what the provider sent (arguments that are not
    /// a JSON object, an event it cannot read), not the provider's.
    pub fn translator_refused(&self) -> bool {
        matches!(self, UpstreamBody::Translated(t) if !t.upstream_error)
    }

    /// A translated stream cut at an upstream event larger than `server.max_event_bytes`
    /// (its end then reads as a cut, and the caller is told why).
    pub fn event_too_large(&self) -> bool {
        matches!(self, UpstreamBody::Translated(t) if t.oversize)
    }

    /// Whether the body is translated from the upstream's API.
    pub fn is_translated(&self) -> bool {
        matches!(self, UpstreamBody::Translated(_))
    }

    /// The provider's answer stalled past its `idle_timeout` (not the request's deadline):
    /// its connection takes no new request (see [`ResponseBody::retire_connection`]).
    pub fn retire_connection(&self) {
        match self {
            UpstreamBody::Plain(raw) => raw.retire_connection(),
            UpstreamBody::Translated(t) => t.inner.retire_connection(),
        }
    }

    /// Usage read from the upstream's own events, for a translated stream.
    pub fn upstream_usage(&self) -> Option<Usage> {
        match self {
            UpstreamBody::Plain(_) => None,
            UpstreamBody::Translated(t) => t.usage.usage(),
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            UpstreamBody::Plain(inner) => Pin::new(inner).poll_frame(cx),
            UpstreamBody::Translated(t) => t.poll_translated(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Plain(inner) => inner.is_end_stream(),
            UpstreamBody::Translated(t) => t.ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Plain(inner) => inner.size_hint(),
            UpstreamBody::Translated(_) => SizeHint::default(),
        }
    }
}

impl Translated {
    /// Whether a keep-alive may be written now (none in the last `keep_alive_every`); if so,
    /// it is counted as written.
    fn keep_alive_due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if self
            .kept_alive
            .is_some_and(|t| now.duration_since(t) < self.keep_alive_every)
        {
            return false;
        }
        self.kept_alive = Some(now);
        true
    }

    fn poll_translated(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let pending = self.parser.pending_bytes() + data.len();
                        self.parser.push(&data);
                        while let Some(ev) = self.parser.next_event() {
                            if !self.upstream_error {
                                self.upstream_error = self.upstream.dialect().classify(&ev)
                                    == crate::api::StreamEventKind::Error;
                            }
                            self.usage.observe(&ev);
                        }
                        // The chunk's complete events are translated first: a final event in
                        // it, followed by the start of an oversized line, still ends the
                        // caller's stream whole.
                        let out = self.translator.push(&data);
                        if self.parser.pending_bytes() > self.max_event && !self.translator.ended()
                        {
                            // Ends like a cut (no terminal event): the stream is broken.
                            tracing::warn!(
                                "upstream stream event larger than server.max_event_bytes"
                            );
                            self.ended = true;
                            self.oversize = true;
                            if !out.is_empty() {
                                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                            }
                            return Poll::Ready(None);
                        }
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                        // Whole upstream blocks came and gave the caller nothing (keep-alive
                        // comments, dropped reasoning): the caller hears a keep-alive of its
                        // own API, so that neither its idle watchdog nor legate's `idle_timeout`
                        // takes a living stream for a stalled one.
                        let ping = self.translator.keep_alive();
                        if !ping.is_empty()
                            && self.parser.pending_bytes() < pending
                            && self.keep_alive_due()
                        {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(ping)))));
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    self.ended = true;
                    // Completes the caller's terminal events only if the upstream's stream
                    // really completed; a cut stays a cut.
                    let out = self.translator.finish();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
