//! The per-request handle: shared by the request's future, its accounting record, the chain
//! executor and the response body. The request is reported — access log, journal, spans —
//! when the last holder lets go, i.e. when the answer has been delivered or abandoned, so
//! facts learnt at the very end of a stream (its finish reason, the last bytes) are included.

use std::borrow::Cow;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use http::{HeaderMap, HeaderValue};

use super::Observer;
use super::facts::{AttemptFacts, Facts, TraceIds};
use super::journal::Entry;
use super::traceparent;
use crate::config::{ApiKind, ChainStep};
use crate::error::ProxyError;
use crate::policy::judge::{Action, GiveUp};
use crate::proxy::exchange::Exchanged;

/// One request being observed. Cheap to clone.
#[derive(Clone)]
pub struct RequestObs(Arc<Inner>);

struct Inner {
    observer: Arc<Observer>,
    span: tracing::Span,
    /// The facts and, when capture is on, the redacted body prefixes, gathered in the journal
    /// entry they become: reporting hands the entry over instead of moving the facts (several
    /// hundred bytes) from struct to struct. Unshared until then, so updates never copy it.
    /// Taken when the request is reported.
    entry: Mutex<Option<Arc<Entry>>>,
    /// What captures must not contain (set when the request body is captured).
    secrets: std::sync::OnceLock<super::capture::Secrets>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _in = self.span.enter();
        let entry = self.entry.get_mut();
        if let Some(entry) = entry.take() {
            self.observer.report_entry(entry);
        }
    }
}

impl Inner {
    /// Writes the entry (not reported yet: only this handle holds it, so nothing is cloned).
    fn with(&self, f: impl FnOnce(&mut Entry)) {
        if let Some(e) = lock(&self.entry).as_mut() {
            f(Arc::make_mut(e));
        }
    }

    fn read<R>(&self, f: impl FnOnce(&Facts) -> R) -> Option<R> {
        lock(&self.entry).as_ref().map(|e| f(&e.facts))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

// Looked up by a name made once: a `&str` name is parsed, validated and lowered again on
// every lookup (about 450 instructions for this one, which most callers do not send).
const CLIENT_RETRY_COUNT: http::HeaderName =
    http::HeaderName::from_static("x-stainless-retry-count");

/// The caller's `x-stainless-retry-count` when it is above 0 (the SDK retrying by itself).
fn client_retry_count(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(&CLIENT_RETRY_COUNT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
}

/// Methods and paths nearly every request has: its facts borrow these instead of copying.
const METHODS: &[&str] = &["POST", "GET", "DELETE"];
const API_PATHS: &[&str] = &[
    "/v1/messages",
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/messages/count_tokens",
    "/v1/responses/input_tokens",
    "/v1/models",
];

/// The most of a method the record keeps (every standard method is shorter).
const MAX_METHOD: usize = 16;

/// `s` as one of `known`, borrowed, or else a copy.
fn borrowed_or_copied(s: &str, known: &[&'static str]) -> Cow<'static, str> {
    match known.iter().find(|k| **k == s) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(s.to_owned()),
    }
}

impl RequestObs {
    /// Starts observing a request: its span (every log line inside carries the request id),
    /// and, with export on, its trace identity continued from the caller's `traceparent`.
    pub fn start(
        observer: &Arc<Observer>,
        request_id: super::RequestId,
        api: &'static str,
        method: &http::Method,
        path: &str,
        headers: &HeaderMap,
        started: std::time::Instant,
    ) -> Self {
        let span = tracing::info_span!("request", request_id = %request_id);
        // Put into the entry as soon as they are made, and filled in there: filled in first
        // and moved in after, the facts (some 700 bytes) were copied twice per request, and
        // now are once (valgrind; the compiler still builds them on the stack first).
        let mut entry = Arc::new(Entry::new(Facts::new(
            request_id,
            api,
            // Bounded too: a method outside HTTP's own is any token the caller chose (ASCII).
            borrowed_or_copied(
                &method.as_str()[..method.as_str().len().min(MAX_METHOD)],
                METHODS,
            ),
            // Bounded: a path is caller-chosen. Cut at its 256th character and copied once
            // (collecting the characters grew the string a few times).
            match path.char_indices().nth(256) {
                Some((end, _)) => path[..end].to_string().into(),
                None => borrowed_or_copied(path, API_PATHS),
            },
            started,
        )));
        let facts = match Arc::get_mut(&mut entry) {
            Some(entry) => &mut entry.facts,
            None => unreachable!("a new Arc has one owner"),
        };
        facts.client_retry = client_retry_count(headers);
        if observer.tracing() {
            let parent = headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .and_then(traceparent::parse);
            let (trace_id, parent_span, sampled) = match parent {
                Some(p) => (p.trace_id, Some(p.span_id), p.sampled),
                None => (traceparent::new_trace_id(), None, true),
            };
            facts.trace = Some(TraceIds {
                trace_id,
                span_id: traceparent::new_span_id(),
                parent: parent_span,
                sampled,
            });
        }
        RequestObs(Arc::new(Inner {
            observer: observer.clone(),
            span,
            entry: Mutex::new(Some(entry)),
            secrets: std::sync::OnceLock::new(),
        }))
    }

    /// The caller's `x-stainless-retry-count` when above 0, as read at the start: the header
    /// is looked up once per request.
    pub fn client_retry(&self) -> Option<u64> {
        self.0.read(|f| f.client_retry).flatten()
    }

    pub fn span(&self) -> &tracing::Span {
        &self.0.span
    }

    pub fn observer(&self) -> &Arc<Observer> {
        &self.0.observer
    }

    /// Adds to what is known.
    pub fn update(&self, f: impl FnOnce(&mut Facts)) {
        self.0.with(|e| f(&mut e.facts));
    }

    /// The request's id, as its answer's `x-legate-request-id` names it (`None` only once
    /// the request's record is written and gone).
    pub fn request_id(&self) -> Option<super::RequestId> {
        self.0.read(|f| f.request_id)
    }

    pub fn request_started(&self) -> Instant {
        self.0.read(|f| f.started).unwrap_or_else(Instant::now)
    }

    pub(crate) fn secrets(&self) -> Option<&super::capture::Secrets> {
        self.0.secrets.get()
    }

    pub(crate) fn set_request_capture(&self, secrets: super::capture::Secrets, text: String) {
        let _ = self.0.secrets.set(secrets);
        self.0.with(|e| e.capture.0 = Some(text));
    }

    pub(crate) fn set_response_capture(&self, text: String) {
        self.0.with(|e| e.capture.1 = Some(text));
    }

    /// A chain step passed over without an upstream call (open breaker, not translatable).
    pub fn passed_over(&self, step_no: usize, step: &ChainStep, outcome: &'static str, why: &str) {
        let now = Instant::now();
        self.update(|f| {
            f.steps.push(AttemptFacts {
                step: step_no,
                called: step.clone(),
                provider_kind: "",
                server: None,
                started: now,
                started_wall: SystemTime::now(),
                duration: std::time::Duration::ZERO,
                status: None,
                outcome,
                why: Some(why.to_string()),
                span_id: None,
                sent: false,
            })
        });
    }

    /// Notes why the chain left the step of the last attempt.
    pub fn moved_on(&self, why: impl Into<String>) {
        let why = why.into();
        self.update(|f| {
            if let Some(a) = f.steps.last_mut() {
                a.why = Some(match a.why.take() {
                    Some(w) => format!("{w}; {why}"),
                    None => why,
                });
            }
        });
    }

    /// Starts one attempt at `step`, at `now`. Its `traceparent` (the attempt span as parent)
    /// is what the upstream request carries when export is on. Its wall-clock start is the
    /// request's, moved on by the monotonic time since: no second clock is read.
    pub fn begin_attempt(
        &self,
        (step_no, step): (usize, &ChainStep),
        kind: ApiKind,
        server: Option<Arc<str>>,
        now: Instant,
    ) -> AttemptScope {
        let (trace, wall) = self
            .0
            .read(|f| {
                let wall = f.started_wall + now.saturating_duration_since(f.started);
                (f.trace, wall)
            })
            .unwrap_or((None, SystemTime::UNIX_EPOCH));
        let span_id = trace.map(|_| traceparent::new_span_id());
        let header = trace.zip(span_id).and_then(|(t, s)| {
            HeaderValue::from_str(&traceparent::format(&t.trace_id, &s, t.sampled)).ok()
        });
        AttemptScope {
            obs: self.clone(),
            facts: Some(AttemptFacts {
                step: step_no,
                called: step.clone(),
                provider_kind: kind.as_str(),
                server,
                started: now,
                started_wall: wall,
                duration: std::time::Duration::ZERO,
                status: None,
                outcome: "aborted",
                why: None,
                span_id,
                sent: false,
            }),
            traceparent: header,
            ended: false,
        }
    }
}

/// An attempt in progress; `end` records how it went. One dropped without `end` (the request
/// cut short at shutdown's grace, or its caller gone) is recorded as `aborted`, so that the
/// journal lists every attempt `x-legate-attempts` counts.
pub struct AttemptScope {
    obs: RequestObs,
    /// Taken when the attempt is recorded, as the scope is dropped.
    facts: Option<AttemptFacts>,
    traceparent: Option<HeaderValue>,
    ended: bool,
}

impl AttemptScope {
    pub fn traceparent(&self) -> Option<HeaderValue> {
        self.traceparent.clone()
    }

    /// The request is leaving for the upstream.
    pub fn sending(&mut self) {
        if let Some(a) = self.facts.as_mut() {
            a.sent = true;
        }
    }

    /// Records the attempt's result; `sent` says whether a request left for the upstream.
    pub fn end(
        mut self,
        status: Option<u16>,
        outcome: &'static str,
        why: Option<String>,
        sent: bool,
        at: Instant,
    ) {
        if let Some(a) = self.facts.as_mut() {
            a.duration = at.saturating_duration_since(a.started);
            a.sent = sent;
            a.status = status;
            a.outcome = outcome;
            a.why = why;
        }
        self.ended = true;
    }
}

impl Drop for AttemptScope {
    fn drop(&mut self) {
        let Some(mut a) = self.facts.take() else {
            return;
        };
        if !self.ended {
            a.duration = a.started.elapsed();
            a.why = Some("cut short: the request ended before this attempt did".to_string());
        }
        self.obs.update(|f| {
            f.steps.push(a);
            // A request whose caller left is never stamped with its count (whether it left
            // during an attempt or in the wait before the next): its attempts are counted as
            // they end (stamping writes the same count again).
            let sent = f.steps.iter().filter(|s| s.sent).count();
            f.attempts = f.attempts.max(u32::try_from(sent).unwrap_or(u32::MAX));
        });
    }
}

/// What an exchange and the chain's action on it say, in the journal's words. Never message
/// text from upstream: only statuses and legate's own error kinds.
pub(crate) fn journal_attempt(
    exchanged: &Exchanged,
    action: &Action,
) -> (Option<u16>, &'static str, Option<String>) {
    let status = match exchanged {
        Exchanged::Whole(resp) | Exchanged::Error { resp, .. } => Some(resp.status().as_u16()),
        Exchanged::Stream(p) | Exchanged::WholeStreamed(p) => Some(p.status.as_u16()),
        _ => None,
    };
    match action {
        Action::Commit => match status {
            Some(s) if s >= 400 => {
                let why = format!(
                    "status {s}: a final answer, returned as it is (no retry, no fallback)"
                );
                (Some(s), "fatal", Some(why))
            }
            s => (s, "ok", None),
        },
        Action::GiveUp(GiveUp::Deadline) => (
            None,
            "aborted",
            Some(ProxyError::DeadlineExceeded.kind().to_string()),
        ),
        Action::GiveUp(GiveUp::Shed) => match exchanged {
            // The provider answered (the attempt counts as `ok`, as in the metric); legate
            // could not hold the answer, and the caller is told so.
            Exchanged::Unheld { status, error } => {
                (Some(*status), "ok", Some(error.kind().to_string()))
            }
            _ => (None, "aborted", Some("shed".to_string())),
        },
        Action::NextStep | Action::Retry { .. } => match exchanged {
            Exchanged::Unsendable(e) => (None, "skipped", Some(e.kind().to_string())),
            Exchanged::TimedOut(e) | Exchanged::Unreachable(e) | Exchanged::Broken(e) => {
                (None, error_outcome(e), Some(e.kind().to_string()))
            }
            Exchanged::Deadline { .. } => (
                None,
                "timeout",
                Some(ProxyError::DeadlineExceeded.kind().to_string()),
            ),
            _ => match status {
                Some(s) => (Some(s), "retryable", Some(format!("status {s}"))),
                None => (None, "retryable", None),
            },
        },
    }
}

fn error_outcome(e: &ProxyError) -> &'static str {
    match e {
        ProxyError::UpstreamTimeout { .. } | ProxyError::DeadlineExceeded => "timeout",
        ProxyError::UpstreamUnreachable { .. } => "connect_error",
        _ => "retryable",
    }
}
