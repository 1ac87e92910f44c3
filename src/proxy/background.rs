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
//! commits once its `response.created` event names the response (`upread`: it exists at the
//! provider, and another attempt would start a second one), and is metered by its own final
//! event; one whose stream ended before that (the caller left, the connection broke) is
//! remembered the same way, by that event's id, and metered by the poll or the resumed
//! stream (`?stream=true`) that finds it final.
//!
//! The tenant's daily budget, charged the estimate when the request was answered, is put right
//! then too ([`Resettle`]); its tokens-per-minute bucket is not (that minute has passed).
//!
//! Bounded by count ([`MAX_UNSETTLED`]): past it, the oldest response of the tenant with the
//! most is forgotten (said in the log), so that one tenant's flood cannot push the others'
//! out; a forgotten one's estimate stands. Only ids a path can name are recorded. In this
//! process only, and not across a restart: a poll that another replica relays meters nothing
//! there.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::policy::ratelimit::Resettle;
use crate::proxy::record::UsageSink;
use crate::splice;
use crate::sse::SseParser;
use crate::usage::Usage;

/// Responses remembered: an id (at most [`crate::responses::owners::MAX_ID`] bytes), its
/// sink and budget handle (shared handles, the tenant's name and a price), a few hundred
/// bytes each, so at most about 2 MiB.
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

/// Where one response's usage goes.
struct Waiting {
    sink: UsageSink,
    budget: Option<Resettle>,
}

#[derive(Default)]
struct Inner {
    waiting: HashMap<Arc<str>, Waiting>,
    /// Oldest first.
    order: VecDeque<Arc<str>>,
    /// How many each tenant has waiting.
    per_tenant: HashMap<String, usize>,
}

impl Inner {
    fn take(&mut self, id: &str) -> Option<Waiting> {
        let w = self.waiting.remove(id)?;
        if let Some(at) = self.order.iter().position(|k| &**k == id) {
            self.order.remove(at);
        }
        let tenant: &str = &w.sink.tenant;
        if let Some(n) = self.per_tenant.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.per_tenant.remove(tenant);
            }
        }
        Some(w)
    }

    /// The oldest id of the tenant with the most waiting.
    fn evictable(&self) -> Option<Arc<str>> {
        let (busiest, _) = self.per_tenant.iter().max_by_key(|(_, n)| **n)?;
        self.order
            .iter()
            .find(|id| {
                self.waiting
                    .get(*id)
                    .is_some_and(|w| *w.sink.tenant == **busiest)
            })
            .cloned()
    }
}

#[derive(Default)]
pub struct Unsettled {
    /// Set by the first background response: until then a poll costs one atomic load here.
    any: AtomicBool,
    inner: Mutex<Inner>,
}

impl Unsettled {
    /// Background response `id`, still running when its request's answer ended without its
    /// usage: its usage goes to `sink` once it is final, and the tenant's budget is put right
    /// with `budget`. Returns whether it was remembered.
    pub fn expect(&self, id: &str, sink: UsageSink, budget: Option<Resettle>) -> bool {
        if !crate::responses::owners::recordable(id) {
            return false;
        }
        let id: Arc<str> = Arc::from(id);
        let mut inner = self.inner.lock();
        // The same id again (a provider that reissues one): the later request's.
        inner.take(&id);
        *inner.per_tenant.entry(sink.tenant.to_string()).or_default() += 1;
        inner.waiting.insert(id.clone(), Waiting { sink, budget });
        inner.order.push_back(id);
        while inner.waiting.len() > MAX_UNSETTLED {
            let Some(old) = inner.evictable() else { break };
            if let Some(w) = inner.take(&old) {
                // Not in the span of the request that pushed it out, whose id it would carry.
                tracing::info!(
                    parent: None,
                    id = %old,
                    tenant = %w.sink.tenant,
                    model = %w.sink.target,
                    "a background response's usage will not be metered: more than {MAX_UNSETTLED} wait for theirs"
                );
            }
        }
        self.any.store(true, Ordering::Release);
        true
    }

    /// Whether `id` is a background response whose usage is still to come.
    pub fn waits_for(&self, id: &str) -> bool {
        self.any.load(Ordering::Acquire) && self.inner.lock().waiting.contains_key(id)
    }

    /// The provider's answer to a poll or cancel of response `id` (`stream`: its events
    /// replayed, else the response's JSON): when it shows the response final, its usage is
    /// metered to the request that made it, the tenant's budget put right, and `id`
    /// forgotten. Returns the usage metered and its cost in pico-USD (None: nothing was; a
    /// final state without usage leaves the estimate standing).
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
        let w = self.inner.lock().take(id)?;
        let usage = usage?.bounded(&w.sink.target, w.sink.max_output);
        // The request was counted when it was answered: this is its usage, not another one.
        let cost = w.sink.record_unserved(usage);
        if let Some(b) = w.budget {
            b.settle(cost);
        }
        Some((usage, cost))
    }

    /// How many background responses wait for their usage.
    pub fn len(&self) -> usize {
        self.inner.lock().waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The id of a relayed whole answer that is a response still running (a background one),
/// whatever usage it shows (a running response's is not its final one).
pub fn running_id(body: &[u8]) -> Option<String> {
    match read(body) {
        Read {
            id,
            state: State::Running,
            ..
        } => id,
        _ => None,
    }
}

/// The id of the background response a relayed stream's start event names (its
/// `response.created`, the response `queued` or `in_progress` with `background: true`).
pub fn started(ev: &crate::sse::SseEvent) -> Option<String> {
    // Every relayed stream's start says whether it is in background mode, usually as
    // `"background":false`: one vectorised search spares those the walks below.
    let data = ev.data.as_bytes();
    let named = |needle: &[u8]| memchr::memmem::find(data, needle).is_some();
    if !(named(b"\"background\":true") || named(b"\"background\": true"))
        || crate::api::openai_responses::event_type(ev).as_deref() != Some("response.created")
    {
        return None;
    }
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
