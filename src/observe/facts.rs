//! What is known about one request once it is over: the access-log record (SPEC §12) and the
//! attempts behind it. Gathered while the request runs, rendered once at its end — as a log
//! line, a journal entry and spans — so the three always agree.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value, json};

use crate::config::ChainStep;
use crate::usage::Usage;

/// W3C trace identity of one request (only when export is on).
#[derive(Debug, Clone, Copy)]
pub struct TraceIds {
    pub trace_id: [u8; 16],
    /// The request span.
    pub span_id: [u8; 8],
    /// The caller's span, from its `traceparent`.
    pub parent: Option<[u8; 8]>,
    pub sampled: bool,
}

/// One chain step tried: an upstream call, or a step passed over without one.
#[derive(Debug, Clone)]
pub struct AttemptFacts {
    /// Chain step, from 1.
    pub step: usize,
    /// The step tried: its provider, model and `provider:model` (shared with the config or
    /// the request's route, not copied).
    pub called: ChainStep,
    /// `anthropic` or `openai`: the wire API of the step.
    pub provider_kind: &'static str,
    /// Host of the provider's base URL (the upstream's own, shared).
    pub server: Option<Arc<str>>,
    pub started: Instant,
    pub started_wall: SystemTime,
    pub duration: Duration,
    /// Upstream status, when a response came back.
    pub status: Option<u16>,
    /// ok, retryable, fatal, timeout, connect_error, breaker_open, unfit, skipped, aborted.
    pub outcome: &'static str,
    /// Why it failed, or why the chain moved on after it.
    pub why: Option<String>,
    /// The attempt's span (sent upstream in `traceparent`).
    pub span_id: Option<[u8; 8]>,
    /// Whether a request left for the upstream.
    pub sent: bool,
}

impl AttemptFacts {
    pub fn to_json(&self, request_started: Instant) -> Value {
        json!({
            "step": self.step,
            "target": self.called.target(),
            "sent": self.sent,
            "status": self.status,
            "outcome": self.outcome,
            "why": self.why,
            "offset_ms": ms(self.started.saturating_duration_since(request_started)),
            "duration_ms": ms(self.duration),
        })
    }
}

/// A request's attempts, in order. The first is kept inline: nearly every request makes
/// exactly one, and a list of its own was an allocation per request (and a free when the
/// journal let the entry go).
#[derive(Debug, Clone, Default)]
pub struct Steps {
    first: Option<AttemptFacts>,
    rest: Vec<AttemptFacts>,
}

impl Steps {
    pub fn push(&mut self, a: AttemptFacts) {
        match self.first {
            None => self.first = Some(a),
            Some(_) => self.rest.push(a),
        }
    }

    pub fn iter(
        &self,
    ) -> std::iter::Chain<std::option::Iter<'_, AttemptFacts>, std::slice::Iter<'_, AttemptFacts>>
    {
        self.first.iter().chain(&self.rest)
    }

    pub fn last(&self) -> Option<&AttemptFacts> {
        self.rest.last().or(self.first.as_ref())
    }

    pub fn last_mut(&mut self) -> Option<&mut AttemptFacts> {
        match self.rest.last_mut() {
            Some(a) => Some(a),
            None => self.first.as_mut(),
        }
    }

    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Drops the room a list grown by pushes keeps (an entry the journal holds).
    pub fn shrink_to_fit(&mut self) {
        self.rest.shrink_to_fit();
    }
}

impl<'a> IntoIterator for &'a Steps {
    type Item = &'a AttemptFacts;
    type IntoIter =
        std::iter::Chain<std::option::Iter<'a, AttemptFacts>, std::slice::Iter<'a, AttemptFacts>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Everything the access log line says, plus what the journal and traces add.
#[derive(Debug, Clone)]
pub struct Facts {
    /// Its numbers, not its text: nothing copied per request.
    pub request_id: super::RequestId,
    /// `default` is borrowed, not copied for every request.
    pub tenant: Cow<'static, str>,
    pub api: &'static str,
    /// The usual methods and API paths are borrowed, not copied for every request.
    pub method: Cow<'static, str>,
    pub path: Cow<'static, str>,
    /// As the caller sent it (the request's own parsed name, shared).
    pub model: Option<Arc<str>>,
    /// Its bounded metric label (the config's own name or pattern, shared; `None`: `other`).
    pub model_label: Option<Arc<str>>,
    pub max_tokens: Option<u64>,
    pub stream: bool,
    /// The step's own `provider:model`, shared.
    pub served_by: Option<Arc<str>>,
    pub attempts: u32,
    pub status: Option<u16>,
    pub error_type: Option<&'static str>,
    pub priority: Option<&'static str>,
    pub started: Instant,
    pub started_wall: SystemTime,
    pub duration: Option<Duration>,
    pub ttft: Option<Duration>,
    pub overhead: Option<Duration>,
    pub usage: Option<Usage>,
    pub cost_pico: Option<u128>,
    pub client_retry: Option<u64>,
    /// Estimated input tokens at admission minus those the provider reported.
    pub estimate_error: Option<i64>,
    pub steps: Steps,
    pub trace: Option<TraceIds>,
    /// Read from the answer as it passed (for traces).
    pub response_id: Option<String>,
    pub response_model: Option<String>,
    pub finish_reasons: Vec<String>,
}

impl Facts {
    pub fn new(
        request_id: super::RequestId,
        api: &'static str,
        method: Cow<'static, str>,
        path: Cow<'static, str>,
        started: Instant,
    ) -> Self {
        Facts {
            request_id,
            tenant: Cow::Borrowed(crate::route::DEFAULT_TENANT),
            api,
            method,
            path,
            model: None,
            model_label: None,
            max_tokens: None,
            stream: false,
            served_by: None,
            attempts: 0,
            status: None,
            error_type: None,
            priority: None,
            started,
            started_wall: SystemTime::now(),
            duration: None,
            ttft: None,
            overhead: None,
            usage: None,
            cost_pico: None,
            client_retry: None,
            estimate_error: None,
            steps: Steps::default(),
            trace: None,
            response_id: None,
            response_model: None,
            finish_reasons: Vec::new(),
        }
    }

    /// The final status (499 when the caller went away before it was known).
    pub fn status(&self) -> u16 {
        self.status.unwrap_or(crate::proxy::record::CLIENT_GONE)
    }

    /// `error_type` as logged: legate's own error kind, else what the status says. A 499 is
    /// the caller's leaving whatever legate made of it (a body cut off mid-upload is an
    /// unreadable body to the code that read it).
    pub fn error_type(&self) -> Option<&'static str> {
        match (self.error_type, self.status()) {
            (_, 499) => Some("client_gone"),
            (Some(e), _) => Some(e),
            (None, s) if s >= 400 => Some("upstream_error"),
            _ => None,
        }
    }

    /// The access-log record: every field of SPEC §12, in a fixed order, `null` when unknown.
    pub fn record(&self) -> Map<String, Value> {
        let u = self.usage;
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("request_id", json!(self.request_id.render()));
        put("tenant", json!(self.tenant));
        put("api", json!(self.api));
        put("method", json!(self.method));
        put("path", json!(self.path));
        put("model", json!(self.model.as_deref()));
        put("served_by", json!(self.served_by.as_deref()));
        put("attempts", json!(self.attempts));
        put("status", json!(self.status()));
        put("error_type", json!(self.error_type()));
        put("priority", json!(self.priority));
        put("duration_ms", json!(self.duration.map(ms)));
        put("ttft_ms", json!(self.ttft.map(ms)));
        put("overhead_ms", json!(self.overhead.map(ms)));
        put("input_tokens", json!(u.map(|u| u.input)));
        put("output_tokens", json!(u.map(|u| u.output)));
        put("cache_read_tokens", json!(u.map(|u| u.cache_read)));
        put("cache_write_tokens", json!(u.map(|u| u.cache_write)));
        // Exact integer; u128 exceeds what JSON readers take as a number, so a string past u64.
        put(
            "cost_pico_usd",
            match self.cost_pico {
                Some(c) => u64::try_from(c).map_or_else(|_| json!(c.to_string()), |c| json!(c)),
                None => Value::Null,
            },
        );
        put("client_retry", json!(self.client_retry));
        put("estimate_error", json!(self.estimate_error));
        if let Some(t) = &self.trace {
            put("trace_id", json!(hex::encode(t.trace_id)));
        }
        m
    }
}

/// Milliseconds with microsecond precision.
pub fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(step: usize) -> AttemptFacts {
        AttemptFacts {
            step,
            called: ChainStep::new("p", "m", None, false),
            provider_kind: "anthropic",
            server: None,
            started: Instant::now(),
            started_wall: SystemTime::now(),
            duration: Duration::ZERO,
            status: None,
            outcome: "ok",
            why: None,
            span_id: None,
            sent: true,
        }
    }

    #[test]
    fn steps_keep_their_order_with_the_first_inline() {
        let mut steps = Steps::default();
        assert!(steps.is_empty() && steps.last().is_none());
        steps.push(attempt(1));
        assert_eq!((steps.len(), steps.last().map(|a| a.step)), (1, Some(1)));
        assert!(steps.rest.capacity() == 0, "one attempt allocates nothing");
        steps.push(attempt(2));
        steps.push(attempt(3));
        if let Some(a) = steps.last_mut() {
            a.outcome = "retryable";
        }
        let seen: Vec<_> = steps.iter().map(|a| (a.step, a.outcome)).collect();
        assert_eq!(seen, [(1, "ok"), (2, "ok"), (3, "retryable")]);
        let back: Vec<_> = (&steps).into_iter().rev().map(|a| a.step).collect();
        assert_eq!(back, [3, 2, 1]);
        assert_eq!(steps.len(), 3);
    }

    /// A caller that left mid-upload is `client_gone`, though the body's reader called it
    /// an unreadable body; other errors keep legate's own kind.
    #[test]
    fn a_499_is_always_client_gone() {
        let mut f = Facts::new(
            super::super::RequestId::new(0, 1),
            "anthropic",
            Cow::Borrowed("POST"),
            Cow::Borrowed("/v1/messages"),
            Instant::now(),
        );
        f.error_type = Some("invalid_request");
        assert_eq!(f.error_type(), Some("client_gone"));
        f.status = Some(400);
        assert_eq!(f.error_type(), Some("invalid_request"));
        f.error_type = None;
        f.status = Some(502);
        assert_eq!(f.error_type(), Some("upstream_error"));
    }
}
