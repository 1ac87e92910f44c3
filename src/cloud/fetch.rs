//! The small HTTP calls that obtain credentials (STS, container endpoint, metadata server,
//! token endpoints): one pooled client, a bounded time and a bounded answer. Failures are
//! described by endpoint and status only — a token endpoint's body may echo what was sent.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Credential answers are a few kilobytes; anything larger is not one.
const ANSWER_LIMIT: usize = 64 << 10;
/// A credential endpoint that takes longer than this is treated as down.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub type FetchClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client for credential endpoints: public TLS roots, or plain HTTP for link-local and
/// loopback endpoints (the metadata server, the container endpoint, test fakes).
pub fn client() -> Result<FetchClient, String> {
    own_client(Duration::from_secs(5))
}

/// The HTTP/1 client for legate's own calls (credential endpoints, the telemetry collector):
/// public TLS roots, https or plain http, connecting within `connect_timeout`. Upstream calls
/// use their own client (`upstream`), whose roots and protocols are configured.
pub fn own_client(connect_timeout: Duration) -> Result<FetchClient, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS setup failed: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// Sends `req` and reads its answer; `what` names the endpoint in error messages.
pub async fn call(
    client: &FetchClient,
    req: Request<Full<Bytes>>,
    what: &str,
) -> Result<Bytes, String> {
    let send = async {
        let resp = client
            .request(req)
            .await
            .map_err(|_| format!("{what} could not be reached"))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), ANSWER_LIMIT)
            .collect()
            .await
            .map_err(|_| format!("{what} sent an unreadable answer"))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(format!("{what} answered {}", status.as_u16()));
        }
        Ok(body)
    };
    tokio::time::timeout(CALL_TIMEOUT, send)
        .await
        .map_err(|_| format!("{what} did not answer within {}s", CALL_TIMEOUT.as_secs()))?
}

/// `application/x-www-form-urlencoded` from pairs.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// An OAuth2 token answer (`access_token`, `expires_in`), as Google and Entra send it.
#[derive(serde::Deserialize)]
pub struct OAuthToken {
    pub access_token: String,
    #[serde(default)]
    pub expires_in: Option<u64>,
}

/// Parses an OAuth2 token answer into the token and its expiry.
pub fn oauth_token(
    body: &[u8],
    what: &str,
) -> Result<(String, Option<std::time::SystemTime>), String> {
    let t: OAuthToken = serde_json::from_slice(body).map_err(|_| {
        format!("{what} sent no token answer that can be read (an access_token, and an expires_in in whole seconds)")
    })?;
    if t.access_token.is_empty() {
        return Err(format!("{what} sent an empty access_token"));
    }
    // Any number of seconds may come; no credential is kept longer than `MAX_LIFE` anyway, and
    // the sum must not overflow. A token said to have no life at all is given the usual one:
    // kept as never expiring, it would be renewed only once the platform refused it.
    let life = t.expires_in.map_or(ASSUMED_TOKEN_LIFE, Duration::from_secs);
    let expiry = std::time::SystemTime::now() + life.min(super::cache::MAX_LIFE);
    Ok((t.access_token, Some(expiry)))
}

/// The life taken for an OAuth2 token whose answer gives none (RFC 6749 §5.1 makes
/// `expires_in` only recommended): an hour, the life Google and Entra give their tokens.
pub const ASSUMED_TOKEN_LIFE: Duration = Duration::from_secs(3600);

/// Reads a token file (a projected service-account token: re-read on every refresh, since the
/// kubelet rotates it).
pub async fn read_token_file(path: &std::path::Path, what: &str) -> Result<String, String> {
    let text = crate::config::read::bounded_text_async(path, crate::config::read::SMALL)
        .await
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))?;
    let t = text.trim();
    if t.is_empty() {
        return Err(format!("the {what} {} is empty", path.display()));
    }
    Ok(t.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// A token answer without `expires_in` is given the usual hour, so that it is renewed
    /// ahead of time like any other; one with it keeps its own life.
    #[test]
    fn a_token_without_a_life_gets_an_hour() {
        let life = |body: &str| {
            let (_, exp) = oauth_token(body.as_bytes(), "t").unwrap();
            exp.unwrap()
                .duration_since(SystemTime::now())
                .unwrap()
                .as_secs()
        };
        assert!((3590..=3600).contains(&life(r#"{"access_token":"a"}"#)));
        assert!((110..=120).contains(&life(r#"{"access_token":"a","expires_in":120}"#)));
    }
}
