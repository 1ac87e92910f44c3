//! The chain executor: the whole failure policy in one place. For each step of the model's
//! chain: ask its breaker, fit the body, and make up to `max_attempts` attempts — waiting the
//! upstream's retry-after or a jittered backoff between them, within the deadline and the retry
//! budget. Availability failures (retries spent on retryable errors, an open breaker, a
//! retry-after longer than `max_retry_after`, a timeout) move on to the next step; a final
//! answer (success, or a 4xx that another try would only repeat) is returned at once — a
//! fallback must never route around a refusal.

use std::time::Duration;

use http::Response;
use tokio::time::Instant;

use crate::config::{ApiKind, ChainStep};
use crate::error::ProxyError;
use crate::policy::breaker::{Admission, Ticket};
use crate::policy::retry::Backoff;
use crate::proxy::attempt::{self, Attempt};
use crate::proxy::record::RequestRecord;
use crate::proxy::response::{self, ProxyBody};
use crate::proxy::{Inbound, Proxy, Snapshot};
use crate::route;
use crate::translate;

/// What failed last, to be reported if no step can answer.
pub enum Failure {
    /// An upstream error response, read whole (small), returned as it is.
    Response(Response<ProxyBody>),
    /// No usable response (connection, timeout, broken stream).
    Error(ProxyError),
}

/// Running totals of one request's execution.
pub struct Exec {
    pub attempts: u32,
    /// Time spent waiting on upstreams and in backoff: not legate's overhead.
    pub outside: Duration,
    last: Option<Failure>,
    any_admitted: bool,
    earliest_probe: Option<Instant>,
}

enum StepEnd {
    Answer(Response<ProxyBody>),
    Unavailable,
}

/// What the executor reports besides the response, for the headers of any answer.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExecStats {
    /// Time spent waiting on upstreams and in backoff: subtracted to report legate's overhead.
    pub outside: Duration,
    pub attempts: u32,
}

/// Runs the chain for one request.
pub(super) async fn run(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: Inbound,
    record: &mut Option<RequestRecord>,
    stats: &mut ExecStats,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut exec = Exec {
        attempts: 0,
        outside: Duration::ZERO,
        last: None,
        any_admitted: false,
        earliest_probe: None,
    };
    let result = execute(proxy, snap, inb, record, &mut exec).await;
    stats.outside = exec.outside;
    stats.attempts = exec.attempts;
    result
}

async fn execute(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: Inbound,
    record: &mut Option<RequestRecord>,
    exec: &mut Exec,
) -> Result<Response<ProxyBody>, ProxyError> {
    let resolved = route::resolve(&snap.cfg, inb.endpoint.api, &inb.meta.model)?;
    let fallback_off = inb
        .headers
        .get("x-legate-fallback")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"off"));
    let steps = if fallback_off {
        &resolved.steps[..1]
    } else {
        &resolved.steps[..]
    };
    let requested = snap.labels.model(&inb.meta.model);
    proxy.budget.deposit();
    for (i, step) in steps.iter().enumerate() {
        if i > 0 {
            let from = steps[i - 1].target();
            proxy
                .metrics
                .fallbacks
                .with_label_values(&[requested, &from, &step.target()])
                .inc();
            tracing::info!(from = %from, to = %step.target(), "falling back to the next chain step");
        }
        match run_step(proxy, snap, &inb, step, exec, record).await? {
            StepEnd::Answer(mut resp) => {
                response::set_header(&mut resp, "x-legate-attempts", &exec.attempts.to_string());
                return Ok(resp);
            }
            StepEnd::Unavailable => {}
        }
    }
    if !exec.any_admitted {
        let until = exec.earliest_probe.unwrap_or_else(Instant::now);
        return Err(ProxyError::AllBreakersOpen {
            retry_after: until.saturating_duration_since(Instant::now()),
        });
    }
    match exec.last.take() {
        Some(Failure::Response(mut resp)) => {
            response::set_header(&mut resp, "x-legate-attempts", &exec.attempts.to_string());
            Ok(resp)
        }
        Some(Failure::Error(e)) => Err(e),
        None => Err(ProxyError::Internal),
    }
}

/// The caller's body in the step's API, fitted to the step (model and max_tokens).
fn translated_body(
    proxy: &Proxy,
    inb: &Inbound,
    step: &ChainStep,
    upstream: ApiKind,
) -> Result<bytes::Bytes, String> {
    if inb.endpoint.op == crate::api::Operation::CountTokens {
        return Err("count_tokens is not translated between APIs".to_string());
    }
    let dir = translate::Dir::between(inb.endpoint.api, upstream)
        .ok_or_else(|| format!("no translation from {} to {upstream}", inb.endpoint.api))?;
    let (bytes, dropped) = translate::request(dir, &inb.body, &step.model).map_err(|e| e.0)?;
    let (from, to) = (inb.endpoint.api.as_str(), upstream.as_str());
    proxy
        .metrics
        .translated
        .with_label_values(&[from, to])
        .inc();
    for what in dropped {
        proxy
            .metrics
            .translation_drops
            .with_label_values(&[from, to, what])
            .inc();
    }
    let meta = upstream
        .dialect()
        .parse_request(&bytes)
        .map_err(|e| e.to_string())?;
    route::fit(&bytes::Bytes::from(bytes), &meta, step, upstream).map_err(|e| e.message())
}

async fn run_step(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: &Inbound,
    step: &ChainStep,
    exec: &mut Exec,
    record: &mut Option<RequestRecord>,
) -> Result<StepEnd, ProxyError> {
    let retry = &snap.cfg.retry;
    let up = snap
        .upstreams
        .get(&step.provider)
        .ok_or(ProxyError::Internal)?;
    let model_label = snap.labels.model(&step.model);
    let breaker = proxy.breakers.get(&step.provider, &step.model, model_label);
    let caller = inb.endpoint.api;
    let body = if up.kind == caller {
        route::fit(&inb.body, &inb.meta, step, caller)?
    } else {
        match translated_body(proxy, inb, step, up.kind) {
            Ok(b) => b,
            Err(why) => {
                // A step that cannot honour the request is not sent to: the next one may.
                tracing::info!(step = %step.target(), reason = %why, "request not translatable for this step");
                exec.any_admitted = true;
                if exec.last.is_none() {
                    exec.last = Some(Failure::Error(ProxyError::InvalidRequest {
                        message: format!(
                            "this request cannot be served by {} (another API): {why}",
                            step.target()
                        ),
                    }));
                }
                return Ok(StepEnd::Unavailable);
            }
        }
    };
    let mut backoff = Backoff::new(retry);
    for n in 1..=retry.max_attempts {
        let ticket = match breaker.as_ref().map(|b| b.admit()) {
            Some(Admission::Refused { until }) => {
                proxy
                    .metrics
                    .upstream_attempts
                    .with_label_values(&[&step.provider, model_label, "breaker_open"])
                    .inc();
                exec.earliest_probe = Some(exec.earliest_probe.map_or(until, |e| e.min(until)));
                return Ok(StepEnd::Unavailable);
            }
            Some(Admission::Pass(t)) => t,
            None => Ticket::unguarded(),
        };
        exec.any_admitted = true;
        if n > 1 {
            proxy
                .metrics
                .retries
                .with_label_values(&[&step.provider, model_label])
                .inc();
        }
        let call = attempt::Call {
            proxy,
            snap,
            up,
            step,
            model_label,
            inb,
            body: body.clone(),
        };
        match attempt::run(call, ticket, exec, record).await {
            Attempt::Answer(resp) => return Ok(StepEnd::Answer(resp)),
            Attempt::Abort(e) => return Err(e),
            Attempt::Skip(e) => {
                tracing::warn!(step = %step.target(), error = e.kind(), "chain step cannot be called; trying the next");
                exec.last = Some(Failure::Error(e));
                return Ok(StepEnd::Unavailable);
            }
            Attempt::Retry { failure, wait } => {
                exec.last = Some(failure);
                if n == retry.max_attempts {
                    break;
                }
                let delay = match wait {
                    // Waiting that long is worse than a substitute answering now.
                    Some(w) if w > retry.max_retry_after => break,
                    Some(w) => w,
                    None => backoff.next_delay(),
                };
                if Instant::now() + delay >= inb.deadline || !proxy.budget.try_withdraw() {
                    break;
                }
                tokio::time::sleep(delay).await;
                exec.outside += delay;
            }
        }
    }
    Ok(StepEnd::Unavailable)
}
