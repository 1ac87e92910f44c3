//! Routing a parsed request to its upstream and making the call: the concurrency cap, the
//! first-byte timeout and deadline, and turning the upstream answer into the caller's response
//! (headers passed back, legate's headers added, the body handed to a `TapBody`).

use std::time::Instant;

use http::{Method, Response, header};

use crate::api::ApiShape;
use crate::error::ProxyError;
use crate::proxy::body::{Accounting, TapBody};
use crate::proxy::record::{RequestRecord, UsageSink};
use crate::proxy::response::{self, ProxyBody};
use crate::proxy::{Inbound, Proxy, Snapshot};
use crate::route;
use crate::upstream::Upstream;

pub(super) async fn run(
    proxy: &Proxy,
    snap: &Snapshot,
    inb: Inbound,
    rid: &str,
    record: &mut Option<RequestRecord>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let kind = inb.endpoint.kind();
    let resolved = route::resolve(&snap.cfg, kind, &inb.meta.model)?;
    let step = &resolved.step;
    let up = snap
        .upstreams
        .get(&step.provider)
        .ok_or(ProxyError::Internal)?;
    let body = route::fit(&inb.body, &inb.meta, step, kind)?;
    let path = match &inb.query {
        Some(q) => format!("{}?{q}", inb.endpoint.upstream_path()),
        None => inb.endpoint.upstream_path().to_string(),
    };
    let req = up.build_request(Method::POST, &path, &inb.headers, body)?;
    let model_label = snap.labels.model(&step.model).to_string();
    let started = record
        .as_ref()
        .map_or_else(Instant::now, RequestRecord::started);

    // max_concurrency: wait for a slot, but never past the request's deadline.
    let permit =
        match tokio::time::timeout_at(inb.deadline, up.permits.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(ProxyError::Internal),
            Err(_) => return Err(ProxyError::DeadlineExceeded),
        };

    let metrics = &proxy.metrics;
    let inflight = metrics.inflight.with_label_values(&[&up.name]);
    inflight.inc();
    let before_upstream = started.elapsed();
    let sent = Instant::now();
    let result = send(up, req, inb.deadline).await;
    let upstream_time = sent.elapsed();
    let headers_at = Instant::now();
    metrics
        .upstream_duration
        .with_label_values(&[&up.name, &model_label])
        .observe(upstream_time.as_secs_f64());
    let outcome = match &result {
        Ok(r) => outcome_for_status(r.status().as_u16()),
        Err(ProxyError::UpstreamTimeout { .. } | ProxyError::DeadlineExceeded) => "timeout",
        Err(_) => "connect_error",
    };
    metrics
        .upstream_attempts
        .with_label_values(&[&up.name, &model_label, outcome])
        .inc();
    let upstream = match result {
        Ok(r) => r,
        Err(e) => {
            inflight.dec();
            return Err(e);
        }
    };

    let status = upstream.status();
    let (parts, incoming) = upstream.into_parts();
    let is_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let Some(rec) = record.take() else {
        inflight.dec();
        return Err(ProxyError::Internal);
    };
    let acct = Accounting {
        sink: UsageSink {
            metrics: metrics.clone(),
            ledger: proxy.ledger.clone(),
            tenant: rec.tenant().to_string(),
            provider: up.name.clone(),
            model_label: model_label.clone(),
            target: step.target(),
            price: snap.cfg.prices.get(&step.target()).copied(),
        },
        ttft: metrics.ttft.with_label_values(&[&up.name, &model_label]),
        inflight,
        status: status.as_u16(),
        record: rec,
    };
    let api = inb.endpoint.api();
    let tap = TapBody::new(
        incoming,
        api,
        is_sse,
        up.idle_timeout,
        proxy.abort_streams.clone().cancelled_owned(),
        acct,
        Some(permit),
    );
    let mut resp = Response::new(ProxyBody::Tap(Box::new(tap)));
    *resp.status_mut() = status;
    response::copy_upstream_headers(&parts.headers, resp.headers_mut(), is_sse);
    response::set_header(&mut resp, "x-legate-served-by", &step.target());
    response::set_header(&mut resp, "x-legate-attempts", "1");
    if status.as_u16() >= 400 {
        // legate owns retries: the SDK must not multiply them.
        response::set_header(&mut resp, "x-should-retry", "false");
    }
    let overhead = before_upstream + headers_at.elapsed();
    response::set_header(
        &mut resp,
        "x-legate-overhead-ms",
        &format!("{:.3}", overhead.as_secs_f64() * 1000.0),
    );
    metrics
        .overhead
        .with_label_values(&[api_label(api)])
        .observe(overhead.as_secs_f64());
    tracing::debug!(request_id = %rid, served_by = %step.target(), status = status.as_u16(), "upstream answered");
    Ok(resp)
}

fn api_label(api: ApiShape) -> &'static str {
    match api {
        ApiShape::Anthropic => "anthropic",
        ApiShape::OpenAi => "openai",
    }
}

/// The metric outcome of an upstream status (SPEC §6 decides what is retryable).
fn outcome_for_status(status: u16) -> &'static str {
    match status {
        200..=399 => "ok",
        408 | 429 | 500 | 502 | 503 | 504 | 529 => "retryable",
        _ => "fatal",
    }
}

/// One upstream call up to its response headers, bounded by the first-byte timeout and the
/// request's deadline, whichever comes first.
async fn send(
    up: &Upstream,
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
    deadline: tokio::time::Instant,
) -> Result<Response<hyper::body::Incoming>, ProxyError> {
    let first_byte = tokio::time::Instant::now() + up.first_byte_timeout;
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
