//! Watching an event stream as it passes: complete events only, their kinds (preamble,
//! content, terminal, error), and usage. Shared by the pre-commit reader (`chain`) and the
//! body that forwards a committed stream (`body`), so both see the stream the same way.

use bytes::{Bytes, BytesMut};

use crate::api::{ApiKind, StreamEventKind};
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
        }
    }

    /// Bounds the event being assembled (SPEC §14: `max_event_bytes`).
    pub fn with_max_event(mut self, max_event: usize) -> Self {
        self.max_event = max_event;
        self
    }

    /// Watches one upstream chunk. Returns the bytes of the events it completed (to forward
    /// now) and whether the first content event was among them.
    pub fn feed(&mut self, data: Bytes) -> (Option<Bytes>, bool) {
        let had_content = self.saw_content;
        self.parser.push(&data);
        self.drain_events();
        // Forward exactly the bytes of complete events; a partial one stays back so that an
        // error event legate may have to append never lands inside it.
        let held = self.parser.pending_bytes();
        if held > self.max_event {
            // An upstream that never finishes an event must not make legate buffer it.
            self.oversize = true;
        }
        let available = self.pending.len() + data.len();
        let ready = available.saturating_sub(held);
        let started = self.saw_content && !had_content;
        if ready == 0 {
            self.pending.extend_from_slice(&data);
            return (None, started);
        }
        let out = if self.pending.is_empty() {
            self.pending.extend_from_slice(&data[ready..]);
            data.slice(..ready)
        } else {
            self.pending.extend_from_slice(&data);
            self.pending.split_to(ready).freeze()
        };
        (Some(out), started)
    }

    /// The upstream body ended: releases an event whose last line end was the final byte. A
    /// partial event is never forwarded.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.parser.finish();
        self.drain_events();
        let ready = self
            .pending
            .len()
            .saturating_sub(self.parser.pending_bytes());
        (ready > 0).then(|| self.pending.split_to(ready).freeze())
    }

    fn drain_events(&mut self) {
        while let Some(ev) = self.parser.next_event() {
            let kind = self.api.dialect().classify(&ev);
            match kind {
                StreamEventKind::Content => self.saw_content = true,
                StreamEventKind::Terminal => self.saw_terminal = true,
                StreamEventKind::Error if self.error_data.is_none() => {
                    self.error_data = Some(ev.data.clone());
                }
                _ => {}
            }
            self.usage.observe(&ev);
        }
    }

    pub fn usage(&self) -> Option<crate::meter::Usage> {
        self.usage.usage()
    }
}
