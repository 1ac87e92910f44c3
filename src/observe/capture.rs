//! Payload capture for the journal (`capture = "redacted"`): a bounded prefix of the request
//! and response bodies with every configured key, the caller's credential and anything shaped
//! like a bearer token or API key removed. And the response body wrapper that feeds it, keeps
//! the request's span entered while the body is polled (so late log lines carry the request
//! id), and reads the response id, model and finish reasons for traces.

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use regex::Regex;

use super::request::RequestObs;
use crate::config::observe::Capture;
use crate::proxy::body::BoxError;
use crate::proxy::{ProxyBody, Snapshot};

const REDACTED: &str = "[redacted]";

static BEARER: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}").ok());
static KEY_LIKE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\b(sk|rk|pk)-[A-Za-z0-9_-]{8,}").ok());
static KEY_FIELD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r#"(?i)"(x-api-key|api[_-]?key|authorization)"\s*:\s*"[^"]*""#).ok()
});

/// The secrets a capture must never contain.
#[derive(Debug, Clone, Default)]
pub struct Secrets(Arc<Vec<String>>);

impl Secrets {
    /// Configured provider keys (as loaded now) and the credential the caller presented.
    pub fn gather(provider_keys: Vec<String>, caller: &HeaderMap) -> Self {
        let mut all = provider_keys;
        if let Some(k) = caller.get("x-api-key").and_then(|v| v.to_str().ok()) {
            all.push(k.trim().to_string());
        }
        if let Some(v) = caller
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        {
            let v = v.trim();
            let token = v
                .get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map_or(v, |_| &v[7..]);
            all.push(token.trim().to_string());
        }
        // Short values would blank out ordinary words; keys are long.
        all.retain(|s| s.len() >= 8);
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        all.dedup();
        Secrets(Arc::new(all))
    }

    fn longest(&self) -> usize {
        self.0.first().map_or(0, String::len)
    }
}

/// Bytes read past the prefix so a secret straddling its end is still recognised and removed.
fn margin(secrets: &Secrets) -> usize {
    secrets.longest().max(256)
}

/// The first `limit` bytes of `body` as text, secrets removed.
pub fn redacted_prefix(body: &[u8], limit: usize, secrets: &Secrets) -> String {
    let window = &body[..body.len().min(limit + margin(secrets))];
    let mut text = String::from_utf8_lossy(window).into_owned();
    for s in secrets.0.iter() {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), REDACTED);
        }
    }
    if let Some(re) = BEARER.as_ref() {
        text = re.replace_all(&text, "${1}[redacted]").into_owned();
    }
    if let Some(re) = KEY_LIKE.as_ref() {
        text = re.replace_all(&text, REDACTED).into_owned();
    }
    if let Some(re) = KEY_FIELD.as_ref() {
        text = re.replace_all(&text, "\"$1\":\"[redacted]\"").into_owned();
    }
    if text.len() > limit || body.len() > window.len() {
        let mut cut = limit.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// With capture on: keeps the redacted prefix of a request body.
pub fn request_body(obs: &RequestObs, snap: &Snapshot, headers: &HeaderMap, body: &[u8]) {
    let j = &snap.cfg.observe.journal;
    if j.capture != Capture::Redacted || obs.observer().journal().capacity() == 0 {
        return;
    }
    let keys = snap
        .upstreams
        .values()
        .filter_map(|u| u.current_key())
        .map(|k| k.expose().to_string())
        .collect();
    let secrets = Secrets::gather(keys, headers);
    let text = redacted_prefix(body, j.capture_bytes, &secrets);
    obs.set_request_capture(secrets, text);
}

/// Wraps the response body when something must watch it: a capture, trace attributes read
/// from the answer, or a streamed body whose late log lines need the request's span.
pub fn wrap(
    resp: http::Response<ProxyBody>,
    obs: RequestObs,
    snap: &Snapshot,
) -> http::Response<ProxyBody> {
    let j = &snap.cfg.observe.journal;
    let capture = obs
        .secrets()
        .filter(|_| j.capture == Capture::Redacted)
        .map(|s| (j.capture_bytes, s.clone()));
    let streamed = matches!(resp.body(), ProxyBody::Tap(_));
    if capture.is_none() && !streamed && !obs.observer().tracing() {
        return resp;
    }
    resp.map(|b| ProxyBody::Observed(Box::new(ObservedBody::new(b, obs, capture))))
}

/// Reads the response id, model and finish reasons from the bytes as they pass.
#[derive(Default)]
struct Sniffer {
    tail: Vec<u8>,
    id: Option<String>,
    model: Option<String>,
    reasons: Vec<String>,
}

static FIELD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r#""(id|model|stop_reason|finish_reason)"\s*:\s*"([^"\\]{1,200})""#).ok()
});

impl Sniffer {
    fn feed(&mut self, data: &[u8]) {
        let Some(re) = FIELD.as_ref() else { return };
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(data);
        let text = String::from_utf8_lossy(&window);
        for c in re.captures_iter(&text) {
            let (Some(k), Some(v)) = (c.get(1), c.get(2)) else {
                continue;
            };
            let v = v.as_str().to_string();
            match k.as_str() {
                "id" if self.id.is_none() => self.id = Some(v),
                "model" if self.model.is_none() => self.model = Some(v),
                "stop_reason" | "finish_reason"
                    if !self.reasons.contains(&v) && self.reasons.len() < 8 =>
                {
                    self.reasons.push(v);
                }
                _ => {}
            }
        }
        // A field split between two chunks is found with the next one.
        let keep = window.len().min(256);
        self.tail = window[window.len() - keep..].to_vec();
    }
}

/// The response body as the caller receives it, observed.
pub struct ObservedBody {
    inner: ProxyBody,
    obs: RequestObs,
    capture: Option<(Vec<u8>, usize, Secrets)>,
    sniff: Option<Sniffer>,
}

impl ObservedBody {
    /// `capture`: the prefix length and the secrets to remove, when capture is on.
    pub fn new(inner: ProxyBody, obs: RequestObs, capture: Option<(usize, Secrets)>) -> Self {
        let sniff = obs.observer().tracing().then(Sniffer::default);
        ObservedBody {
            inner,
            obs,
            capture: capture.map(|(n, s)| (Vec::new(), n, s)),
            sniff,
        }
    }

    fn observe(&mut self, data: &Bytes) {
        if let Some((buf, limit, secrets)) = &mut self.capture {
            let room = (*limit + margin(secrets)).saturating_sub(buf.len());
            buf.extend_from_slice(&data[..data.len().min(room)]);
        }
        if let Some(s) = &mut self.sniff {
            s.feed(data);
        }
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        let _in = self.obs.span().clone().entered();
        // The inner body first: its accounting (a 499, the stream's end) happens in the span.
        drop(std::mem::replace(&mut self.inner, ProxyBody::Full(None)));
        if let Some((buf, limit, secrets)) = self.capture.take() {
            self.obs
                .set_response_capture(redacted_prefix(&buf, limit, &secrets));
        }
        if let Some(s) = self.sniff.take() {
            self.obs.update(|f| {
                f.response_id = s.id;
                f.response_model = s.model;
                f.finish_reasons = s.reasons;
            });
        }
    }
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let span = this.obs.span().clone();
        let _in = span.enter();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.observe(data);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_tokens_are_removed_even_across_the_prefix_end() {
        let key = "sk-ant-CANARY-provider-4f9a1c";
        let secrets = Secrets::gather(vec![key.to_string()], &HeaderMap::new());
        let body = format!(r#"{{"messages":[{{"content":"my key is {key} ok"}}]}}"#);
        let cut = body.find(key).unwrap() + 5;
        for limit in [cut, body.len()] {
            let out = redacted_prefix(body.as_bytes(), limit, &secrets);
            assert!(!out.contains("CANARY"), "{out}");
            assert!(!out.contains("4f9a1c"), "{out}");
        }
        let out = redacted_prefix(b"Authorization: Bearer abcdefghijklmnop", 100, &secrets);
        assert_eq!(out, "Authorization: Bearer [redacted]");
        let out = redacted_prefix(br#"{"api_key": "whatever-1"}"#, 100, &secrets);
        assert_eq!(out, r#"{"api_key":"[redacted]"}"#);
    }

    #[test]
    fn the_callers_credential_is_a_secret_too() {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            "Bearer client-secret-value".parse().unwrap(),
        );
        let s = Secrets::gather(vec![], &h);
        let out = redacted_prefix(b"echo client-secret-value", 100, &s);
        assert_eq!(out, "echo [redacted]");
    }

    #[test]
    fn long_bodies_are_cut_at_the_limit() {
        let out = redacted_prefix("é".repeat(100).as_bytes(), 11, &Secrets::default());
        assert_eq!(out, format!("{}…", "é".repeat(5)));
    }

    #[test]
    fn the_sniffer_reads_id_model_and_finish_reasons_across_chunks() {
        let mut s = Sniffer::default();
        s.feed(br#"data: {"type":"message_start","message":{"id":"msg_1","model":"claude-x"#);
        s.feed(br#""}}"#);
        s.feed(br#"data: {"delta":{"stop_reason":"end_turn"}}"#);
        assert_eq!(s.id.as_deref(), Some("msg_1"));
        assert_eq!(s.model.as_deref(), Some("claude-x"));
        assert_eq!(s.reasons, ["end_turn"]);
    }
}
