//! The per-request handle: shared by the request's future, its accounting record, the chain
//! executor and the response body. The request is reported — access log, journal, spans —
//! when the last holder lets go, i.e. when the answer has been delivered or abandoned, so
//! facts learnt at the very end of a stream (its finish reason, the last bytes) are included.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use http::{HeaderMap, HeaderValue};

use super::Observer;
use super::facts::{AttemptFacts, Facts, TraceIds};
use super::traceparent;
use crate::config::{ApiKind, ChainStep};
use crate::error::ProxyError;
use crate::policy::judge::{Action, GiveUp};
use crate::proxy::exchange::Exchanged;

// Looked up by name: a `&str` name is parsed and validated again on every lookup.
const CLIENT_RETRY_COUNT: http::HeaderName =
    http::HeaderName::from_static("x-stainless-retry-count");
const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// One request being observed. Cheap to clone.
#[derive(Clone)]
pub struct RequestObs(Arc<Inner>);

struct Inner {
    observer: Arc<Observer>,
    span: tracing::Span,
    facts: Mutex<Facts>,
    /// Redacted prefixes of the bodies, when capture is on.
    capture: Mutex<(Option<String>, Option<String>)>,
    /// What captures must not contain (set when the request body is captured).
    secrets: std::sync::OnceLock<super::capture::Secrets>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _in = self.span.enter();
        let facts = std::mem::replace(
            self.facts.get_mut().unwrap_or_else(|p| p.into_inner()),
            empty(),
        );
        let capture = std::mem::take(self.capture.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.observer.report(facts, capture);
    }
}

fn empty() -> Facts {
    Facts::new(String::new(), "", String::new(), String::new())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Facts are plain data: a panic elsewhere while holding the lock leaves them usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RequestObs {
    /// Starts observing a request: its span (every log line inside carries the request id),
    /// and, with export on, its trace identity continued from the caller's `traceparent`.
    pub fn start(
        observer: &Arc<Observer>,
        request_id: &str,
        api: &'static str,
        method: &http::Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Self {
        let span = tracing::info_span!("request", request_id = %request_id);
        let mut facts = Facts::new(
            request_id.to_string(),
            api,
            method.as_str().to_owned(),
            // Bounded: a path is caller-chosen. One of at most 256 bytes is copied whole
            // (collecting its characters one by one took hundreds of instructions).
            if path.len() <= 256 {
                path.to_owned()
            } else {
                path.chars().take(256).collect()
            },
        );
        facts.client_retry = headers
            .get(&CLIENT_RETRY_COUNT)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|n| *n > 0);
        if observer.tracing() {
            let parent = headers
                .get(&TRACEPARENT)
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
            facts: Mutex::new(facts),
            capture: Mutex::new((None, None)),
            secrets: std::sync::OnceLock::new(),
        }))
    }

    pub fn span(&self) -> &tracing::Span {
        &self.0.span
    }

    pub fn observer(&self) -> &Arc<Observer> {
        &self.0.observer
    }

    /// Adds to what is known.
    pub fn update(&self, f: impl FnOnce(&mut Facts)) {
        f(&mut lock(&self.0.facts));
    }

    pub fn request_started(&self) -> Instant {
        lock(&self.0.facts).started
    }

    pub(crate) fn secrets(&self) -> Option<&super::capture::Secrets> {
        self.0.secrets.get()
    }

    pub(crate) fn set_request_capture(&self, secrets: super::capture::Secrets, text: String) {
        let _ = self.0.secrets.set(secrets);
        lock(&self.0.capture).0 = Some(text);
    }

    pub(crate) fn set_response_capture(&self, text: String) {
        lock(&self.0.capture).1 = Some(text);
    }

    /// A chain step passed over without an upstream call (open breaker, not translatable).
    pub fn passed_over(&self, step_no: usize, step: &ChainStep, outcome: &'static str, why: &str) {
        let now = Instant::now();
        self.update(|f| {
            f.steps.push(AttemptFacts {
                step: step_no,
                target: step.target(),
                provider: step.provider.clone(),
                provider_kind: "",
                model: step.model.clone(),
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

    /// Starts one attempt at `step`. Its `traceparent` (the attempt span as parent) is what
    /// the upstream request carries when export is on.
    pub fn begin_attempt(
        &self,
        step_no: usize,
        step: &ChainStep,
        kind: ApiKind,
        server: Option<String>,
    ) -> AttemptScope {
        let trace = lock(&self.0.facts).trace;
        let span_id = trace.map(|_| traceparent::new_span_id());
        let header = trace.zip(span_id).and_then(|(t, s)| {
            HeaderValue::from_str(&traceparent::format(&t.trace_id, &s, t.sampled)).ok()
        });
        AttemptScope {
            obs: self.clone(),
            facts: AttemptFacts {
                step: step_no,
                target: step.target(),
                provider: step.provider.clone(),
                provider_kind: kind.as_str(),
                model: step.model.clone(),
                server,
                started: Instant::now(),
                started_wall: SystemTime::now(),
                duration: std::time::Duration::ZERO,
                status: None,
                outcome: "aborted",
                why: None,
                span_id,
                sent: false,
            },
            traceparent: header,
        }
    }
}

/// An attempt in progress; `end` records how it went.
pub struct AttemptScope {
    obs: RequestObs,
    facts: AttemptFacts,
    traceparent: Option<HeaderValue>,
}

impl AttemptScope {
    pub fn traceparent(&self) -> Option<HeaderValue> {
        self.traceparent.clone()
    }

    /// Records the attempt's result; `sent` says whether a request left for the upstream.
    pub fn end(
        mut self,
        status: Option<u16>,
        outcome: &'static str,
        why: Option<String>,
        sent: bool,
    ) {
        let a = &mut self.facts;
        a.duration = a.started.elapsed();
        a.sent = sent;
        a.status = status;
        a.outcome = outcome;
        a.why = why;
        let facts = self.facts;
        self.obs.update(|f| f.steps.push(facts));
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
        Action::GiveUp(GiveUp::Shed) => (None, "aborted", Some("shed".to_string())),
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
