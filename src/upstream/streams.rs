//! The streams of one upstream HTTP/2 connection: how many legate has open on it, and how
//! many the provider allows at once (its `SETTINGS_MAX_CONCURRENT_STREAMS`, read from the
//! connection's bytes as they arrive, since hyper does not tell).
//!
//! hyper's HTTP/2 client queues a request beyond the provider's limit inside the connection
//! until a stream frees, and says nothing of it: the request waits unsent while its attempt's
//! `first_byte_timeout` runs, times out, is retried while the first copy may still go out,
//! and the breaker counts the timeouts of a healthy provider. The pool therefore puts no more
//! requests on a connection than the provider allows, and opens another connection instead
//! (bounded, as every connection is, by the provider's `max_concurrency`). A connection with a
//! stream open is busy, not idle, whatever hyper says of its readiness.
//!
//! A connection whose provider sent GOAWAY takes no new stream: the provider would not process
//! it (RFC 9113 §6.8). hyper stops taking requests on it once its connection task has handled
//! the frame; the reader notes it as the bytes arrive, so that a request hyper hands back
//! unwritten meanwhile is known to have met a GOAWAY, and is sent again (`pool`). Front ends
//! send GOAWAY to retire a connection after so many streams or so long.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Streams a connection takes once the provider's SETTINGS came without a limit: RFC 9113 sets
/// none then, and 100 is the least it recommends a server allow.
const WITHOUT_LIMIT: usize = 100;

#[derive(Debug)]
pub(super) struct Streams {
    open: AtomicUsize,
    allowed: AtomicUsize,
    /// The provider's first SETTINGS frame was read. Until then the connection carries only
    /// the request it was opened for: a burst put on it in that round trip would meet a limit
    /// not yet known, and its streams be refused.
    known: AtomicBool,
    /// The provider sent GOAWAY, or a request on the connection got no answer in time: no new
    /// stream goes on it.
    going_away: AtomicBool,
}

impl Streams {
    pub(super) fn new() -> Arc<Streams> {
        Arc::new(Streams {
            open: AtomicUsize::new(0),
            allowed: AtomicUsize::new(WITHOUT_LIMIT),
            known: AtomicBool::new(false),
            going_away: AtomicBool::new(false),
        })
    }

    /// A stream, if the provider allows one more on this connection.
    pub(super) fn try_take(self: &Arc<Self>) -> Option<StreamSlot> {
        if !self.known.load(Ordering::Acquire) || self.going_away.load(Ordering::Acquire) {
            return None;
        }
        let allowed = self.allowed.load(Ordering::Acquire);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < allowed).then_some(open + 1)
            })
            .ok()?;
        Some(StreamSlot(self.clone()))
    }

    /// A stream on a connection just opened for the request, whatever the limit says (a
    /// provider that allows none would otherwise be retried without end).
    pub(super) fn take(self: &Arc<Self>) -> StreamSlot {
        self.open.fetch_add(1, Ordering::AcqRel);
        StreamSlot(self.clone())
    }

    /// A stream is open: the connection is in use.
    pub(super) fn busy(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0
    }

    fn allow(&self, n: u32) {
        self.allowed
            .store(usize::try_from(n).unwrap_or(usize::MAX), Ordering::Release);
    }

    /// Whether the provider sent GOAWAY: the connection takes no new stream.
    pub(super) fn going_away(&self) -> bool {
        self.going_away.load(Ordering::Acquire)
    }

    /// The connection takes no new stream, and is let go once its streams are done (a request
    /// on it got no answer in time).
    pub(super) fn retire(&self) {
        self.going_away.store(true, Ordering::Release);
    }

    /// The provider's first SETTINGS came: its limit if it named one, else the default.
    fn settings_seen(&self) {
        self.known.store(true, Ordering::Release);
    }
}

/// One open stream, held by the request and then by its answer's body until the body is
/// read to its end or dropped.
#[derive(Debug)]
pub struct StreamSlot(Arc<Streams>);

impl StreamSlot {
    /// The stream's connection takes no new stream (its answer stalled past `idle_timeout`).
    pub(super) fn retire(&self) {
        self.0.retire();
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads the provider's frames as they arrive, only far enough to find its SETTINGS and a
/// GOAWAY: each frame's 9-byte head, and the 6-byte entries of a SETTINGS frame that is not an
/// ACK.
/// Everything else is skipped by its length; no byte is kept beyond one head or entry.
#[derive(Debug)]
pub(super) struct SettingsReader {
    streams: Arc<Streams>,
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes of the current frame still to come (`None`: a head is being read).
    left: Option<usize>,
    settings: bool,
    /// The provider's first SETTINGS frame has been read whole.
    seen: bool,
    entry: [u8; 6],
    entry_len: usize,
}

const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;

impl SettingsReader {
    pub(super) fn new(streams: Arc<Streams>) -> Self {
        SettingsReader {
            streams,
            head: [0; 9],
            head_len: 0,
            left: None,
            settings: false,
            seen: false,
            entry: [0; 6],
            entry_len: 0,
        }
    }

    /// Takes the next bytes the connection read.
    pub(super) fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.left {
                None => {
                    let n = (9 - self.head_len).min(bytes.len());
                    self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                    self.head_len += n;
                    bytes = &bytes[n..];
                    if self.head_len == 9 {
                        self.head_len = 0;
                        let len = u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]);
                        self.settings = self.head[3] == SETTINGS && self.head[4] & ACK == 0;
                        if self.head[3] == GOAWAY {
                            self.streams.going_away.store(true, Ordering::Release);
                        }
                        self.entry_len = 0;
                        self.left = (len > 0).then_some(len as usize);
                        if self.settings && len == 0 {
                            self.first_settings_read();
                        }
                    }
                }
                Some(left) => {
                    let n = left.min(bytes.len());
                    if self.settings {
                        for &b in &bytes[..n] {
                            self.entry[self.entry_len] = b;
                            self.entry_len += 1;
                            if self.entry_len == 6 {
                                self.entry_len = 0;
                                self.setting();
                            }
                        }
                    }
                    bytes = &bytes[n..];
                    self.left = (left > n).then_some(left - n);
                    if self.settings && self.left.is_none() {
                        self.first_settings_read();
                    }
                }
            }
        }
    }

    /// A SETTINGS frame ended: the first one fixes the limit (a limit it named is set already).
    fn first_settings_read(&mut self) {
        if !self.seen {
            self.seen = true;
            self.streams.settings_seen();
        }
    }

    fn setting(&self) {
        let id = u16::from_be_bytes([self.entry[0], self.entry[1]]);
        if id == MAX_CONCURRENT_STREAMS {
            let value =
                u32::from_be_bytes([self.entry[2], self.entry[3], self.entry[4], self.entry[5]]);
            self.streams.allow(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags, 0, 0, 0, 0]);
        out.extend_from_slice(payload);
        out
    }

    fn setting(id: u16, value: u32) -> Vec<u8> {
        let mut out = id.to_be_bytes().to_vec();
        out.extend_from_slice(&value.to_be_bytes());
        out
    }

    #[test]
    fn the_limit_is_read_from_settings_however_the_bytes_are_cut() {
        let mut bytes = frame(
            SETTINGS,
            0,
            &[setting(0x4, 65535), setting(0x3, 2)].concat(),
        );
        // DATA, whose bytes would read as a GOAWAY's type if its payload were taken for heads.
        bytes.extend(frame(0x0, 0, &[7u8; 40]));
        bytes.extend(frame(SETTINGS, ACK, &[]));
        bytes.extend(frame(0x8, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE
        for cut in 1..bytes.len() {
            let streams = Streams::new();
            let mut reader = SettingsReader::new(streams.clone());
            for chunk in bytes.chunks(cut) {
                reader.read(chunk);
            }
            let a = streams.try_take();
            let b = streams.try_take();
            assert!(a.is_some() && b.is_some(), "cut {cut}");
            assert!(!streams.going_away(), "cut {cut}");
            assert!(streams.try_take().is_none(), "cut {cut}");
            drop(a);
            assert!(streams.try_take().is_some(), "cut {cut}");
        }
    }

    #[test]
    fn nothing_is_shared_before_the_first_settings_and_a_settings_without_a_limit_allows_100() {
        let streams = Streams::new();
        let mut reader = SettingsReader::new(streams.clone());
        let opener = streams.take();
        assert!(streams.try_take().is_none(), "before any SETTINGS");
        // A SETTINGS frame cut before its end is not read yet.
        let settings = frame(SETTINGS, 0, &setting(0x4, 65535));
        reader.read(&settings[..12]);
        assert!(streams.try_take().is_none());
        reader.read(&settings[12..]);
        let more: Vec<_> = (0..WITHOUT_LIMIT - 1).map(|_| streams.try_take()).collect();
        assert!(more.iter().all(Option::is_some));
        assert!(streams.try_take().is_none());
        drop((opener, more));
        // A provider that says 0 (an empty SETTINGS frame first, and then 0) is taken at its word.
        let streams = Streams::new();
        let mut reader = SettingsReader::new(streams.clone());
        reader.read(&frame(SETTINGS, 0, &[]));
        assert!(streams.try_take().is_some());
        reader.read(&frame(SETTINGS, 0, &setting(0x3, 0)));
        assert!(streams.try_take().is_none());
    }

    #[test]
    fn a_later_settings_frame_changes_the_limit_and_an_ack_or_other_frame_does_not() {
        let streams = Streams::new();
        let mut reader = SettingsReader::new(streams.clone());
        reader.read(&frame(SETTINGS, 0, &setting(0x3, 1)));
        // A DATA frame carrying what would read as a limit of 50, and an ACK with a payload.
        reader.read(&frame(0x0, 0, &setting(0x3, 50)));
        reader.read(&frame(SETTINGS, ACK, &setting(0x3, 50)));
        let one = streams.try_take();
        assert!(one.is_some());
        assert!(streams.try_take().is_none());
        assert!(streams.busy());
        reader.read(&frame(SETTINGS, 0, &setting(0x3, 3)));
        let more = [streams.try_take(), streams.try_take()];
        assert!(more.iter().all(Option::is_some));
        assert!(streams.try_take().is_none());
        // A connection opened for a request takes it whatever the limit.
        let forced = streams.take();
        drop((one, more, forced));
        assert!(!streams.busy());
    }

    #[test]
    fn a_goaway_however_cut_ends_sharing_and_the_streams_open_finish() {
        let settings = frame(SETTINGS, 0, &setting(0x3, 10));
        let goaway = frame(GOAWAY, 0, &[0, 0, 0, 1, 0, 0, 0, 0]);
        for cut in 1..=goaway.len() {
            let streams = Streams::new();
            let mut reader = SettingsReader::new(streams.clone());
            reader.read(&settings);
            let kept = streams.try_take();
            assert!(kept.is_some() && !streams.going_away());
            for chunk in goaway.chunks(cut) {
                reader.read(chunk);
            }
            assert!(streams.going_away(), "cut {cut}");
            assert!(streams.try_take().is_none(), "cut {cut}");
            assert!(streams.busy(), "the stream kept is still open");
            drop(kept);
            assert!(!streams.busy());
        }
    }
}
