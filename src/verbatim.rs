//! A caller's header lines that go upstream as the caller wrote them.
//!
//! Every line of a caller's HTTP/1 head is read into its `HeaderMap` (legate reads a few of
//! them), and the upstream request used to be a second map made of the lines that go on:
//! each forwarded name hashed and its slot probed again, or the caller's map copied and the
//! rest removed, and then every line written out of that map one piece at a time. With an
//! official SDK's eighteen lines, mostly `x-stainless-*` telemetry legate never reads, that
//! was the largest part of what a request's headers cost (bench/README.md).
//!
//! The lines that go on unchanged are instead noted as the caller's head is read: which of
//! them are forwarded as they are ([`crate::upstream::verbatim_name`]), kept as a few runs of
//! the head's own bytes. An HTTP/1 upstream request is then written from those runs (one copy
//! each) beside the small map of what legate sets itself; an HTTP/2 one gets the lines added
//! to its map. Nothing is kept that is not in the head already: the runs are offsets into it,
//! and the head's bytes are the ones the caller's map's values share.
//!
//! A head whose lines cannot all be kept this way has none kept ([`Verbatim::of`] is `None`),
//! and its upstream request is made from the map as before: a `Connection` line naming other
//! lines (those are dropped, whatever their name), a line not ended by exactly CRLF right after
//! its value, more runs than [`MAX_RUNS`], or a head past 64 KiB. So when a `Verbatim` is
//! there, it holds every line of a verbatim name, and no other.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};

use crate::upstream::h1::lines::Spans;

/// The most runs of adjacent lines kept. An SDK's lines make two to four: its credential,
/// `host`, `connection`, `accept-encoding` and `content-length` lines, which are not
/// forwarded as they came, fall between them.
pub(crate) const MAX_RUNS: usize = 6;

/// Runs of whole header lines (each `name: value` and its CRLF) of one caller head.
#[derive(Clone)]
pub struct Verbatim {
    head: Bytes,
    /// Start and end of each run in `head`; `count` of them are used.
    runs: [[u16; 2]; MAX_RUNS],
    count: u8,
}

impl std::fmt::Debug for Verbatim {
    /// The runs' places only: values are the caller's, and never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.runs[..self.count()]).finish()
    }
}

impl Verbatim {
    /// The lines of `head` (read into `spans`) whose bit is set in `keep` (bit `i`: line
    /// `i`), as runs; `None` when they cannot all be kept (see the module's doc).
    pub(crate) fn of(head: &Bytes, spans: &Spans, keep: u128) -> Option<Verbatim> {
        if head.len() > usize::from(u16::MAX) {
            return None;
        }
        let mut kept = Verbatim {
            head: head.clone(),
            runs: [[0; 2]; MAX_RUNS],
            count: 0,
        };
        let mut open: Option<[u16; 2]> = None;
        for i in 0..spans.count().min(128) {
            if keep & (1 << i) == 0 {
                continue;
            }
            let [start, _, _, value_end] = spans.line(i);
            let end = value_end + 2;
            // The line as written must end right after its value: what is copied is then
            // exactly the name, the colon, the spaces before the value, the value and CRLF.
            if head.get(value_end..end) != Some(b"\r\n".as_slice()) {
                return None;
            }
            // Both fit: the head is at most 64 KiB.
            let (start, end) = (start as u16, end as u16);
            open = match open {
                Some([s, e]) if e == start => Some([s, end]),
                Some(run) => {
                    kept.push(run)?;
                    Some([start, end])
                }
                None => Some([start, end]),
            };
        }
        if let Some(run) = open {
            kept.push(run)?;
        }
        Some(kept)
    }

    fn push(&mut self, run: [u16; 2]) -> Option<()> {
        let slot = self.runs.get_mut(usize::from(self.count))?;
        *slot = run;
        self.count += 1;
        Some(())
    }

    fn count(&self) -> usize {
        usize::from(self.count)
    }

    /// The runs' bytes, in the caller's order.
    fn runs(&self) -> impl Iterator<Item = &[u8]> {
        self.runs[..self.count()]
            .iter()
            .map(|&[s, e]| &self.head[usize::from(s)..usize::from(e)])
    }

    /// Appends the lines, as the caller wrote them, to an HTTP/1 head being written.
    pub(crate) fn write_to(&self, out: &mut Vec<u8>) {
        for run in self.runs() {
            out.extend_from_slice(run);
        }
    }

    /// Appends the lines to `map` (an HTTP/2 request, whose lines go as a map): each line
    /// read again at its colon, its value shared with the head and checked as a value (this
    /// path is not the one to save those instructions on).
    pub(crate) fn append_to(&self, map: &mut HeaderMap) {
        for &[s, e] in &self.runs[..self.count()] {
            let (s, e) = (usize::from(s), usize::from(e));
            let mut at = s;
            while at < e {
                let line_end = at
                    + self.head[at..e]
                        .windows(2)
                        .position(|w| w == b"\r\n")
                        .unwrap_or(e - at);
                let line = &self.head[at..line_end];
                if let Some(colon) = line.iter().position(|b| *b == b':') {
                    let spaces = line[colon + 1..]
                        .iter()
                        .take_while(|b| matches!(b, b' ' | b'\t'))
                        .count();
                    let value = self.head.slice(at + colon + 1 + spaces..line_end);
                    let name = crate::upstream::h1::lines::name(&line[..colon]);
                    if let (Some(name), Ok(value)) = (name, HeaderValue::from_maybe_shared(value)) {
                        map.append(name, value);
                    }
                }
                at = line_end + 2;
            }
        }
    }
}
