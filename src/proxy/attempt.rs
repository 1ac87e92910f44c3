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

use crate::config::ChainStep;
use crate::error::ProxyError;
use crate::policy::breaker::{Outcome, Ticket};
use crate::policy::retry::{self, Verdict};
use crate::proxy::body::{Accounting, Mode, TapBody};
use crate::proxy::chain::{Exec, Failure};
use crate::proxy::record::{InflightGuard, RequestRecord, UsageSink};
use crate::proxy::response::{self, ProxyBody};
use crate::proxy::upbody::UpstreamBody;
use crate::proxy::watch::SseWatch;
use crate::proxy::{Inbound, Proxy, Snapshot};
use crate::translate;
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
    // A step of another API is reached through translation (SPEC §10).
    let dir = translate::Dir::between(inb.endpoint.api, up.kind);
    let translating = dir.is_some();
    let upstream_path = inb.endpoint.upstream_path(up.kind);
    let path = match &inb.query {
        Some(q) => format!("{upstream_path}?{q}"),
        None => upstream_path.to_string(),
    };
    let req = match up.build_request(
        Method::POST,
        &path,
        &inb.headers,
        call.body.clone(),
        translating,
    ) {
        Ok(r) => r,
        Err(e) => return Attempt::Skip(e),
    };
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
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let (parts, incoming) = resp.into_parts();
    let api = inb.endpoint.api;
    let mut incoming = match dir {
        Some(dir) if status.is_success() && is_sse => {
            let tr = translate::StreamTranslator::new(dir, inb.meta.include_usage);
            UpstreamBody::translated(incoming, tr, up.kind)
        }
        _ => UpstreamBody::Plain(incoming),
    };

    if status.is_success() && is_sse {
        let mut watch = Box::new(SseWatch::new(api));
        let pre = read_to_commit(&mut incoming, &mut watch, up.idle_timeout, inb.deadline).await;
        exec.outside += sent.elapsed();
        return match pre {
            Ok(held) => {
                outcome("ok");
                if watch.saw_content {
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
                let (st, body) = api.dialect().error_event_response(&data);
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
        let whole = match (whole, dir) {
            (Whole::Complete(body), Some(dir)) => match translate::response(dir, &body) {
                Ok(b) => Whole::Complete(Bytes::from(b)),
                Err(e) => {
                    tracing::warn!(provider = %up.name, error = %e.0, "upstream answer not translatable");
                    Whole::Broken("the upstream answer could not be translated")
                }
            },
            (Whole::TooLarge(_), Some(_)) => {
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
                let usage = api.dialect().usage_of_body(&body);
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
            Whole::Broken(why) => {
                drop(inflight);
                outcome("retryable");
                ticket.report(Outcome::Failure);
                tracing::info!(provider = %up.name, reason = why, "response failed before it was complete");
                if Instant::now() >= inb.deadline {
                    return Attempt::Abort(ProxyError::DeadlineExceeded);
                }
                return Attempt::Retry {
                    failure: Failure::Error(ProxyError::UpstreamStreamBroken {
                        provider: up.name.clone(),
                    }),
                    wait: None,
                };
            }
        }
    }

    if !retry::needs_body(status) && !translating {
        // A final error passed on as it is, streamed through.
        let verdict = retry::classify(status, b"");
        let (label, o) = match verdict {
            Verdict::Success => ("ok", Outcome::Success),
            Verdict::Final {
                provider_fault: true,
            } => ("fatal", Outcome::Failure),
            _ => ("fatal", Outcome::Neutral),
        };
        outcome(label);
        ticket.report(o);
        exec.outside += sent.elapsed();
        let tap = Tapped {
            incoming,
            mode: Mode::json(),
            held: None,
            ticket: None,
            permit,
            inflight,
        };
        return Attempt::Answer(commit(&call, status, &parts.headers, tap, record));
    }

    // A possibly retryable status: read its small body to decide.
    let body = read_small(incoming, up.idle_timeout, inb.deadline).await;
    exec.outside += sent.elapsed();
    drop(inflight);
    drop(permit);
    let verdict = retry::classify(status, &body);
    let wait = retry::retry_after(&parts.headers, std::time::SystemTime::now());
    let resp = if let Some(dir) = dir {
        let (st, b) = translate::error(dir, status.as_u16(), &body);
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
        price: call.snap.cfg.prices.get(&call.step.target()).copied(),
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
    let is_sse = matches!(tap.mode, Mode::Sse(_));
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
            ProxyBody::Tap(Box::new(TapBody::new(
                tap.incoming,
                inb.endpoint.api,
                tap.mode,
                tap.held,
                up.idle_timeout,
                proxy.abort_streams.clone().cancelled_owned(),
                acct,
                Some(tap.permit),
            )))
        }
        // Cannot happen (the record is taken once); answer without accounting rather than fail.
        None => {
            drop(tap.inflight);
            ProxyBody::full(Bytes::new())
        }
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    response::copy_upstream_headers(upstream_headers, resp.headers_mut(), is_sse);
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
    let mut resp = Response::new(ProxyBody::full(body));
    *resp.status_mut() = status;
    response::copy_upstream_headers(upstream_headers, resp.headers_mut(), true);
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

/// A whole success body larger than this is streamed through instead of held.
const WHOLE_BODY_LIMIT: usize = 16 << 20;

enum Whole {
    Complete(Bytes),
    /// Larger than `WHOLE_BODY_LIMIT`: what was read so far; the rest follows.
    TooLarge(Bytes),
    Broken(&'static str),
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
