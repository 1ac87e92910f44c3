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
use crate::proxy::estimate;
use crate::proxy::inbound::Endpoint;
use crate::proxy::record::RequestRecord;
use crate::proxy::response::{self, ProxyBody};
use crate::proxy::responses::Xlate;
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
    /// The chain step being tried, from 1 (for the journal and traces).
    step_no: usize,
    /// `traceparent` for the attempt about to be sent (export on).
    pub traceparent: Option<http::HeaderValue>,
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
        step_no: 0,
        traceparent: None,
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
    let resolved = route::resolve(&snap.cfg, inb.endpoint.kind(), &inb.meta.model)?;
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
        exec.step_no = i + 1;
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

/// The caller's body in the step's API, fitted to the step (model and max_tokens, capped at
/// the model's output limit `limit`).
fn translated_body(
    proxy: &Proxy,
    inb: &Inbound,
    step: &ChainStep,
    up: &crate::upstream::Upstream,
    limit: Option<u64>,
) -> Result<bytes::Bytes, String> {
    let upstream = up.kind;
    let (bytes, dropped) = match (Xlate::for_step(inb.endpoint.api(), up), &inb.conversation) {
        (Xlate::Responses(target), Some(conv)) => {
            conv.request_for(target, &inb.body, &step.model)?
        }
        _ => {
            let dir = direction(inb.endpoint.kind());
            translate::request(dir, &inb.body, &step.model).map_err(|e| e.0)?
        }
    };
    let (from, to) = (inb.endpoint.label(), upstream.as_str());
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
    let meta = match upstream {
        ApiKind::Anthropic => crate::api::anthropic::parse_request(&bytes),
        ApiKind::OpenAi => crate::api::openai::parse_request(&bytes),
    }
    .map_err(|e| e.to_string())?;
    route::fit(&bytes::Bytes::from(bytes), &meta, step, upstream, limit).map_err(|e| e.message())
}

/// A step that cannot honour the request is not sent to: the next one may. If none can, the
/// caller learns why.
fn unfit(inb: &Inbound, exec: &mut Exec, step: &ChainStep, why: &str) -> StepEnd {
    tracing::info!(step = %step.target(), reason = %why, "request not translatable for this step");
    inb.obs.passed_over(exec.step_no, step, "unfit", why);
    exec.any_admitted = true;
    if exec.last.is_none() {
        exec.last = Some(Failure::Error(ProxyError::InvalidRequest {
            message: format!(
                "this request cannot be served by {} (another API): {why}",
                step.target()
            ),
        }));
    }
    StepEnd::Unavailable
}

/// The translation direction for a caller of `api` (the upstream speaks the other one).
pub fn direction(caller: ApiKind) -> translate::Dir {
    match caller {
        ApiKind::Anthropic => translate::Dir::AnthropicToOpenAi,
        ApiKind::OpenAi => translate::Dir::OpenAiToAnthropic,
    }
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
    let caller = inb.endpoint.kind();
    let translating = Xlate::for_step(inb.endpoint.api(), up).translating();
    // When legate chose the model (an alias, a fallback, a translated step), max_tokens is
    // capped at what that model accepts; a caller naming the model itself is sent as it asked.
    let limit = (translating || step.model != inb.meta.model)
        .then(|| crate::limits::max_output_tokens(&snap.cfg.limits, &step.model))
        .flatten();
    let body = if !translating {
        route::fit(&inb.body, &inb.meta, step, caller, limit)?
    } else if inb.endpoint == Endpoint::CountTokens {
        match estimate::answer(inb, step, up.kind).await {
            Ok(resp) => return Ok(StepEnd::Answer(resp)),
            Err(why) => return Ok(unfit(inb, exec, step, &why)),
        }
    } else {
        match translated_body(proxy, inb, step, up, limit) {
            Ok(b) => b,
            Err(why) => return Ok(unfit(inb, exec, step, &why)),
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
                inb.obs.passed_over(
                    exec.step_no,
                    step,
                    "breaker_open",
                    "the circuit breaker is open",
                );
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
        let server = snap
            .cfg
            .providers
            .get(&step.provider)
            .and_then(|p| p.base_url.parse::<http::Uri>().ok())
            .and_then(|u| u.host().map(str::to_string));
        let scope = inb.obs.begin_attempt(exec.step_no, step, up.kind, server);
        exec.traceparent = scope.traceparent();
        let sent_before = exec.attempts;
        let result = attempt::run(call, ticket, exec, record).await;
        scope.end(&result, exec.attempts > sent_before);
        match result {
            Attempt::Answer(resp) => return Ok(StepEnd::Answer(resp)),
            Attempt::Abort(e) => return Err(e),
            Attempt::Skip(e) => {
                tracing::warn!(step = %step.target(), error = e.kind(), "chain step cannot be called; trying the next");
                inb.obs
                    .moved_on("this step cannot be called; trying the next");
                exec.last = Some(Failure::Error(e));
                return Ok(StepEnd::Unavailable);
            }
            Attempt::Retry { failure, wait } => {
                exec.last = Some(failure);
                if n == retry.max_attempts {
                    inb.obs
                        .moved_on(format!("{n} attempts spent on retryable failures"));
                    break;
                }
                let delay = match wait {
                    // Waiting that long is worse than a substitute answering now.
                    Some(w) if w > retry.max_retry_after => {
                        inb.obs.moved_on(format!(
                            "retry-after {}s is longer than max_retry_after",
                            w.as_secs_f64().ceil()
                        ));
                        break;
                    }
                    Some(w) => w,
                    None => backoff.next_delay(),
                };
                if Instant::now() + delay >= inb.deadline {
                    inb.obs
                        .moved_on("the deadline leaves no time for another try");
                    break;
                }
                if !proxy.budget.try_withdraw() {
                    inb.obs.moved_on("the retry budget is spent");
                    break;
                }
                tokio::time::sleep(delay).await;
                exec.outside += delay;
            }
        }
    }
    Ok(StepEnd::Unavailable)
}
