//! Watching a stream for usage: the usage seen so far, folded event by event by the dialect
//! of the stream's API (running totals are overwritten, never added); and the top-level
//! `usage` object of a whole answer, which the dialects decode in their own shape.

pub(crate) mod flat;

use crate::api::ApiKind;
pub use crate::meter::Usage;
use crate::sse::SseEvent;

#[derive(Debug, Clone)]
pub struct StreamUsage {
    api: ApiKind,
    usage: Option<Usage>,
    /// An event carried usage that could not be read: the stream's usage is unknown.
    unreadable: bool,
}

impl StreamUsage {
    pub fn new(api: ApiKind) -> Self {
        Self {
            api,
            usage: None,
            unreadable: false,
        }
    }

    /// Looks at one event; only events that can carry usage are parsed.
    pub fn observe(&mut self, ev: &SseEvent) {
        if !self.api.dialect().observe_usage(ev, &mut self.usage) && !self.unreadable {
            self.unreadable = true;
            unreadable();
        }
    }

    /// The usage of one event, read by someone else already (a relayed Responses stream's
    /// terminal event, read for the store): it replaces what was seen, as an observed event's
    /// does; None leaves it as it is.
    pub fn observed(&mut self, usage: Option<Usage>) {
        if let Some(u) = usage {
            self.usage = Some(u);
        }
    }

    /// The usage seen so far (None until an event carried some, and once one carried usage
    /// that could not be read).
    pub fn usage(&self) -> Option<Usage> {
        self.usage.filter(|_| !self.unreadable)
    }
}

/// The top-level `usage` object of a JSON body, decoded as `R`; None when it is absent, null
/// or unreadable. Only that value is decoded, and it is looked for from the end of the body,
/// where providers put it: the content before it is not walked at all.
pub(crate) fn usage_object<R: serde::de::DeserializeOwned>(
    body: &[u8],
    in_place: impl FnOnce(&[u8]) -> Option<R>,
) -> Option<R> {
    let span = crate::splice::value_near_end(body, "usage")?;
    decode(&body[span], in_place)
}

/// A usage object's text decoded as `R`: by `in_place` (a [`flat`] reader that takes only what
/// it reads exactly as serde would), else by serde; None when it is null or unreadable.
pub(crate) fn decode<R: serde::de::DeserializeOwned>(
    obj: &[u8],
    in_place: impl FnOnce(&[u8]) -> Option<R>,
) -> Option<R> {
    in_place(obj).or_else(|| match serde_json::from_slice::<Option<R>>(obj) {
        Ok(r) => r,
        Err(_) => {
            unreadable();
            None
        }
    })
}

/// A usage object whose counts cannot be read (one negative, fractional, a string or past
/// 2^64) leaves its answer unmetered: said at `warn`, at most once a minute, since a
/// broken provider may send one per event. The reason is a fixed text: serde's would quote the
/// object, which an upstream controls.
pub(crate) fn unreadable() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if (last == 0 || now >= last + 60)
        && LAST
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            "an upstream usage object is not counts legate can read (negative, fractional, a string or past 2^64): that answer is not metered (its reservation is kept); said at most once a minute"
        );
    }
}

/// The usage the dialect of `api` reads from the recorded stream `wire`.
#[cfg(test)]
pub(crate) fn of_stream(api: ApiKind, wire: &str) -> Option<Usage> {
    let mut watch = StreamUsage::new(api);
    for ev in crate::sse::events_of(wire) {
        watch.observe(&ev);
    }
    watch.usage()
}
