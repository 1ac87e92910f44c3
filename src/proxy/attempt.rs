//! One upstream attempt: the concurrency slot, the call bounded by the first-byte timeout and
//! the deadline, and what its answer means — a response to commit (a success, or a final
//! error), or a failure worth another try. For event streams the preamble is held back until
//! the commit point (the first content event), so a stream that fails before it can still be
//! retried or fall back with the caller seeing one clean stream.

use std::time::{Duration, Instant as StdInstant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::api::ApiShape;
use crate::config::{ApiKind, ChainStep};
use crate::error::ProxyError;
use crate::policy::breaker::{Outcome, Ticket};
use crate::policy::retry::{self, Verdict};
use crate::proxy::body::{Accounting, Mode, TapBody};
use crate::proxy::chain::{Exec, Failure};
use crate::proxy::inbound::Endpoint;
use crate::proxy::record::{InflightGuard, RequestRecord, UsageSink};
use crate::proxy::response::{self, ProxyBody};
use crate::proxy::responses::{self, Xlate};
use crate::proxy::upbody::{Raw, UpstreamBody};
use crate::proxy::watch::SseWatch;
use crate::proxy::{Inbound, Proxy, Snapshot};
use crate::upstream::Upstream;

/// Error bodies read to classify a retryable status are small; larger ones are cut here.
const ERROR_BODY_LIMIT: usize = 1 << 20;
/// A preamble larger than this is forwarded without waiting for content (a misbehaving
/// upstream must not make legate buffer without bound).
const PREAMBLE_LIMIT: usize = 256 << 10;

pub enum Attempt {
    /// Commit this response to the caller.
    Answer(Response<ProxyBody>),
    /// Worth another try (or the next step); `wait` is the upstream's retry-after, if any.
    Retry {
        failure: Failure,
        wait: Option<Duration>,
    },
    /// Stop: nothing more can be tried (deadline, shed).
    Abort(ProxyError),
    /// This step cannot be called at all (no key for its provider): try the next one.
    Skip(ProxyError),
}

/// What one attempt needs.
pub struct Call<'a> {
    pub proxy: &'a Proxy,
    pub snap: &'a Snapshot,
    pub up: &'a Upstream,
    pub step: &'a ChainStep,
    pub model_label: &'a str,
    pub inb: &'a Inbound,
    pub body: Bytes,
}

pub async fn run(
    call: Call<'_>,
    ticket: Ticket,
    exec: &mut Exec,
    record: &mut Option<RequestRecord>,
) -> Attempt {
    let Call { proxy, up, inb, .. } = call;
    // A step of another API is reached through translation (SPEC §10, §11).
    let xl = Xlate::for_step(inb.endpoint.api(), up);
    let translating = xl.translating();
    let upstream_path = match inb.endpoint {
        Endpoint::CountTokens | Endpoint::Models | Endpoint::Model => inb.endpoint.upstream_path(),
        _ => xl.path(inb.endpoint, up.kind),
    };
    // The query string belongs to the caller's API (Anthropic's `?beta=true`): it reaches a
    // provider of that API only, never a translated request.
    let path = match &inb.query {
        Some(q) if !translating => format!("{upstream_path}?{q}"),
        _ => upstream_path.to_string(),
    };
    let built = match (&up.cloud, inb.endpoint) {
        (Some(_), Endpoint::CountTokens | Endpoint::Models) => Err(ProxyError::InvalidRequest {
            message: format!(
                "provider `{}` is a cloud platform that does not serve this endpoint",
                up.name
            ),
        }),
        // A credential that cannot be obtained fails before anything is sent: it counts
        // against neither the breaker nor the caller, and the next chain step may answer.
        (Some(cloud), _) => {
            up.build_cloud_request(
                cloud,
                (&call.step.model, inb.meta.stream),
                &inb.headers,
                call.body.clone(),
                translating,
            )
            .await
        }
        (None, _) => up.build_request(
            Method::POST,
            &path,
            &inb.headers,
            call.body.clone(),
            translating,
            true,
        ),
    };
    let req = match built {
        Ok(r) => r,
        Err(e) => return Attempt::Skip(e),
    };
    let mut req = req;
    if let Some(tp) = exec.traceparent.take() {
        // The attempt's span is the provider's parent (W3C Trace Context).
        req.headers_mut().insert("traceparent", tp);
    }
    let waited = Instant::now();
    // Pacing: when the provider's rate limit runs low, background and batch calls wait their
    // slot so that what is left lasts until the reset.
    if let Some(wait) = up
        .pacer
        .delay(inb.priority, call.snap.cfg.shedding.pace_below)
    {
        if Instant::now() + wait >= inb.deadline {
            return Attempt::Abort(ProxyError::DeadlineExceeded);
        }
        tokio::time::sleep(wait).await;
    }
    // max_concurrency: wait for a slot in priority order, but never past the deadline.
    let permit = match tokio::time::timeout_at(inb.deadline, up.gate.acquire(inb.priority)).await {
        Ok(Ok(p)) => p,
        Ok(Err(_)) => {
            return Attempt::Abort(ProxyError::Shed {
                retry_after: Duration::from_secs(1),
            });
        }
        Err(_) => return Attempt::Abort(ProxyError::DeadlineExceeded),
    };
    exec.outside += waited.elapsed();
    let metrics = &proxy.metrics;
    let outcome = |label: &str| {
        metrics
            .upstream_attempts
            .with_label_values(&[&up.name, call.model_label, label])
            .inc();
    };
    // Decremented on every path, a dropped future (the caller went away) included.
    let inflight = InflightGuard::new(metrics.inflight.with_label_values(&[&up.name]));
    // Counted here, once the request is really about to leave.
    exec.attempts += 1;
    let sent = Instant::now();
    let result = send(up, req, inb.deadline).await;
    metrics
        .upstream_duration
        .with_label_values(&[&up.name, call.model_label])
        .observe(sent.elapsed().as_secs_f64());
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            exec.outside += sent.elapsed();
            drop(inflight);
            let deadline = matches!(e, ProxyError::DeadlineExceeded);
            outcome(match e {
                ProxyError::UpstreamTimeout { .. } | ProxyError::DeadlineExceeded => "timeout",
                _ => "connect_error",
            });
            // The caller's own deadline running out says nothing about the provider.
            ticket.report(if deadline {
                Outcome::Neutral
            } else {
                Outcome::Failure
            });
            if deadline {
                return Attempt::Abort(e);
            }
            return Attempt::Retry {
                failure: Failure::Error(e),
                wait: None,
            };
        }
    };
    up.pacer.observe(resp.headers());
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim_start();
    // Bedrock's binary event stream is read as the SSE it carries from here on.
    let event_stream = status.is_success()
        && up.cloud.as_ref().is_some_and(|c| c.event_stream())
        && content_type.starts_with(crate::cloud::eventstream::CONTENT_TYPE);
    let is_sse = event_stream || content_type.starts_with("text/event-stream");
    let (mut parts, incoming) = resp.into_parts();
    let incoming = if event_stream {
        parts.headers.insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        parts.headers.remove(header::CONTENT_LENGTH);
        Raw::EventStream(Box::new(crate::cloud::eventstream::EventStreamSse::new(
            incoming,
        )))
    } else {
        Raw::Http(incoming)
    };
    let api = inb.endpoint.api();
    let max_event = call.snap.cfg.server.limits.max_event_bytes;
    let translator = (status.is_success() && is_sse)
        .then(|| responses::stream_translator(xl, inb, inb.meta.include_usage))
        .flatten();
    let mut incoming = match translator {
        Some(tr) => {
            let upstream_shape = match (up.kind, xl) {
                (ApiKind::Anthropic, _) => ApiShape::Anthropic,
                (ApiKind::OpenAi, Xlate::None) => api,
                (ApiKind::OpenAi, _) => ApiShape::OpenAi,
            };
            UpstreamBody::translated(incoming, tr, upstream_shape, max_event)
        }
        None => UpstreamBody::Plain(incoming),
    };

    if status.is_success() && is_sse {
        let mut watch = Box::new(SseWatch::new(api).with_max_event(max_event));
        let pre = read_to_commit(&mut incoming, &mut watch, up.idle_timeout, inb.deadline).await;
        exec.outside += sent.elapsed();
        return match pre {
            Ok(held) => {
                outcome("ok");
                if watch.saw_content {
                    if let Some(r) = record.as_ref() {
                        r.first_content();
                    }
                    let started = record
                        .as_ref()
                        .map_or_else(StdInstant::now, RequestRecord::started);
                    metrics
                        .ttft
                        .with_label_values(&[&up.name, call.model_label])
                        .observe(started.elapsed().as_secs_f64());
                }
                let tap = Tapped {
                    incoming,
                    mode: Mode::Sse(watch),
                    held: (!held.is_empty()).then_some(held),
                    ticket: Some(ticket.committed()),
                    permit,
                    inflight,
                };
                Attempt::Answer(commit(&call, status, &parts.headers, tap, record))
            }
            Err(PreCommit::ErrorEvent(data)) => {
                drop(inflight);
                // Nothing reached the caller: the event is judged like the status it stands
                // for (an invalid request is final and never falls back; a rate limit is
                // retried but is no provider failure).
                let (st, body) = error_event_response(api, &data);
                let verdict = retry::classify(st, &body);
                let resp = buffered(&call, st, &parts.headers, body);
                let fault = |f: bool| {
                    if f {
                        Outcome::Failure
                    } else {
                        Outcome::Neutral
                    }
                };
                match verdict {
                    Verdict::Retryable { provider_fault } => {
                        outcome("retryable");
                        ticket.report(fault(provider_fault));
                        if Instant::now() >= inb.deadline {
                            return Attempt::Abort(ProxyError::DeadlineExceeded);
                        }
                        Attempt::Retry {
                            failure: Failure::Response(resp),
                            wait: None,
                        }
                    }
                    Verdict::Final { provider_fault } => {
                        outcome("fatal");
                        ticket.report(fault(provider_fault));
                        Attempt::Answer(resp)
                    }
                    Verdict::Success => Attempt::Answer(resp),
                }
            }
            Err(PreCommit::Broken(why)) => {
                drop(inflight);
                outcome("retryable");
                ticket.report(Outcome::Failure);
                tracing::info!(provider = %up.name, reason = why, "stream failed before its first content");
                if Instant::now() >= inb.deadline {
                    return Attempt::Abort(ProxyError::DeadlineExceeded);
                }
                Attempt::Retry {
                    failure: Failure::Error(ProxyError::UpstreamStreamBroken {
                        provider: up.name.clone(),
                    }),
                    wait: None,
                }
            }
        };
    }

    if status.is_success() {
        // A whole answer is read before it is committed, so a cut mid-body is retried like
        // any other failure instead of reaching the caller as a broken response.
        let whole = read_whole(&mut incoming, up.idle_timeout, inb.deadline).await;
        exec.outside += sent.elapsed();
        // Translated: the caller's API shape, or an answer that cannot be carried across.
        let whole = match (whole, translating) {
            // A Responses passthrough answer is read too: it is kept in the store.
            (Whole::Complete(body), _) if translating || inb.conversation.is_some() => {
                match responses::translate_whole(xl, inb, &body) {
                    Ok(b) => Whole::Complete(b),
                    Err(e) => {
                        tracing::warn!(provider = %up.name, error = %e, "upstream answer not translatable");
                        Whole::Unusable(e)
                    }
                }
            }
            (Whole::TooLarge(_), true) => {
                Whole::Broken("the upstream answer is too large to translate")
            }
            (w, _) => w,
        };
        match whole {
            Whole::Complete(body) => {
                drop(inflight);
                drop(permit);
                outcome("ok");
                ticket.report(Outcome::Success);
                let usage = match api {
                    ApiShape::Anthropic => crate::usage::anthropic_from_json(&body),
                    ApiShape::OpenAi => crate::usage::openai_from_json(&body),
                    ApiShape::Responses => crate::api::responses::usage_from_json(&body),
                };
                if let Some(rec) = record.as_mut() {
                    match usage {
                        Some(u) => {
                            let cost = sink(&call, rec).record(u);
                            rec.settle(u, cost, &up.name);
                        }
                        None => rec.keep_reservation(),
                    }
                }
                return Attempt::Answer(buffered(&call, status, &parts.headers, body));
            }
            Whole::TooLarge(prefix) => {
                outcome("ok");
                ticket.report(Outcome::Success);
                let tap = Tapped {
                    incoming,
                    mode: Mode::Json {
                        buf: Vec::new(),
                        overflow: true,
                    },
                    held: Some(prefix),
                    ticket: None,
                    permit,
                    inflight,
                };
                return Attempt::Answer(commit(&call, status, &parts.headers, tap, record));
            }
            failed @ (Whole::Broken(_) | Whole::Unusable(_)) => {
                drop(inflight);
                outcome("retryable");
                ticket.report(Outcome::Failure);
                if Instant::now() >= inb.deadline {
                    return Attempt::Abort(ProxyError::DeadlineExceeded);
                }
                // The error names what happened: a cut body, or an answer that arrived whole
                // but cannot be carried to the caller.
                let error = match failed {
                    Whole::Unusable(reason) => ProxyError::UpstreamAnswerUnusable {
                        provider: up.name.clone(),
                        reason,
                    },
                    Whole::Broken(why) => {
                        tracing::info!(provider = %up.name, reason = why, "response failed before it was complete");
                        ProxyError::UpstreamStreamBroken {
                            provider: up.name.clone(),
                        }
                    }
                    Whole::Complete(_) | Whole::TooLarge(_) => ProxyError::Internal,
                };
                return Attempt::Retry {
                    failure: Failure::Error(error),
                    wait: None,
                };
            }
        }
    }

    // A platform's error answer is read whole to be put in the caller's shape.
    let platform_shape = up.cloud.as_ref().is_some_and(|c| c.maps_errors());
    if !retry::needs_body(status) && !translating && !platform_shape {
        // A final error passed on as it is: read whole (it is small) so that a key the
        // upstream echoes in it can be removed.
        let verdict = retry::classify(status, b"");
        let (label, o) = match verdict {
            Verdict::Success => ("ok", Outcome::Success),
            Verdict::Final {
                provider_fault: true,
            } => ("fatal", Outcome::Failure),
            _ => ("fatal", Outcome::Neutral),
        };
        let body = read_small(incoming, up.idle_timeout, inb.deadline).await;
        exec.outside += sent.elapsed();
        drop(inflight);
        drop(permit);
        outcome(label);
        ticket.report(o);
        let mut resp = buffered(&call, status, &parts.headers, body);
        // Passed on as it is: an HTML error page stays labelled as one.
        if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
            resp.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
        }
        return Attempt::Answer(resp);
    }

    // A possibly retryable status: read its small body to decide.
    let body = read_small(incoming, up.idle_timeout, inb.deadline).await;
    exec.outside += sent.elapsed();
    drop(inflight);
    drop(permit);
    let (status, body) = match up
        .cloud
        .as_ref()
        .and_then(|c| c.map_error(status, &parts.headers, &body))
    {
        Some(mapped) => mapped,
        None => (status, body),
    };
    let verdict = retry::classify(status, &body);
    let wait = retry::retry_after(&parts.headers, std::time::SystemTime::now());
    let resp = if translating {
        let (st, b) = responses::translate_error(xl, status.as_u16(), &body);
        let st = StatusCode::from_u16(st).unwrap_or(status);
        buffered(&call, st, &parts.headers, Bytes::from(b))
    } else {
        buffered(&call, status, &parts.headers, body)
    };
    match verdict {
        Verdict::Retryable { provider_fault } => {
            outcome("retryable");
            ticket.report(if provider_fault {
                Outcome::Failure
            } else {
                Outcome::Neutral
            });
            Attempt::Retry {
                failure: Failure::Response(resp),
                wait,
            }
        }
        Verdict::Final { provider_fault } => {
            outcome("fatal");
            ticket.report(if provider_fault {
                Outcome::Failure
            } else {
                Outcome::Neutral
            });
            Attempt::Answer(resp)
        }
        Verdict::Success => Attempt::Answer(resp),
    }
}

/// The parts of a response body that will be streamed through a `TapBody`.
struct Tapped {
    incoming: UpstreamBody,
    mode: Mode,
    held: Option<Bytes>,
    ticket: Option<Ticket>,
    permit: crate::policy::admission::Permit,
    inflight: InflightGuard,
}

fn sink(call: &Call<'_>, rec: &RequestRecord) -> UsageSink {
    UsageSink {
        metrics: call.proxy.metrics.clone(),
        ledger: call.proxy.ledger.clone(),
        tenant: rec.tenant().to_string(),
        provider: call.up.name.clone(),
        model_label: call.model_label.to_string(),
        target: call.step.target(),
        price: crate::meter::price_for(&call.snap.cfg.prices, &call.step.target()),
    }
}

/// Commits an upstream response to the caller: its headers passed back, legate's added, its
/// body streamed through a `TapBody` that owns the request's accounting from here on.
fn commit(
    call: &Call<'_>,
    status: StatusCode,
    upstream_headers: &HeaderMap,
    tap: Tapped,
    record: &mut Option<RequestRecord>,
) -> Response<ProxyBody> {
    let Call {
        proxy,
        up,
        model_label,
        inb,
        ..
    } = call;
    let redact = up.redactor();
    // Redaction may change the body's length: it is then sent without one.
    let is_sse = matches!(tap.mode, Mode::Sse(_));
    let keep_length = !is_sse && redact.is_none();
    let metrics = &proxy.metrics;
    let body = match record.take() {
        Some(rec) => {
            let acct = Accounting {
                sink: sink(call, &rec),
                ttft: metrics
                    .ttft
                    .with_label_values(&[up.name.as_str(), model_label]),
                inflight: tap.inflight,
                status: status.as_u16(),
                ticket: tap.ticket,
                record: rec,
            };
            ProxyBody::Tap(Box::new(
                TapBody::new(
                    tap.incoming,
                    inb.endpoint.api(),
                    tap.mode,
                    tap.held,
                    up.idle_timeout,
                    proxy.abort_streams.clone().cancelled_owned(),
                    acct,
                    Some(tap.permit),
                )
                .with_redactor(redact.clone()),
            ))
        }
        // Cannot happen (the record is taken once); answer without accounting rather than fail.
        None => {
            drop(tap.inflight);
            ProxyBody::full(Bytes::new())
        }
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    response::copy_upstream_headers(upstream_headers, resp.headers_mut(), !keep_length);
    if let Some(r) = redact {
        r.headers(resp.headers_mut());
    }
    finish_headers(&mut resp, call);
    resp
}

/// An upstream answer read whole: returned as it is, with legate's headers.
fn buffered(
    call: &Call<'_>,
    status: StatusCode,
    upstream_headers: &HeaderMap,
    body: Bytes,
) -> Response<ProxyBody> {
    // An upstream that echoes the key it was sent must not hand it to the caller.
    let redact = call.up.redactor();
    let body = match &redact {
        Some(r) => r.bytes(body),
        None => body,
    };
    let mut resp = Response::new(ProxyBody::full(body));
    *resp.status_mut() = status;
    response::copy_upstream_headers(upstream_headers, resp.headers_mut(), true);
    if let Some(r) = redact {
        r.headers(resp.headers_mut());
    }
    // The body may come from an error event of a stream: it is JSON, not an event stream.
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !is_json {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
    }
    finish_headers(&mut resp, call);
    resp
}

fn finish_headers(resp: &mut Response<ProxyBody>, call: &Call<'_>) {
    response::set_header(resp, "x-legate-served-by", &call.step.target());
    if resp.status().as_u16() >= 400 {
        // legate owns retries: the SDK must not multiply them.
        response::set_header(resp, "x-should-retry", "false");
    }
}

/// Why a stream failed before its commit point.
enum PreCommit {
    /// An error event (its data) arrived before any content.
    ErrorEvent(String),
    Broken(&'static str),
}

/// Reads a stream up to its commit point (the first content event, or its end), holding the
/// bytes back; each chunk must come within `idle` and all of it before the deadline.
async fn read_to_commit(
    incoming: &mut UpstreamBody,
    watch: &mut SseWatch,
    idle: Duration,
    deadline: Instant,
) -> Result<Bytes, PreCommit> {
    let mut held = BytesMut::new();
    loop {
        if let Some(d) = &watch.error_data {
            return Err(PreCommit::ErrorEvent(d.clone()));
        }
        if watch.oversize {
            return Err(PreCommit::Broken(
                "an event is larger than server.max_event_bytes",
            ));
        }
        if watch.saw_content || watch.saw_terminal || held.len() > PREAMBLE_LIMIT {
            return Ok(held.freeze());
        }
        let limit = (Instant::now() + idle).min(deadline);
        match tokio::time::timeout_at(limit, incoming.frame()).await {
            Err(_) => {
                return Err(PreCommit::Broken(
                    "no content within idle_timeout or the deadline",
                ));
            }
            Ok(Some(Err(_))) => return Err(PreCommit::Broken("the connection broke")),
            Ok(None) => {
                if let Some(rest) = watch.finish() {
                    held.extend_from_slice(&rest);
                }
                if let Some(d) = &watch.error_data {
                    return Err(PreCommit::ErrorEvent(d.clone()));
                }
                if watch.saw_terminal {
                    return Ok(held.freeze());
                }
                return Err(PreCommit::Broken(
                    "the stream ended before its first content",
                ));
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if let (Some(out), _) = watch.feed(data) {
                        held.extend_from_slice(&out);
                    }
                }
            }
        }
    }
}

/// An error event that arrived before any content becomes an ordinary error response: the
/// caller has seen nothing yet, so it gets the status the event stands for.
fn error_event_response(api: ApiShape, data: &str) -> (StatusCode, Bytes) {
    if api == ApiShape::Responses {
        return responses::error_event_response(data);
    }
    let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
    let kind = v["error"]["type"].as_str().unwrap_or("api_error");
    let status = match kind {
        "overloaded_error" => 529,
        "rate_limit_error" | "rate_limit_exceeded" => 429,
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "timeout_error" => 504,
        _ => 500,
    };
    let body = match api {
        ApiShape::Anthropic if v.get("type").is_some() => data.to_string(),
        ApiShape::Anthropic => {
            serde_json::json!({"type": "error", "error": v["error"]}).to_string()
        }
        ApiShape::OpenAi | ApiShape::Responses => {
            serde_json::json!({"error": v["error"]}).to_string()
        }
    };
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Bytes::from(body),
    )
}

/// A whole success body larger than this is streamed through instead of held.
const WHOLE_BODY_LIMIT: usize = 16 << 20;

enum Whole {
    Complete(Bytes),
    /// Larger than `WHOLE_BODY_LIMIT`: what was read so far; the rest follows.
    TooLarge(Bytes),
    Broken(&'static str),
    /// Complete, but not an answer that can reach the caller (translated: no choices, broken
    /// tool arguments).
    Unusable(String),
}

/// Reads a whole response body, each chunk within `idle`, all before the deadline.
async fn read_whole(incoming: &mut UpstreamBody, idle: Duration, deadline: Instant) -> Whole {
    let mut buf = BytesMut::new();
    loop {
        let limit = (Instant::now() + idle).min(deadline);
        match tokio::time::timeout_at(limit, incoming.frame()).await {
            Err(_) => return Whole::Broken("the body stalled past idle_timeout or the deadline"),
            Ok(Some(Err(_))) => return Whole::Broken("the connection broke mid-body"),
            Ok(None) => return Whole::Complete(buf.freeze()),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > WHOLE_BODY_LIMIT {
                        return Whole::TooLarge(buf.freeze());
                    }
                }
            }
        }
    }
}

/// Reads a small error body (bounded in size and time); a body that cannot be read is empty.
async fn read_small(incoming: UpstreamBody, idle: Duration, deadline: Instant) -> Bytes {
    let limit = (Instant::now() + idle).min(deadline);
    match tokio::time::timeout_at(limit, Limited::new(incoming, ERROR_BODY_LIMIT).collect()).await {
        Ok(Ok(c)) => c.to_bytes(),
        _ => Bytes::new(),
    }
}

/// One upstream call up to its response headers, bounded by the first-byte timeout and the
/// request's deadline, whichever comes first.
async fn send(
    up: &Upstream,
    req: http::Request<Full<Bytes>>,
    deadline: Instant,
) -> Result<Response<Incoming>, ProxyError> {
    let first_byte = Instant::now() + up.first_byte_timeout;
    let limit = first_byte.min(deadline);
    match tokio::time::timeout_at(limit, up.client().request(req)).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => {
            tracing::debug!(provider = %up.name, connect = e.is_connect(), error = %e, "upstream request failed");
            Err(ProxyError::UpstreamUnreachable {
                provider: up.name.clone(),
            })
        }
        Err(_) if deadline <= first_byte => Err(ProxyError::DeadlineExceeded),
        Err(_) => Err(ProxyError::UpstreamTimeout {
            provider: up.name.clone(),
        }),
    }
}
