//! The inbound side of a request, cheapest checks first: which endpoint it is (and so which API
//! shape its errors take), whether its target may be proxied at all, who the caller is, and
//! reading its body once under the size limit.

use std::borrow::Cow;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri, header};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::api::{ApiKind, Operation};
use crate::config::ClientEntry;
use crate::error::ProxyError;

// Looked up by name: a `&str` name is parsed and validated again on every lookup.
const ANTHROPIC_VERSION: http::HeaderName = http::HeaderName::from_static("anthropic-version");
const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// An endpoint of the data plane (SPEC §3): the API it speaks and what it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub api: ApiKind,
    pub op: Operation,
}

impl Endpoint {
    /// The upstream path of this operation on a provider of `upstream`'s API: the caller's own
    /// path for count_tokens and models, the API's generation path for a model call.
    pub fn upstream_path(self, upstream: ApiKind) -> &'static str {
        let own = self.api.dialect().upstream_path(self.op);
        match self.op {
            Operation::Generate => upstream.dialect().upstream_path(Operation::Generate),
            Operation::CountTokens
            | Operation::Models
            | Operation::Model
            | Operation::InputTokens
            | Operation::StoredResponse => own,
        }
        .unwrap_or("/")
    }
}

/// Normalises the path (a doubled `/v1/v1/` collapses; `/chat/completions` without `/v1` is
/// accepted, since SDK base URLs differ on whether they include it) and asks each dialect
/// whether it is one of its paths.
pub fn classify(method: &Method, path: &str) -> Option<Endpoint> {
    let mut p = path.trim_end_matches('/');
    while let Some(rest) = p.strip_prefix("/v1/v1/") {
        p = &p[p.len() - rest.len() - 4..];
    }
    let p = p.strip_prefix("/v1").unwrap_or(p);
    ApiKind::ALL.into_iter().find_map(|api| {
        let op = api.dialect().operation(method, p)?;
        Some(Endpoint { api, op })
    })
}

/// The model id of a `GET /v1/models/{id}` path, percent-decoded (an id may hold a `/`).
pub fn model_id(path: &str) -> Option<String> {
    let (_, raw) = path.split_once("/models/")?;
    let raw = raw.trim_end_matches('/');
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}

/// The API shape an error for an unknown path takes: Anthropic SDKs always send
/// `anthropic-version`, OpenAI SDKs never do.
pub fn shape_for_unknown(headers: &HeaderMap) -> ApiKind {
    if headers.contains_key(&ANTHROPIC_VERSION) {
        ApiKind::Anthropic
    } else {
        ApiKind::OpenAi
    }
}

/// Refuses what would make legate an open proxy or a DNS-rebinding target: absolute-form
/// targets, CONNECT, and (without `[[clients]]` keys to protect it) a Host that is not a
/// loopback name or the listen address.
pub fn check_target(
    method: &Method,
    version: http::Version,
    uri: &Uri,
    headers: &HeaderMap,
    listen_ip: std::net::IpAddr,
    has_clients: bool,
) -> Result<(), ProxyError> {
    // HTTP/2 always carries scheme and authority; in HTTP/1 they mean an absolute-form target,
    // i.e. a caller trying to use legate as a forward proxy.
    let absolute_form = version < http::Version::HTTP_2 && uri.scheme().is_some();
    if method == Method::CONNECT || absolute_form {
        return Err(ProxyError::ForbiddenTarget);
    }
    if has_clients {
        return Ok(());
    }
    // Each name the request gives must be this machine's: an HTTP/2 request may carry a
    // `host` line beside its `:authority`, and the two need not agree (RFC 9113 §8.3.1).
    let local = |name: Option<&[u8]>| {
        name.is_none_or(|n| std::str::from_utf8(n).is_ok_and(|n| host_is_local(n, listen_ip)))
    };
    let host = headers.get(header::HOST).map(http::HeaderValue::as_bytes);
    let authority = uri.authority().map(|a| a.as_str().as_bytes());
    if local(host) && local(authority) {
        Ok(())
    } else {
        Err(ProxyError::ForbiddenTarget)
    }
}

/// Whether `host` (a `Host` header or an authority) names this machine: a loopback name, or
/// the address legate listens on.
pub fn host_is_local(host: &str, listen_ip: std::net::IpAddr) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    if crate::loopback::is_loopback_host(name) {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip == listen_ip)
}

/// Refuses browser requests from web pages: the SDKs send no `Origin`, so one that is not a
/// loopback origin is a page in the developer's browser trying to spend the keys (SPEC §14).
pub fn check_origin(headers: &HeaderMap) -> Result<(), ProxyError> {
    for origin in headers.get_all(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(crate::loopback::is_loopback_origin);
        if !ok {
            return Err(ProxyError::ForbiddenOrigin);
        }
    }
    Ok(())
}

/// The caller's credentials as sent: `x-api-key` and/or `Authorization: Bearer` (SDK generations
/// differ; a caller may send both).
fn presented_keys(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    let api_key = headers.get(&X_API_KEY).map(|v| v.as_bytes());
    let bearer = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .and_then(|v| {
            if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
                Some(&v[7..])
            } else {
                None
            }
        });
    api_key.into_iter().chain(bearer)
}

/// Maps the caller to a tenant. Without `[[clients]]` everyone is `default` and keys are
/// ignored; with them, a presented key's SHA-256 must match one, compared in constant time
/// against every entry so timing does not reveal which.
pub fn authenticate(
    headers: &HeaderMap,
    clients: &[ClientEntry],
) -> Result<Cow<'static, str>, ProxyError> {
    if clients.is_empty() {
        return Ok(Cow::Borrowed(crate::route::DEFAULT_TENANT));
    }
    let mut found: Option<&str> = None;
    for key in presented_keys(headers) {
        let digest: [u8; 32] = Sha256::digest(key).into();
        for c in clients {
            if bool::from(c.key_sha256.ct_eq(&digest)) && found.is_none() {
                found = Some(&c.tenant);
            }
        }
    }
    found
        .map(crate::route::tenant_name)
        .ok_or(ProxyError::Unauthorized)
}

/// Why a body could not be read.
pub enum BodyError {
    TooLarge,
    /// The client went away (or sent a broken body) while legate was reading.
    Broken,
    /// The body did not arrive within `server.body_read_timeout`.
    TimedOut,
    /// Bodies being read already fill `server.max_buffered_bytes`.
    Full,
}

/// Reads the whole body once, within `timeout`, refusing early on a declared Content-Length
/// over the limit; its bytes count against `share` of the global buffer budget (up to
/// `max_buffered`), a declared length up front. Over HTTP/2 (`h2`) the rest of a refused body
/// is read and thrown away in the background, so the client sees the answer (see
/// [`crate::proxy::buffers::discard`]).
pub async fn read_body(
    headers: &HeaderMap,
    mut body: crate::server::CallerBody,
    h2: bool,
    (limit, timeout): (usize, std::time::Duration),
    share: &mut crate::proxy::buffers::BufferShare,
    max_buffered: usize,
    waited: &mut Option<tokio::time::Instant>,
) -> Result<Bytes, BodyError> {
    use crate::proxy::buffers::{Collect, collect, discard};
    let refuse = |body, why| {
        if h2 {
            discard(body, timeout);
        }
        Err(why)
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return refuse(body, BodyError::TooLarge);
    }
    // A declared length is taken at once: a crowd of large uploads is refused before their
    // bytes arrive, not once they fill memory.
    let declared = declared.and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
    if !share.take(declared, max_buffered) {
        return refuse(body, BodyError::Full);
    }
    // The limit starts when the read first waits: a body that came with its head is taken
    // without a timer or a clock read.
    let read = crate::proxy::within::within_noting(
        timeout,
        collect(&mut body, limit, share, max_buffered, !h2),
        waited,
    )
    .await;
    let Some(read) = read else {
        return Err(BodyError::TimedOut);
    };
    let body = match read {
        Ok(b) => b,
        Err(Collect::TooLarge) => return refuse(body, BodyError::TooLarge),
        Err(Collect::Full) => return refuse(body, BodyError::Full),
        Err(Collect::Broken) => return Err(BodyError::Broken),
    };
    // The body is held now: its real size replaces the declared one.
    share.shrink_to(body.len());
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const fn ep(api: ApiKind, op: Operation) -> Endpoint {
        Endpoint { api, op }
    }
    const MESSAGES: Endpoint = ep(ApiKind::Anthropic, Operation::Generate);
    const COUNT_TOKENS: Endpoint = ep(ApiKind::Anthropic, Operation::CountTokens);
    const MODELS: Endpoint = ep(ApiKind::Anthropic, Operation::Models);
    const CHAT: Endpoint = ep(ApiKind::OpenAi, Operation::Generate);

    #[test]
    fn paths_with_and_without_v1_and_doubled_v1_are_accepted() {
        let post = Method::POST;
        assert_eq!(classify(&post, "/v1/messages"), Some(MESSAGES));
        assert_eq!(classify(&post, "/v1/v1/messages"), Some(MESSAGES));
        assert_eq!(classify(&post, "/chat/completions"), Some(CHAT));
        assert_eq!(classify(&post, "/v1/chat/completions/"), Some(CHAT));
        assert_eq!(classify(&post, "/v1/v1/chat/completions"), Some(CHAT));
        assert_eq!(
            classify(&post, "/v1/messages/count_tokens"),
            Some(COUNT_TOKENS)
        );
        assert_eq!(classify(&Method::GET, "/v1/models"), Some(MODELS));
        assert_eq!(classify(&Method::GET, "/v1/messages"), None);
        assert_eq!(classify(&post, "/v1/embeddings"), None);
        assert_eq!(classify(&post, "/v2/messages"), None);
    }

    #[test]
    fn foreign_hosts_are_refused_without_clients() {
        let ip: std::net::IpAddr = [127, 0, 0, 1].into();
        let uri: Uri = "/v1/messages".parse().unwrap_or_default();
        let mut h = HeaderMap::new();
        for ok in ["127.0.0.1:8787", "localhost", "localhost:1", "[::1]:80"] {
            h.insert(header::HOST, HeaderValue::from_static(ok));
            assert!(
                check_target(&Method::POST, http::Version::HTTP_11, &uri, &h, ip, false).is_ok(),
                "{ok}"
            );
        }
        h.insert(header::HOST, HeaderValue::from_static("evil.example:8787"));
        assert!(check_target(&Method::POST, http::Version::HTTP_11, &uri, &h, ip, false).is_err());
        assert!(check_target(&Method::POST, http::Version::HTTP_11, &uri, &h, ip, true).is_ok());
        assert!(
            check_target(&Method::CONNECT, http::Version::HTTP_11, &uri, &h, ip, true).is_err()
        );
        let absolute: Uri = "http://evil.example/v1/messages"
            .parse()
            .unwrap_or_default();
        assert!(
            check_target(
                &Method::POST,
                http::Version::HTTP_11,
                &absolute,
                &h,
                ip,
                true
            )
            .is_err()
        );
    }

    /// An HTTP/2 request names its host twice when it sends `host` beside `:authority`: a
    /// foreign name in either is refused (the `host` line alone was looked at).
    #[test]
    fn a_foreign_authority_beside_a_local_host_is_refused() {
        let ip: std::net::IpAddr = [127, 0, 0, 1].into();
        let h2 = http::Version::HTTP_2;
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1"));
        let at = |authority: &str| -> Uri {
            format!("http://{authority}/v1/messages")
                .parse()
                .unwrap_or_default()
        };
        let check = |uri: &Uri, h: &HeaderMap| check_target(&Method::POST, h2, uri, h, ip, false);
        assert!(check(&at("evil.example"), &h).is_err());
        assert!(check(&at("localhost:8787"), &h).is_ok());
        assert!(check(&at("evil.example"), &HeaderMap::new()).is_err());
        assert!(check(&at("127.0.0.1"), &HeaderMap::new()).is_ok());
        // A host line that is not text names no local host either.
        let origin: Uri = "/v1/messages".parse().unwrap_or_default();
        h.insert(
            header::HOST,
            HeaderValue::from_bytes(b"\xffevil").unwrap_or(HeaderValue::from_static("x")),
        );
        assert!(
            check_target(
                &Method::POST,
                http::Version::HTTP_11,
                &origin,
                &h,
                ip,
                false
            )
            .is_err()
        );
    }

    #[test]
    fn either_credential_style_authenticates() {
        let key = b"team-a-key";
        let clients = vec![ClientEntry {
            tenant: "team-a".into(),
            key_sha256: Sha256::digest(key).into(),
        }];
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("team-a-key"));
        assert_eq!(authenticate(&h, &clients).ok().as_deref(), Some("team-a"));
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer team-a-key"),
        );
        assert_eq!(authenticate(&h, &clients).ok().as_deref(), Some("team-a"));
        h.insert("x-api-key", HeaderValue::from_static("wrong"));
        assert_eq!(authenticate(&h, &clients).ok().as_deref(), Some("team-a"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("wrong"));
        assert_eq!(authenticate(&h, &clients), Err(ProxyError::Unauthorized));
        assert_eq!(
            authenticate(&HeaderMap::new(), &[]).ok().as_deref(),
            Some("default")
        );
    }
}
