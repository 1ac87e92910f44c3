//! Background responses relayed before their usage was known (`background: true` on a step
//! that serves the Responses API, SPEC §11). The provider answers such a request at once with
//! the response `queued` (or `in_progress`) and no usage; the usage comes with the response's
//! final state, which the caller reads later by polling `GET /v1/responses/{id}` (or by
//! cancelling it). The request itself was metered as an answer whose usage is unknown: counted
//! in the ledger's requests, its reservation kept at its estimate. Its id is remembered here
//! with where its usage goes (the tenant, step, model and price of the request that made it),
//! and the first poll or cancel answered with the response in a final state meters that
//! state's usage in the token and cost metrics and the ledger, once per id: a later poll of
//! the same response finds nothing here. A background request that streams (`stream: true`)
//! is metered by its own final event; one whose stream ended before it (the caller left, the
//! connection broke) is remembered the same way, by the id of its first event, and metered by
//! the poll or the resumed stream (`?stream=true`) that finds it final.
//!
//! The tenant's budget and tokens-per-minute bucket are not settled again: the reservation was
//! settled when the request was answered, at its estimate (input and `max_output_tokens`, the
//! most the response may be billed for when the request names it), and stays so.
//!
//! Bounded by count ([`MAX_UNSETTLED`], the oldest forgotten first, said in the log): a
//! response never polled in a final state is forgotten once that many newer ones came. Only
//! ids a path can name are recorded. In this process only: a poll that another replica
//! relays meters nothing there.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::proxy::record::UsageSink;
use crate::splice;
use crate::sse::SseParser;
use crate::usage::Usage;

/// Responses remembered: an id (at most [`crate::responses::owners::MAX_ID`] bytes) and its
/// sink (shared handles, the tenant's name and a price), a few hundred bytes each, so at most
/// about 2 MiB.
pub const MAX_UNSETTLED: usize = 4096;

/// What a response's JSON says of its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// `queued` or `in_progress`: its usage is still to come.
    Running,
    /// `completed`, `incomplete`, `failed` or `cancelled`, with the usage it reports (None:
    /// none, or none that can be read).
    Final(Option<Usage>),
    /// No readable `status` (not a response object, or one of a shape legate does not know).
    Unknown,
}

#[derive(Default)]
struct Inner {
    sinks: HashMap<Arc<str>, UsageSink>,
    order: VecDeque<Arc<str>>,
}

#[derive(Default)]
pub struct Unsettled {
    /// Set by the first background response: until then a poll costs one atomic load here.
    any: AtomicBool,
    inner: Mutex<Inner>,
}

impl Unsettled {
    /// A relayed answer without usage (`body`, the response as the caller gets it): when it
    /// is a background response still running, its usage goes to `sink` once it is final.
    /// Returns whether it was remembered.
    pub fn expect(&self, body: &[u8], sink: UsageSink) -> bool {
        match read(body) {
            Read {
                id: Some(id),
                state: State::Running,
                ..
            } => self.expect_id(&id, sink),
            _ => false,
        }
    }

    /// Background response `id`, still running when its request's answer ended without its
    /// usage (a stream cut before its final event): its usage goes to `sink` once it is final.
    pub fn expect_id(&self, id: &str, sink: UsageSink) -> bool {
        if !crate::responses::owners::recordable(id) {
            return false;
        }
        let id: Arc<str> = Arc::from(id);
        let mut inner = self.inner.lock();
        if inner.sinks.insert(id.clone(), sink).is_none() {
            inner.order.push_back(id);
        }
        while inner.order.len() > MAX_UNSETTLED {
            if let Some(old) = inner.order.pop_front()
                && inner.sinks.remove(&old).is_some()
            {
                tracing::info!(
                    id = %old,
                    "a background response's usage will not be metered: more than {MAX_UNSETTLED} newer ones wait for theirs"
                );
            }
        }
        self.any.store(true, Ordering::Release);
        true
    }

    /// Whether `id` is a background response whose usage is still to come.
    pub fn waits_for(&self, id: &str) -> bool {
        self.any.load(Ordering::Acquire) && self.inner.lock().sinks.contains_key(id)
    }

    /// The provider's answer to a poll or cancel of response `id` (`stream`: its events
    /// replayed, else the response's JSON): when it shows the response final, its usage is
    /// metered to the request that made it, and `id` forgotten. Returns the usage metered and
    /// its cost in pico-USD (None: nothing was).
    pub fn settle(&self, id: &str, body: &[u8], stream: bool) -> Option<(Usage, u128)> {
        if !self.waits_for(id) {
            return None;
        }
        let state = if stream {
            final_event(body)
        } else {
            read(body).state
        };
        let State::Final(usage) = state else {
            return None;
        };
        let sink = {
            let mut inner = self.inner.lock();
            let sink = inner.sinks.remove(id)?;
            if let Some(at) = inner.order.iter().position(|k| &**k == id) {
                inner.order.remove(at);
            }
            sink
        };
        let usage = usage?.bounded(&sink.target, sink.max_output);
        // The request was counted when it was answered: this is its usage, not another one.
        Some((usage, sink.record_unserved(usage)))
    }

    /// How many background responses wait for their usage.
    pub fn len(&self) -> usize {
        self.inner.lock().sinks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The id of the background response a relayed stream's first event starts (its
/// `response.created`, the response `queued` or `in_progress` with `background: true`).
pub fn started(ev: &crate::sse::SseEvent) -> Option<String> {
    // Every relayed stream starts so: the walk is left to those that name background mode.
    if !ev.data.contains("\"background\"")
        || crate::api::openai_responses::event_type(ev).as_deref() != Some("response.created")
    {
        return None;
    }
    let data = ev.data.as_bytes();
    match read(&data[splice::value_near_end(data, "response")?]) {
        Read {
            id,
            state: State::Running,
            background: true,
        } => id,
        _ => None,
    }
}

/// What a response object says of itself.
struct Read {
    id: Option<String>,
    state: State,
    background: bool,
}

/// A response object's `id`, state and background mode, read in one walk over its top-level
/// members (nested values are skipped unparsed); with duplicate keys, the last one.
fn read(body: &[u8]) -> Read {
    let spans = splice::top_level_value_spans(body, ["id", "status", "usage", "background"]);
    let Some([id, status, usage, background]) = spans else {
        return Read {
            id: None,
            state: State::Unknown,
            background: false,
        };
    };
    let text = |span: Option<std::ops::Range<usize>>| {
        span.and_then(|s| {
            serde_json::from_slice::<Option<String>>(&body[s])
                .ok()
                .flatten()
        })
    };
    let state = match text(status).as_deref() {
        Some("queued" | "in_progress") => State::Running,
        Some("completed" | "incomplete" | "failed" | "cancelled") => State::Final(
            usage.and_then(|s| crate::api::openai_responses::usage_of_member(&body[s])),
        ),
        _ => State::Unknown,
    };
    Read {
        id: text(id),
        state,
        background: background.is_some_and(|s| &body[s] == b"true"),
    }
}

/// The state of the response in the last event of a replayed stream that carries one in a
/// final state (`response.completed`, `.incomplete`, `.failed`; a cancelled one's last event).
fn final_event(body: &[u8]) -> State {
    let mut parser = SseParser::new();
    parser.push(body);
    parser.finish();
    let mut last = State::Unknown;
    while let Some(ev) = parser.next_event() {
        let data = ev.data.as_bytes();
        if let Some(span) = splice::value_near_end(data, "response")
            && let state @ State::Final(_) = read(&data[span]).state
        {
            last = state;
        }
        parser.recycle(ev);
    }
    last
}

#[cfg(test)]
mod tests;
