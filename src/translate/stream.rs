//! Incremental stream translation: upstream SSE bytes in, in any chunking; whole caller-shaped
//! SSE events out. The direction-specific state machines live in `stream_anthropic` and
//! `stream_openai`; this file holds the framing they share.
//!
//! The caller's terminal events are written as soon as the upstream's terminal is read
//! (`data: [DONE]`, `message_stop`), never on a mere end of bytes: an upstream cut stays a
//! cut, and the proxy appends its own error event. After an upstream error event (translated
//! into the caller's error event) nothing more is written.

use serde::Serialize;

use super::stream_anthropic::ToAnthropic;
use super::stream_openai::ToOpenAi;
use super::{Dir, anthropic as an};
use crate::sse::{SseEvent, SseParser};

/// Translates one upstream stream into the caller's API.
#[derive(Debug)]
pub struct StreamTranslator {
    parser: SseParser,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Caller speaks Anthropic, upstream OpenAI.
    ToAnthropic(ToAnthropic),
    /// Caller speaks OpenAI, upstream Anthropic.
    ToOpenAi(ToOpenAi),
}

impl StreamTranslator {
    /// `include_usage`: the OpenAI caller asked for `stream_options.include_usage` (ignored for
    /// an Anthropic caller, who always gets usage in message_start/message_delta).
    pub fn new(dir: Dir, include_usage: bool) -> Self {
        Self::with_created(dir, include_usage, super::now_unix_secs())
    }

    /// As `new`, with the `created` stamp of the OpenAI chunks given.
    pub fn with_created(dir: Dir, include_usage: bool, created: u64) -> Self {
        let state = match dir {
            Dir::AnthropicToOpenAi => State::ToAnthropic(ToAnthropic::default()),
            Dir::OpenAiToAnthropic => State::ToOpenAi(ToOpenAi::new(include_usage, created)),
        };
        Self {
            parser: SseParser::new(),
            state,
        }
    }

    /// Feeds upstream bytes; returns the caller's bytes for every event they completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.parser.push(chunk);
        self.drain()
    }

    /// The upstream ended: releases an event the parser held back for a possible `\n` after
    /// its final `\r`. Writes no terminal unless the upstream's terminal was read.
    pub fn finish(&mut self) -> Vec<u8> {
        self.parser.finish();
        self.drain()
    }

    /// Upstream bytes not yet part of a complete event (for bounding a stuck upstream).
    pub fn pending_bytes(&self) -> usize {
        self.parser.pending_bytes()
    }

    /// What tells the caller the stream is alive while the upstream sends nothing the caller's
    /// API carries (keep-alive comments, reasoning a translation drops): Anthropic's own `ping`
    /// event once `message_start` is out (Anthropic SDKs refuse any event before it), else an
    /// SSE comment, which every SSE client skips.
    /// Nothing once the stream's terminal or error event was written: nothing follows those.
    pub fn keep_alive(&self) -> &'static [u8] {
        match &self.state {
            State::ToAnthropic(s) if s.is_done() => b"",
            State::ToOpenAi(s) if s.is_done() => b"",
            State::ToAnthropic(s) if s.started() => b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
            _ => b": ping\n\n",
        }
    }

    /// The upstream's terminal was read and the caller's terminal written.
    pub fn is_complete(&self) -> bool {
        match &self.state {
            State::ToAnthropic(s) => s.is_complete(),
            State::ToOpenAi(s) => s.is_complete(),
        }
    }

    fn drain(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(event) = self.parser.next_event() {
            match &mut self.state {
                State::ToAnthropic(s) => s.on_event(&event, &mut out),
                State::ToOpenAi(s) => s.on_event(&event, &mut out),
            }
        }
        out
    }
}

/// Writes `event: <name>` + `data: <json>`: the Anthropic SDKs dispatch on the event name.
pub(super) fn write_anthropic(out: &mut Vec<u8>, event: &an::StreamEvent) {
    if let Ok(json) = serde_json::to_string(event) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.name().as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(json.as_bytes());
        out.extend_from_slice(b"\n\n");
    }
}

/// Writes one `data:`-only event, as OpenAI streams are framed.
pub(super) fn write_openai<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    if let Ok(json) = serde_json::to_string(value) {
        write_data(out, &json);
    }
}

pub(super) fn write_data(out: &mut Vec<u8>, data: &str) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// The OpenAI stream terminator.
pub(super) const DONE: &str = "[DONE]";

/// Whether an upstream event is OpenAI's terminator (the Python SDK matches the prefix).
pub(super) fn is_done(event: &SseEvent) -> bool {
    event.data.starts_with(DONE)
}
