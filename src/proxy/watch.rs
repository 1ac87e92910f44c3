//! Watching an event stream as it passes: complete events only, their kinds (preamble,
//! content, terminal, error), usage, and for a relayed Responses stream its final response,
//! which the conversation store keeps. Shared by the pre-commit reader (`chain`) and the
//! body that forwards a committed stream (`body`), so both see the stream the same way.
//!
//! For an OpenAI stream whose usage chunk legate asked for on the caller's behalf, the watch
//! also takes out of the forwarded bytes what that request added (`api::openai_chat::unasked`):
//! usage is read from the events first, then they are edited.

use bytes::{Bytes, BytesMut};

use crate::api::openai_chat::unasked::{self, ChunkEdit};
use crate::api::openai_responses::Lifecycle;
use crate::api::{ApiKind, LocalError, StreamEventKind, has_usage_object};
use crate::sse::SseParser;
use crate::usage::StreamUsage;

pub struct SseWatch {
    api: ApiKind,
    parser: SseParser,
    usage: StreamUsage,
    /// Bytes of an event that is not complete yet.
    pending: BytesMut,
    pub saw_content: bool,
    pub saw_terminal: bool,
    /// The data of the first error event, if any.
    pub error_data: Option<String>,
    /// Largest event (or unterminated line) accepted; beyond it the stream is broken.
    max_event: usize,
    /// An event grew past `max_event`: nothing more may be read from this stream.
    pub oversize: bool,
    /// Take the usage legate asked for out of the forwarded chunks.
    strip_usage: bool,
    /// Stream offset where the next event's bytes begin (the end of the last one).
    last_end: u64,
    /// Stream offset of the first byte not yet handed out (`pending` starts there).
    handed: u64,
    /// Stream offset where the final event ends: nothing after it is read or handed out.
    end_at: Option<u64>,
    /// Edits for complete events not yet handed out, in stream order.
    edits: Vec<Edit>,
    /// A relayed Responses stream: the conversation that keeps its final response.
    keep: Option<crate::proxy::conversation::Keeper>,
    /// A Responses stream: what an ending legate writes must follow (its numbering, its
    /// response).
    lifecycle: Option<Box<Lifecycle>>,
}

/// One event's edit: its span in the stream, its data as parsed, and what becomes of it.
struct Edit {
    start: u64,
    end: u64,
    data: String,
    edit: ChunkEdit,
}

impl SseWatch {
    pub fn new(api: ApiKind) -> Self {
        SseWatch {
            api,
            parser: SseParser::new(),
            usage: StreamUsage::new(api),
            pending: BytesMut::new(),
            saw_content: false,
            saw_terminal: false,
            error_data: None,
            max_event: usize::MAX,
            oversize: false,
            strip_usage: false,
            last_end: 0,
            handed: 0,
            end_at: None,
            edits: Vec::new(),
            keep: None,
            lifecycle: (api == ApiKind::Responses).then(Box::default),
        }
    }

    /// The terminal event's response is kept in `conv`'s store (a relayed Responses stream:
    /// this watch is the one reader of its events).
    pub(crate) fn keeping(mut self, conv: Option<crate::proxy::conversation::Keeper>) -> Self {
        self.keep = conv;
        self
    }

    /// The background response this relayed stream started, if any, and where it waits for
    /// its usage when the stream ends without it.
    pub(crate) fn background(&self) -> Option<(&crate::proxy::background::Unsettled, &str)> {
        let keep = self.keep.as_ref()?;
        Some((&keep.unsettled, keep.background.as_deref()?))
    }

    /// The caller did not ask for the usage chunk legate asked for: it and the `usage: null`
    /// members are removed from what is forwarded (usage is still read from them).
    pub fn strip_usage(mut self, strip: bool) -> Self {
        self.strip_usage = strip;
        self
    }

    /// Bounds the event being assembled (SPEC §14: `max_event_bytes`).
    pub fn with_max_event(mut self, max_event: usize) -> Self {
        self.max_event = max_event;
        self
    }

    /// Watches one upstream chunk. Returns the bytes of the events it completed (to forward
    /// now) and whether the first content event was among them.
    pub fn feed(&mut self, data: Bytes) -> (Option<Bytes>, bool) {
        // After the final event nothing is read: what follows it is not the caller's.
        if self.end_at.is_some() {
            return (None, false);
        }
        let had_content = self.saw_content;
        self.parser.push(&data);
        self.drain_events();
        // Forward exactly the bytes of complete events; a partial one stays back so that an
        // error event legate may have to append never lands inside it.
        let held = self.parser.pending_bytes();
        // An upstream that never finishes an event must not make legate buffer it. After the
        // final event (or the provider's error) nothing more is relayed: what follows it is
        // not the caller's, and must not turn a whole answer into a failure (or a retry).
        if held > self.max_event && !(self.saw_terminal || self.error_data.is_some()) {
            self.oversize = true;
        }
        let available = self.pending.len() + data.len();
        let ready = self.up_to_end(available.saturating_sub(held));
        let started = self.saw_content && !had_content;
        let ended = self.end_at.is_some();
        if ready == 0 {
            if !ended {
                self.pending.extend_from_slice(&data);
            }
            return (None, started);
        }
        let out = if self.pending.is_empty() {
            if !ended {
                self.pending.extend_from_slice(&data[ready..]);
            }
            data.slice(..ready)
        } else {
            self.pending.extend_from_slice(&data);
            let out = self.pending.split_to(ready).freeze();
            if ended {
                self.pending.clear();
            }
            out
        };
        (self.hand_out(out), started)
    }

    /// `ready` bytes from the first not yet handed out, cut at the final event's end: events
    /// after it in the same read (a provider's junk, an error event after `message_stop`)
    /// went out when they came in one read with it, and were dropped when they came later.
    fn up_to_end(&self, ready: usize) -> usize {
        match self.end_at {
            Some(end) => {
                ready.min(usize::try_from(end.saturating_sub(self.handed)).unwrap_or(usize::MAX))
            }
            None => ready,
        }
    }

    /// The upstream body ended: releases an event whose last line end was the final byte. A
    /// partial event is never forwarded.
    pub fn finish(&mut self) -> Option<Bytes> {
        if self.end_at.is_none() {
            self.parser.finish();
            self.drain_events();
        }
        let ready = self.up_to_end(
            self.pending
                .len()
                .saturating_sub(self.parser.pending_bytes()),
        );
        if ready == 0 {
            return None;
        }
        let out = self.pending.split_to(ready).freeze();
        self.hand_out(out)
    }

    /// The next `out.len()` bytes of the stream on their way out, with the edits of the events
    /// they hold applied (None if nothing is left of them).
    fn hand_out(&mut self, out: Bytes) -> Option<Bytes> {
        let base = self.handed;
        self.handed += out.len() as u64;
        if self.edits.is_empty() {
            return Some(out);
        }
        let mut edited = Vec::with_capacity(out.len());
        let mut copied = 0;
        for e in self.edits.drain(..) {
            let span = usize::try_from(e.start.saturating_sub(base)).unwrap_or(usize::MAX)
                ..usize::try_from(e.end.saturating_sub(base)).unwrap_or(usize::MAX);
            let Some(raw) = out.get(span.clone()) else {
                continue;
            };
            let Some((cut, with)) = cut_for(raw, &e) else {
                continue;
            };
            edited.extend_from_slice(&out[copied..span.start + cut.start]);
            edited.extend_from_slice(with.as_bytes());
            copied = span.start + cut.end;
        }
        edited.extend_from_slice(&out[copied..]);
        (!edited.is_empty()).then(|| Bytes::from(edited))
    }

    fn drain_events(&mut self) {
        while self.end_at.is_none()
            && let Some(ev) = self.parser.next_event()
        {
            if let Some(l) = &mut self.lifecycle {
                l.observe(&ev);
            }
            let kind = self.api.dialect().classify(&ev);
            // The usage of a terminal event the store already read (`Some(None)`: none).
            let mut read = None;
            if let Some(conv) = &mut self.keep
                && kind != StreamEventKind::Terminal
            {
                conv.note_started(&ev);
            }
            match kind {
                StreamEventKind::Content => self.saw_content = true,
                StreamEventKind::Terminal => {
                    self.saw_terminal = true;
                    self.end_at = Some(ev.end_offset);
                    if let Some(conv) = &self.keep {
                        read = conv.keep_terminal(&ev);
                    }
                }
                StreamEventKind::Error if self.error_data.is_none() => {
                    self.error_data = Some(ev.data.clone());
                }
                _ => {}
            }
            match read {
                // The same member the Responses dialect would read, found by the one walk
                // over the event (the final event carries the whole response, so a second
                // walk cost as much as the first); the dialect's cheap precheck still decides.
                Some(usage) if self.api == ApiKind::Responses => self
                    .usage
                    .observed(usage.filter(|_| has_usage_object(&ev.data))),
                _ => self.usage.observe(&ev),
            }
            let start = std::mem::replace(&mut self.last_end, ev.end_offset);
            if self.strip_usage
                && ev.event.is_none()
                && let Some(edit) = unasked::edit_chunk(&ev.data)
            {
                self.edits.push(Edit {
                    start,
                    end: ev.end_offset,
                    data: ev.data,
                    edit,
                });
                continue;
            }
            // Done with: its buffers serve the next events.
            self.parser.recycle(ev);
        }
    }

    pub fn usage(&self) -> Option<crate::meter::Usage> {
        self.usage.usage()
    }

    /// The error event that ends this stream when it fails under legate: for a Responses
    /// stream numbered after, and about, what was relayed.
    pub fn error_event(&self, e: LocalError<'_>) -> Bytes {
        match &self.lifecycle {
            Some(l) => l.failed_events(e),
            None => self.api.dialect().stream_error_event(e),
        }
    }
}

/// Where in an event's bytes `raw` its edit applies, and what replaces that range. The data
/// of an OpenAI chunk is one `data:` line, the last before the blank line (comment lines may
/// come first and stay); an event written otherwise is dropped whole, or left as it is.
fn cut_for<'a>(raw: &[u8], e: &'a Edit) -> Option<(std::ops::Range<usize>, &'a str)> {
    let text_end = raw.len()
        - raw
            .iter()
            .rev()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
    let data = e.data.as_bytes();
    let data_start = text_end.checked_sub(data.len())?;
    let line = &raw[..text_end];
    let in_place = line.ends_with(data);
    let line_start = [&b"data: "[..], b"data:"]
        .iter()
        .filter(|p| in_place && line[..data_start].ends_with(p))
        .map(|p| data_start - p.len())
        .find(|&at| at == 0 || matches!(line[at - 1], b'\n' | b'\r'));
    match (&e.edit, line_start) {
        (ChunkEdit::Drop, Some(at)) => Some((at..raw.len(), "")),
        (ChunkEdit::Drop, None) => Some((0..raw.len(), "")),
        (ChunkEdit::Rewrite(new), Some(_)) => Some((data_start..text_end, new.as_str())),
        (ChunkEdit::Rewrite(_), None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `wire` in pieces of `step` bytes; returns what is forwarded.
    fn forwarded(wire: &[u8], step: usize) -> (Vec<u8>, Option<crate::meter::Usage>) {
        let mut w = SseWatch::new(ApiKind::OpenAi).strip_usage(true);
        let mut out = Vec::new();
        for piece in wire.chunks(step) {
            if let (Some(b), _) = w.feed(Bytes::copy_from_slice(piece)) {
                out.extend_from_slice(&b);
            }
        }
        if let Some(b) = w.finish() {
            out.extend_from_slice(&b);
        }
        (out, w.usage())
    }

    #[test]
    fn the_unasked_usage_is_read_then_taken_out_in_any_chunking() {
        let wire = concat!(
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\"usage\\\":null\"}}],\"usage\":null}\r\n\r\n",
            "data:{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
            ": ping\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        let want = concat!(
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\"usage\\\":null\"}}]}\r\n\r\n",
            "data:{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            ": ping\n\n",
            "data: [DONE]\n\n",
        );
        for step in [1, 2, 7, 64, wire.len()] {
            let (out, usage) = forwarded(wire.as_bytes(), step);
            assert_eq!(String::from_utf8_lossy(&out), want, "step {step}");
            assert_eq!(usage.map(|u| (u.input, u.output)), Some((9, 2)));
        }
    }

    #[test]
    fn a_stream_without_usage_members_passes_byte_for_byte() {
        let wire = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(forwarded(wire, 5).0, wire);
    }

    /// Nothing after the final event goes out, nor counts (an error event after
    /// `message_stop` failed a finished answer), however the bytes are split: it went out when
    /// it came in the same read as the final event.
    #[test]
    fn nothing_after_the_final_event_is_read_in_any_chunking() {
        let done = concat!(
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let after = concat!(
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" EXTRA\"}}\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"}}\n\n",
        );
        let wire = format!("{done}{after}");
        for step in [1, 7, done.len(), wire.len()] {
            let mut w = SseWatch::new(ApiKind::Anthropic);
            let mut out = Vec::new();
            for piece in wire.as_bytes().chunks(step) {
                if let (Some(b), _) = w.feed(Bytes::copy_from_slice(piece)) {
                    out.extend_from_slice(&b);
                }
            }
            if let Some(b) = w.finish() {
                out.extend_from_slice(&b);
            }
            assert_eq!(String::from_utf8(out).unwrap(), done, "step {step}");
            assert!(w.saw_terminal && w.error_data.is_none(), "step {step}");
        }
    }
}
