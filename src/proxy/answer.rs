//! Turning an upstream answer into the caller's response: its status and headers passed
//! back (legate's `x-legate-served-by` stamped here, once), and either a body read whole or the
//! upstream body streamed through a `TapBody` that owns the request's accounting from then on.
//! Either way the provider's key is removed wherever the upstream echoes it (SPEC §14).
//! The exchange prepares these; the chain executor decides which one is committed.

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode, header};

use crate::api::ApiKind;
use crate::policy::admission::Permit;
use crate::policy::breaker::Ticket;
use crate::proxy::body::{Accounting, Mode, TapBody};
use crate::proxy::exchange::Call;
use crate::proxy::record::{InflightGuard, RequestRecord, UsageSink};
use crate::proxy::response::{self, ProxyBody};
use crate::proxy::upbody::UpstreamBody;

/// An upstream answer whose body is still to come: committed, it streams through a
/// `TapBody`; dropped, it cancels the upstream request.
pub(crate) struct Pending {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) incoming: UpstreamBody,
    pub(crate) mode: Mode,
    /// Bytes already read (a stream's preamble and first content, a large body's start).
    pub(crate) held: Option<Bytes>,
    pub(crate) permit: Permit,
    pub(crate) inflight: InflightGuard,
}

/// The most output a request's answer is counted for: its `max_tokens`, times the 128
/// choices a Chat Completions caller may ask for (`n`, passed through to an OpenAI provider,
/// whose `completion_tokens` counts every choice's); None when it named no `max_tokens`.
pub(crate) fn output_bound(inb: &crate::proxy::Inbound) -> Option<u64> {
    const MOST_CHOICES: u64 = 128;
    inb.meta.max_tokens.map(|m| match inb.endpoint.api {
        ApiKind::OpenAi => m.saturating_mul(MOST_CHOICES),
        ApiKind::Anthropic | ApiKind::Responses => m,
    })
}

pub(crate) fn sink(call: &Call<'_>, rec: &RequestRecord) -> UsageSink {
    let metrics = &call.proxy.metrics;
    let tenant = rec.tenant();
    UsageSink {
        series: metrics
            .series
            .usage(tenant, &call.up.name, call.model_label),
        step: call.series.clone(),
        metrics: metrics.clone(),
        ledger: call.proxy.ledger.clone(),
        tenant: crate::route::tenant_name(tenant),
        price: crate::meter::price_for(&call.snap.cfg.prices, call.step.target()),
        target: call.step.shared_target().clone(),
        named: if crate::names::labels_itself(call.model_label, call.step.model()) {
            crate::meter::Named::Configured
        } else {
            crate::meter::Named::Unknown
        },
        max_output: output_bound(call.inb),
        generation: call.inb.endpoint.op != crate::api::Operation::CountTokens,
    }
}

/// Commits a pending answer: its body streamed through a `TapBody` that takes over the
/// request's record and, for a stream, the breaker ticket (decided when the stream ends).
pub(crate) fn commit(
    call: &Call<'_>,
    tap: Pending,
    ticket: Option<Ticket>,
    record: &mut Option<RequestRecord>,
) -> Response<ProxyBody> {
    let status = tap.status;
    let Call { proxy, up, inb, .. } = call;
    let redact = up.redactor();
    // Redaction may change the body's length: it is then sent without one.
    let is_sse = matches!(tap.mode, Mode::Sse(_));
    let keep_length = !is_sse && redact.is_none();
    let metrics = &proxy.metrics;
    let body = match record.take() {
        Some(rec) => {
            let acct = Accounting {
                sink: sink(call, &rec),
                ttft: call.series.ttft(metrics).clone(),
                inflight: tap.inflight,
                status: status.as_u16(),
                ticket,
                record: rec,
            };
            ProxyBody::Tap(Box::new(
                TapBody::new(
                    tap.incoming,
                    inb.endpoint.api,
                    tap.mode,
                    tap.held,
                    up.idle_timeout,
                    proxy.abort_streams.clone(),
                    acct,
                    Some(tap.permit),
                )
                .with_deadline(inb.deadline)
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
    *resp.headers_mut() = response::for_caller(tap.headers, !keep_length);
    if let Some(r) = redact {
        r.headers(resp.headers_mut());
    }
    served_by(&mut resp, call);
    resp
}

/// An upstream answer read whole: returned as it is, with legate's headers.
pub(crate) fn buffered(
    call: &Call<'_>,
    status: StatusCode,
    upstream_headers: HeaderMap,
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
    *resp.headers_mut() = response::for_caller(upstream_headers, true);
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
    served_by(&mut resp, call);
    resp
}

/// Whether a whole success body with `status` can be one of the APIs' answers: JSON whose
/// first token opens an object or an array (after JSON's whitespace, and a UTF-8 byte order
/// mark, which the SDKs' parsers skip too), or nothing with 204 or 205. Only that byte is
/// looked at: the caller parses the rest, as it would have without legate.
pub(crate) fn json_shaped(status: StatusCode, body: &[u8]) -> bool {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    match body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        None => matches!(status.as_u16(), 204 | 205),
        Some(b) => matches!(b, b'{' | b'['),
    }
}

/// Whether `body` is one whole JSON value (read to its end, nothing built).
pub(crate) fn json_whole(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// An answer's media type for a message: `text/html` from `text/html; charset=utf-8`, when it
/// reads as one (a registered top-level type, a short subtype of the characters media types
/// use); else a word saying what it is. A provider's header is not echoed as it came: one that
/// held a key-like token would otherwise reach the caller.
pub(crate) fn media_type(headers: &HeaderMap) -> &str {
    const TOP: &[&str] = &[
        "application",
        "audio",
        "font",
        "image",
        "message",
        "model",
        "multipart",
        "text",
        "video",
    ];
    let Some(v) = headers.get(header::CONTENT_TYPE) else {
        return "none";
    };
    let kind = v
        .as_bytes()
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default();
    let Ok(kind) = std::str::from_utf8(kind.trim_ascii()) else {
        return "unreadable";
    };
    let plain = kind.split_once('/').is_some_and(|(top, sub)| {
        TOP.iter().any(|t| top.eq_ignore_ascii_case(t))
            && (1..=40).contains(&sub.len())
            && sub
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".+-_".contains(&b))
    });
    if plain { kind } else { "unreadable" }
}

/// Who answered: the only legate header an upstream answer carries from here; the attempt
/// count and `x-should-retry` are stamped once, by `Proxy::handle`.
fn served_by(resp: &mut Response<ProxyBody>, call: &Call<'_>) {
    response::set_served_by(resp, call.step.target());
    let (caller, upstream) = (call.inb.endpoint.api, call.up.kind);
    let named = match (caller, upstream) {
        (ApiKind::Anthropic, ApiKind::OpenAi) => Some(("x-request-id", "request-id")),
        (ApiKind::OpenAi | ApiKind::Responses, ApiKind::Anthropic) => {
            Some(("request-id", "x-request-id"))
        }
        _ => None,
    };
    // Translated: each SDK reads the provider's request id under its own API's name
    // (`request-id`, `x-request-id`); the upstream's stays too.
    if let Some((theirs, ours)) = named {
        let headers = resp.headers_mut();
        if !headers.contains_key(ours)
            && let Some(id) = headers.get(theirs).cloned()
        {
            headers.insert(ours, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_or_nothing_is_an_answer() {
        let ok = StatusCode::OK;
        for good in [&b"{}"[..], b"\n {\"a\":1}", b"[1]", b"\xEF\xBB\xBF{}"] {
            assert!(json_shaped(ok, good), "{good:?}");
        }
        assert!(json_shaped(StatusCode::NO_CONTENT, b""));
        assert!(!json_shaped(ok, b""), "a 200 with nothing is no answer");
        assert!(!json_shaped(ok, b"  \r\n"));
        assert!(
            !json_shaped(ok, b"\x0c{}"),
            "a form feed is not JSON whitespace"
        );
        for bad in [
            &b"<html>"[..],
            b"\n<!DOCTYPE html>",
            b"Bad Gateway",
            b"null",
            b"\"x\"",
        ] {
            assert!(!json_shaped(ok, bad), "{bad:?}");
        }
    }

    #[test]
    fn a_media_type_is_named_only_when_it_reads_as_one() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, http::HeaderValue::from_static(v));
            h
        };
        assert_eq!(media_type(&HeaderMap::new()), "none");
        assert_eq!(media_type(&with("text/html; charset=utf-8")), "text/html");
        assert_eq!(
            media_type(&with("application/vnd.api+json")),
            "application/vnd.api+json"
        );
        assert_eq!(media_type(&with("sk-ant key=\"secret\"")), "unreadable");
        assert_eq!(media_type(&with("sk-abc123def")), "unreadable");
        assert_eq!(media_type(&with("sk-proj/abc123def")), "unreadable");
        assert_eq!(media_type(&with("")), "unreadable");
    }
}
