//! Incremental Server-Sent-Events frame parser (WHATWG HTML "event stream" rules, as the
//! provider SDKs apply them). Pure: bytes in, events out, no I/O.
//!
//! Chunks may be split anywhere: mid-line, between the `\r` and `\n` of a line end, inside a
//! UTF-8 sequence. Every event reports the absolute offset just past its terminating blank line,
//! so a caller can hold back or forward exactly the bytes of whole events.
//!
//! Choices where the standard leaves room:
//! - A block without data lines and without an event name (comments only, `id:`/`retry:` only,
//!   or a stray blank line) is not dispatched; its bytes lie in the span of the next dispatched
//!   event (between the previous event's `end_offset` and the next one's). It is complete all
//!   the same: `pending_bytes` no longer counts it, so a caller forwarding whole blocks passes
//!   keep-alive comments on as soon as they arrive.
//! - An empty `event:` value is the same as no event name (`event: None`).
//! - A blank line ending in `\r` that is the very last byte pushed so far completes its event
//!   only once the next byte shows whether a `\n` belongs to the same line end, so that
//!   `end_offset` never depends on how the stream was chunked. [`SseParser::finish`] releases
//!   such an event when the stream has ended.
//! - A partial event at the end of the stream is discarded (as the standard says); `id` and
//!   `retry` fields are ignored; a leading byte-order mark is not stripped.

use std::collections::VecDeque;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any (and not empty).
    pub event: Option<String>,
    /// The `data:` lines joined with `'\n'`; invalid UTF-8 is replaced (lossy).
    pub data: String,
    /// Offset in the whole pushed byte stream just past this event's terminating blank line.
    pub end_offset: u64,
}

/// Incremental parser state. Keeps only the partial line and the fields of the event being
/// built, never the raw bytes of whole events.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The start of a line whose end has not been pushed yet.
    line: Vec<u8>,
    /// The last byte pushed ended a line with `\r`: a `\n` that follows belongs to that line end.
    after_cr: bool,
    /// A completed blank line ended with that trailing `\r`: the event waits for the next byte.
    held: bool,
    name: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    /// Total bytes pushed.
    pushed: u64,
    /// Offset just past the last blank line (0 before any): everything before it is complete.
    boundary: u64,
    ready: VecDeque<SseEvent>,
    /// Buffers of an event the caller handed back ([`SseParser::recycle`]), empty, for the
    /// next event's name and data: a stream read event by event allocates for none of its
    /// events after the first few.
    spare_name: Vec<u8>,
    spare_data: Vec<u8>,
}

/// The most capacity a spare buffer keeps (SPEC §14: what a parser holds stays small; a larger
/// event's buffer is let go with it).
const SPARE_CAP: usize = 64 * 1024;

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next chunk of the byte stream.
    pub fn push(&mut self, chunk: &[u8]) {
        let base = self.pushed;
        self.pushed += chunk.len() as u64;
        let mut i = 0;
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                i = 1;
            }
            if self.held {
                self.held = false;
                self.dispatch(base + i as u64);
            }
        }
        while i < chunk.len() {
            let rest = &chunk[i..];
            // memchr's vectorised search: an event's data line is most of its bytes.
            let Some(eol) = memchr::memchr2(b'\n', b'\r', rest) else {
                self.line.extend_from_slice(rest);
                break;
            };
            let next = match (rest[eol], rest.get(eol + 1)) {
                (b'\r', Some(b'\n')) => i + eol + 2,
                (b'\r', None) => {
                    self.after_cr = true;
                    i + eol + 1
                }
                _ => i + eol + 1,
            };
            let blank = if self.line.is_empty() {
                self.process_line(&rest[..eol])
            } else {
                // Reuse the carried-over buffer (and its capacity) for the completed line.
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&rest[..eol]);
                let blank = self.process_line(&line);
                line.clear();
                self.line = line;
                blank
            };
            if blank {
                if self.after_cr {
                    self.held = true;
                } else {
                    self.dispatch(base + next as u64);
                }
            }
            i = next;
        }
    }

    /// Marks the end of the stream: an event held back only to see whether a `\n` followed its
    /// final `\r` is completed. A partial event stays discarded.
    pub fn finish(&mut self) {
        self.after_cr = false;
        if self.held {
            self.held = false;
            self.dispatch(self.pushed);
        }
    }

    /// Next complete event, if the bytes pushed so far completed one.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }

    /// Takes back an event the caller is done with: its buffers, emptied, are reused for the
    /// next events instead of new ones.
    pub fn recycle(&mut self, ev: SseEvent) {
        fn keep(spare: &mut Vec<u8>, mut buf: Vec<u8>) {
            if buf.capacity() > spare.capacity() && buf.capacity() <= SPARE_CAP {
                buf.clear();
                *spare = buf;
            }
        }
        keep(&mut self.spare_data, ev.data.into_bytes());
        if let Some(name) = ev.event {
            keep(&mut self.spare_name, name.into_bytes());
        }
    }

    /// Bytes pushed so far that belong to no complete event yet: those after the last blank
    /// line (which ends an event, or a block that dispatches nothing). A caller forwards or holds
    /// back the others whole, and bounds this to stop an upstream that never finishes an event.
    pub fn pending_bytes(&self) -> usize {
        usize::try_from(self.pushed - self.boundary).unwrap_or(usize::MAX)
    }

    /// Applies one complete line (without its line end). Returns true for a blank line.
    fn process_line(&mut self, line: &[u8]) -> bool {
        if line.is_empty() {
            return true;
        }
        if line[0] == b':' {
            return false;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                } else {
                    fit_empty(&mut self.data, value.len());
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.name.clear();
                fit_empty(&mut self.name, value.len());
                self.name.extend_from_slice(value);
            }
            _ => {}
        }
        false
    }

    /// Ends the block being built at stream offset `end`, dispatching it if it is an event.
    fn dispatch(&mut self, end: u64) {
        self.boundary = end;
        if !self.has_data && self.name.is_empty() {
            return;
        }
        // The fields' buffers go with the event; spare ones (if any) take their place.
        let event = (!self.name.is_empty()).then(|| {
            let spare = std::mem::take(&mut self.spare_name);
            into_string(std::mem::replace(&mut self.name, spare))
        });
        let spare = std::mem::take(&mut self.spare_data);
        let data = into_string(std::mem::replace(&mut self.data, spare));
        self.has_data = false;
        self.ready.push_back(SseEvent {
            event,
            data,
            end_offset: end,
        });
    }
}

/// An empty (reused) buffer too small for `len` bytes is replaced by one of that size: growing
/// it would copy its old contents, which are of no use.
fn fit_empty(buf: &mut Vec<u8>, len: usize) {
    if buf.capacity() < len {
        *buf = Vec::with_capacity(len);
    }
}

/// Takes the bytes as a `String` without copying when they are valid UTF-8.
fn into_string(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Every complete event of `wire`, for tests that classify or read recorded streams.
#[cfg(test)]
pub(crate) fn events_of(wire: &str) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    p.push(wire.as_bytes());
    std::iter::from_fn(|| p.next_event()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c);
            out.extend(std::iter::from_fn(|| p.next_event()));
        }
        p.finish();
        out.extend(std::iter::from_fn(|| p.next_event()));
        out
    }

    fn ev(event: Option<&str>, data: &str, end_offset: u64) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
            end_offset,
        }
    }

    #[test]
    fn anthropic_stream_with_ping_and_error() {
        let wire = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\"}\n\n",
            "event: ping\n",
            "data: {\"type\": \"ping\"}\n\n",
            "event: error\n",
            "data: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\"}}\n\n",
        );
        let events = parse_all(&[wire.as_bytes()]);
        let names: Vec<_> = events.iter().map(|e| e.event.as_deref()).collect();
        assert_eq!(names, [Some("message_start"), Some("ping"), Some("error")]);
        assert_eq!(events[1].data, "{\"type\": \"ping\"}");
        assert_eq!(events[2].end_offset, wire.len() as u64);
    }

    #[test]
    fn recycled_buffers_carry_nothing_into_the_next_events() {
        let mut p = SseParser::new();
        p.push(b"event: long_name\ndata: a long first event\n\n");
        let first = p.next_event();
        assert_eq!(first, Some(ev(Some("long_name"), "a long first event", 43)));
        p.recycle(first.unwrap());
        p.push(b"data: b\n\nevent: x\ndata: c\ndata: d\n\n");
        let second = p.next_event();
        assert_eq!(second, Some(ev(None, "b", 52)));
        p.recycle(second.unwrap());
        assert_eq!(p.next_event(), Some(ev(Some("x"), "c\nd", 78)));
        p.push(b"event: y\n\n");
        assert_eq!(p.next_event(), Some(ev(Some("y"), "", 88)));
    }

    #[test]
    fn multi_line_data_is_joined_and_one_space_stripped() {
        let wire = b"data:a\ndata:  b\ndata\ndata: \n\n";
        let events = parse_all(&[wire]);
        assert_eq!(events, [ev(None, "a\n b\n\n", wire.len() as u64)]);
    }

    #[test]
    fn comments_and_empty_blocks_are_not_dispatched_but_counted() {
        let wire = b": keep-alive\n\nid: 7\n\n\ndata: x\n\n";
        let events = parse_all(&[wire]);
        assert_eq!(events, [ev(None, "x", wire.len() as u64)]);
        let mut p = SseParser::new();
        p.push(b"data: a\n\n: keep-alive\n\n: part");
        assert_eq!(p.next_event().map(|e| e.end_offset), Some(9));
        assert_eq!(
            p.pending_bytes(),
            6,
            "the finished comment block is not pending"
        );
    }

    #[test]
    fn event_name_without_data_is_dispatched_and_empty_name_is_none() {
        let wire = b"event: message_stop\n\nevent:\ndata: d\n\n";
        let events = parse_all(&[wire]);
        assert_eq!(
            events,
            [
                ev(Some("message_stop"), "", 21),
                ev(None, "d", wire.len() as u64)
            ]
        );
    }

    #[test]
    fn openai_done_sentinel_is_plain_data() {
        let wire = b"data: {\"choices\":[]}\r\n\r\ndata: [DONE]\r\n\r\n";
        let events = parse_all(&[wire]);
        assert_eq!(events[1], ev(None, "[DONE]", wire.len() as u64));
    }

    #[test]
    fn crlf_split_between_cr_and_lf_keeps_true_offset() {
        let mut p = SseParser::new();
        p.push(b"data: a\r\n\r");
        assert_eq!(p.next_event(), None, "the final \\n may still follow");
        assert_eq!(p.pending_bytes(), 10);
        p.push(b"\ndata: b");
        assert_eq!(p.next_event(), Some(ev(None, "a", 11)));
        assert_eq!(p.pending_bytes(), 7);
    }

    #[test]
    fn bare_cr_event_is_released_by_next_byte_or_finish() {
        let mut p = SseParser::new();
        p.push(b"data: a\r\r");
        assert_eq!(p.next_event(), None);
        p.push(b"d");
        assert_eq!(p.next_event(), Some(ev(None, "a", 9)));
        p.push(b"ata: b\r\r");
        p.finish();
        assert_eq!(p.next_event(), Some(ev(None, "b", 18)));
        assert_eq!(p.pending_bytes(), 0);
    }

    #[test]
    fn partial_event_at_end_is_not_dispatched() {
        let mut p = SseParser::new();
        p.push(b"data: a\n\ndata: cut");
        p.finish();
        assert_eq!(p.next_event(), Some(ev(None, "a", 9)));
        assert_eq!(p.next_event(), None);
        assert_eq!(p.pending_bytes(), 9);
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let events = parse_all(&[b"data: \xff\xfe ok\n\n"]);
        assert_eq!(events[0].data, "\u{fffd}\u{fffd} ok");
    }

    /// One block of the generated stream: the lines of one event (or of a block that dispatches
    /// nothing), in order, without line ends.
    #[derive(Debug, Clone)]
    struct Block {
        name: Option<String>,
        data: Vec<String>,
        comments: Vec<String>,
        name_first: bool,
        bare: bool,
    }

    fn value() -> impl Strategy<Value = String> {
        "[^\r\n]{0,10}"
    }

    fn block() -> impl Strategy<Value = Block> {
        (
            proptest::option::of(value()),
            proptest::collection::vec(value(), 0..4),
            proptest::collection::vec(value(), 0..2),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(name, data, comments, name_first, bare)| Block {
                name,
                data,
                comments,
                name_first,
                bare,
            })
    }

    /// Renders a field line; `bare` writes the value without the optional space (when that
    /// keeps the value intact) or, for an empty value, as a name without a colon.
    fn field(name: &str, value: &str, bare: bool) -> String {
        match (bare, value.is_empty(), value.starts_with(' ')) {
            (true, true, _) => name.to_owned(),
            (true, false, false) => format!("{name}:{value}"),
            _ => format!("{name}: {value}"),
        }
    }

    fn block_lines(b: &Block) -> Vec<String> {
        let mut lines: Vec<String> = b.comments.iter().map(|c| format!(":{c}")).collect();
        let data = b.data.iter().map(|d| field("data", d, b.bare));
        let name = b.name.iter().map(|n| field("event", n, b.bare));
        if b.name_first {
            lines.extend(name.chain(data));
        } else {
            lines.extend(data.chain(name));
        }
        lines.push(String::new());
        lines
    }

    /// Renders the blocks with the given line ends and returns the bytes and the events a
    /// conforming parser must produce.
    fn render(blocks: &[Block], ends: &[u8]) -> (Vec<u8>, Vec<SseEvent>) {
        let mut out = Vec::new();
        let mut expected = Vec::new();
        let mut prev_cr = false;
        let mut k = 0;
        for b in blocks {
            for line in block_lines(b) {
                out.extend_from_slice(line.as_bytes());
                let mut end: &[u8] = match ends[k % ends.len()] % 3 {
                    0 => b"\n",
                    1 => b"\r\n",
                    _ => b"\r",
                };
                k += 1;
                // A lone "\n" right after a "\r" line end would merge with it.
                if prev_cr && line.is_empty() && end == b"\n" {
                    end = b"\r\n";
                }
                out.extend_from_slice(end);
                prev_cr = end == b"\r";
            }
            let name = b.name.clone().filter(|n| !n.is_empty());
            if name.is_some() || !b.data.is_empty() {
                expected.push(SseEvent {
                    event: name,
                    data: b.data.join("\n"),
                    end_offset: out.len() as u64,
                });
            }
        }
        (out, expected)
    }

    proptest! {
        #[test]
        fn any_chunking_yields_the_rendered_events(
            blocks in proptest::collection::vec(block(), 0..8),
            ends in proptest::collection::vec(any::<u8>(), 1..6),
            cuts in proptest::collection::vec(0usize..64, 0..12),
        ) {
            let (bytes, expected) = render(&blocks, &ends);
            let mut cut_points: Vec<usize> = cuts.iter().map(|c| c * bytes.len() / 64).collect();
            cut_points.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for c in cut_points.into_iter().chain([bytes.len()]) {
                chunks.push(&bytes[start..c]);
                start = c;
            }
            let events = parse_all(&chunks);
            prop_assert_eq!(events, expected);
        }

        #[test]
        fn pending_bytes_is_the_tail_after_the_last_block(
            blocks in proptest::collection::vec(block(), 0..6),
            tail in "[a-z: ]{0,8}",
        ) {
            let (mut bytes, _) = render(&blocks, &[0]);
            bytes.extend_from_slice(tail.as_bytes());
            let mut p = SseParser::new();
            p.push(&bytes);
            prop_assert_eq!(p.pending_bytes(), tail.len());
        }
    }
}
