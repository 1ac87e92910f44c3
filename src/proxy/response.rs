//! The response body type of the data plane, and helpers that shape responses: legate's own
//! headers, and which upstream response headers pass back.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};

use crate::proxy::body::{BoxError, TapBody};

/// Either a body legate produced itself, or an upstream body passed through a `TapBody`.
pub enum ProxyBody {
    Full(Option<Bytes>),
    Tap(Box<TapBody>),
    /// Any of the above, observed for the journal and traces (`observe::capture`).
    Observed(Box<crate::observe::capture::ObservedBody>),
}

impl ProxyBody {
    pub fn full(b: Bytes) -> Self {
        ProxyBody::Full(Some(b))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Tap(t) => Pin::new(t.as_mut()).poll_frame(cx),
            ProxyBody::Observed(o) => Pin::new(o.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Tap(t) => t.is_end_stream(),
            ProxyBody::Observed(o) => o.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Tap(t) => t.size_hint(),
            ProxyBody::Observed(o) => o.size_hint(),
        }
    }
}

/// Response headers that describe one hop only and are never passed back.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The most headers legate itself adds to an upstream answer: `x-legate-served-by`,
/// `-attempts`, `-overhead-ms`, `-request-id`, `x-should-retry` and a `content-type`.
pub(crate) const OWN_HEADERS: usize = 6;

/// The caller's response headers made from the upstream's own map: its end-to-end headers
/// (request ids, retry-after, every rate-limit header including ones legate does not know
/// yet) stay, and the hop-by-hop ones go; so does `content-length` when the
/// body may change on the way (`drop_length`: an event stream, which legate may end with an
/// error event, or a body being redacted). Taking the map over instead of copying it into a new
/// one saves a map, a hash per header and a reference per value on every answer.
pub fn for_caller(mut upstream: HeaderMap, drop_length: bool) -> HeaderMap {
    // A whole answer of known length usually has none: a look at the names spares it eight
    // removals by hash.
    if upstream.keys().any(|n| HOP_BY_HOP.contains(&n.as_str())) {
        for name in connection_named(&upstream) {
            upstream.remove(name);
        }
        for name in HOP_BY_HOP {
            upstream.remove(*name);
        }
    }
    if drop_length {
        upstream.remove(http::header::CONTENT_LENGTH);
    }
    // Not reserved here: the map was parsed with room for legate's own headers
    // (`upstream::h1::head::parse`).
    upstream
}

/// Copies the upstream's end-to-end headers (request ids, retry-after, every rate-limit header
/// including ones legate does not know yet) into the response. `content-length` is kept only
/// for bodies passed through unchanged (not event streams, which legate may end with an error
/// event).
pub fn copy_upstream_headers(upstream: &HeaderMap, out: &mut HeaderMap, is_sse: bool) {
    // Room for legate's own headers too: a map that grows on the way rehashes everything.
    out.reserve(upstream.len() + OWN_HEADERS);
    let named = connection_named(upstream);
    for (name, value) in upstream {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || (is_sse && n == "content-length") || named.contains(name) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
}

/// The headers the upstream's `Connection` names as its own hop's (RFC 9110 §7.6.1), besides
/// the usual `keep-alive` and `close`: usually none, and then nothing is allocated.
fn connection_named(upstream: &HeaderMap) -> Vec<HeaderName> {
    upstream
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case(b"keep-alive")
                && !t.eq_ignore_ascii_case(b"close")
        })
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect()
}

/// Whether an upstream answer comes in a coding legate did not ask for: a `content-encoding`
/// other than `identity` (legate sends `accept-encoding: identity`), or a transfer coding other
/// than `chunked`. Such a body is opaque: its usage cannot be metered, nor the provider key
/// removed from it (SPEC §14), so it is not passed on.
pub fn opaque_coding(upstream: &HeaderMap) -> bool {
    let named = |name, allowed: &[u8]| {
        upstream.get_all(name).iter().any(|v| {
            v.as_bytes()
                .split(|b| *b == b',')
                .map(<[u8]>::trim_ascii)
                .any(|t| !t.is_empty() && !t.eq_ignore_ascii_case(allowed))
        })
    };
    named(http::header::CONTENT_ENCODING, b"identity")
        || named(http::header::TRANSFER_ENCODING, b"chunked")
}

/// The error for an answer in an [`opaque_coding`].
pub fn opaque_answer(provider: &str) -> crate::error::ProxyError {
    tracing::warn!(
        provider,
        "upstream answered in a content or transfer coding legate did not ask for: not passed on"
    );
    crate::error::ProxyError::UpstreamAnswerUnusable {
        provider: provider.to_owned(),
        reason: "it came compressed or in another coding legate did not ask for (it asks for identity), so legate can neither meter it nor clear the provider key from it".to_owned(),
    }
}

/// legate's own response headers, validated once at compile time instead of per request.
const X_LEGATE_ATTEMPTS: HeaderName = HeaderName::from_static("x-legate-attempts");
const X_LEGATE_OVERHEAD_MS: HeaderName = HeaderName::from_static("x-legate-overhead-ms");
const X_LEGATE_REQUEST_ID: HeaderName = HeaderName::from_static("x-legate-request-id");
pub(crate) const X_LEGATE_SERVED_BY: HeaderName = HeaderName::from_static("x-legate-served-by");
const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

pub fn set_header(resp: &mut Response<ProxyBody>, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        resp.headers_mut().insert(header_name(name), v);
    }
}

/// `x-legate-served-by: provider:model`. A target a header cannot hold as it is (a model name
/// the caller chose, with control characters) is written [`escaped`] rather than left out.
///
/// The value is the one this thread wrote last when it names the same target, shared instead
/// of copied and checked again, since one caller's requests go to the same step one after
/// another. An escaped one is never kept: it could not match its target.
pub fn set_served_by(resp: &mut Response<ProxyBody>, target: &str) {
    thread_local! {
        static LAST: std::cell::RefCell<Option<HeaderValue>> = const { std::cell::RefCell::new(None) };
    }
    let made = || {
        HeaderValue::from_str(target)
            .or_else(|_| HeaderValue::from_str(&escaped(target)))
            .ok()
    };
    let value = LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return made();
        };
        match &*last {
            Some(v) if v.as_bytes() == target.as_bytes() => Some(v.clone()),
            _ => {
                let v = made();
                // Only a target as long as a step's (its model a config's or a caller's name
                // within the default route's bound), written as it is, is kept.
                let as_is = v
                    .as_ref()
                    .is_some_and(|v| v.as_bytes() == target.as_bytes());
                if as_is && target.len() <= MAX_REMEMBERED_TARGET {
                    last.clone_from(&v);
                }
                v
            }
        }
    });
    if let Some(v) = value {
        resp.headers_mut().insert(X_LEGATE_SERVED_BY, v);
    }
}

/// The longest `x-legate-served-by` value [`set_served_by`] keeps between requests.
const MAX_REMEMBERED_TARGET: usize = 320;

/// `value` with every byte outside printable ASCII (and `%`) percent-encoded.
pub fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    for b in value.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `set_header` for a value built for it: its bytes become the header's, not a copy.
pub fn set_header_owned(resp: &mut Response<ProxyBody>, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        resp.headers_mut().insert(header_name(name), v);
    }
}

/// `x-legate-request-id`, legate's own id of the request.
pub fn set_request_id(resp: &mut Response<ProxyBody>, id: &crate::observe::RequestId) {
    if let Some(v) = id.header_value() {
        resp.headers_mut().insert(X_LEGATE_REQUEST_ID, v);
    }
}

/// A small count as a header value: 0 to 9 are static (no allocation), larger ones written.
pub fn set_count(resp: &mut Response<ProxyBody>, name: &'static str, n: u32) {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    let value = match DIGITS.get(n as usize) {
        Some(d) => Ok(HeaderValue::from_static(d)),
        None => HeaderValue::from_bytes(itoa::Buffer::new().format(n).as_bytes()),
    };
    if let Ok(v) = value {
        resp.headers_mut().insert(header_name(name), v);
    }
}

fn header_name(name: &'static str) -> HeaderName {
    match name {
        "x-legate-attempts" => X_LEGATE_ATTEMPTS,
        "x-legate-overhead-ms" => X_LEGATE_OVERHEAD_MS,
        "x-legate-request-id" => X_LEGATE_REQUEST_ID,
        "x-legate-served-by" => X_LEGATE_SERVED_BY,
        "x-should-retry" => X_SHOULD_RETRY,
        other => HeaderName::from_static(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(lines: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in lines {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<String> {
        h.iter()
            .map(|(n, v)| format!("{n}={}", v.to_str().unwrap()))
            .collect()
    }

    fn served_by(target: &str) -> HeaderValue {
        let mut resp = Response::new(ProxyBody::full(Bytes::new()));
        set_served_by(&mut resp, target);
        resp.headers()[X_LEGATE_SERVED_BY].clone()
    }

    /// Whether two values are views of the same bytes (the kept value shared, not remade).
    fn shared(a: &HeaderValue, b: &HeaderValue) -> bool {
        a.as_bytes().as_ptr() == b.as_bytes().as_ptr()
    }

    #[test]
    fn served_by_names_each_target_sharing_the_value_it_wrote_last() {
        let first = served_by("anthropic:claude-x");
        let again = served_by("anthropic:claude-x");
        assert_eq!(again, "anthropic:claude-x");
        assert!(shared(&again, &first));
        assert_eq!(served_by("openai:gpt-x"), "openai:gpt-x");
        let kept = served_by("anthropic:claude-x");
        // A target a header cannot hold is escaped, each time, and never kept.
        assert_eq!(served_by("openai:a\nb%"), "openai:a%0Ab%25");
        assert_eq!(served_by("openai:a\nb%"), "openai:a%0Ab%25");
        // Past the bound: still written, never kept.
        let long = format!("openai:{}", "m".repeat(MAX_REMEMBERED_TARGET));
        assert_eq!(served_by(&long).as_bytes(), long.as_bytes());
        let again = served_by("anthropic:claude-x");
        assert_eq!(again, "anthropic:claude-x");
        // The value kept before the escaped and the long target is still the one kept.
        assert!(shared(&again, &kept));
    }

    #[test]
    fn the_callers_headers_are_the_upstreams_without_hop_by_hop_ones() {
        let up = map(&[
            ("content-type", "application/json"),
            ("connection", "keep-alive"),
            ("request-id", "req_1"),
            ("keep-alive", "timeout=5"),
            ("x-ratelimit-remaining-requests", "9"),
            ("content-length", "17"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("transfer-encoding", "chunked"),
        ]);
        let kept = for_caller(up.clone(), false);
        // Removing moves a later header into the freed place: fields of different names may
        // change places (which HTTP ignores), those of one name keep their order.
        let mut all = names(&kept);
        all.sort();
        assert_eq!(
            all,
            [
                "content-length=17",
                "content-type=application/json",
                "request-id=req_1",
                "set-cookie=a=1",
                "set-cookie=b=2",
                "x-ratelimit-remaining-requests=9",
            ]
        );
        let cookies: Vec<_> = kept.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        let streamed = for_caller(up, true);
        assert!(streamed.get("content-length").is_none());
        assert_eq!(streamed.len(), 5);
        // What the upstream's `Connection` names is its hop's too.
        let named = map(&[
            ("connection", "X-Foo, keep-alive"),
            ("connection", "x-bar"),
            ("x-foo", "1"),
            ("x-bar", "2"),
            ("x-kept", "3"),
        ]);
        assert_eq!(names(&for_caller(named.clone(), false)), ["x-kept=3"]);
        let mut copied = HeaderMap::new();
        copy_upstream_headers(&named, &mut copied, true);
        assert_eq!(names(&copied), ["x-kept=3"]);
        // Nothing hop-by-hop: the map comes back as it was.
        let mut plain = HeaderMap::new();
        plain.insert("x-request-id", HeaderValue::from_static("r"));
        assert_eq!(names(&for_caller(plain, false)), ["x-request-id=r"]);
    }
}
