//! Cloud platforms as upstreams (SPEC §13): Amazon Bedrock and Google Vertex AI serving the
//! Anthropic API, Azure OpenAI serving the OpenAI API. The caller keeps speaking plain
//! Anthropic or OpenAI; this module is everything that differs on the provider side — the URL
//! that carries the model, the body fields the platform wants, the credential (obtained from
//! the pod's identity and refreshed before it expires), Bedrock's binary event stream and the
//! platforms' error shapes.

pub mod aws;
pub mod azure;
pub mod cache;
pub mod errors;
pub mod eventstream;
pub mod fetch;
pub mod google;
mod imds;

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use http_body_util::Full;
use prometheus::IntCounterVec;

use crate::config::cloud::{AwsSource, AzureConfig, AzureSource, GoogleSource, Platform};
use crate::config::{ProviderConfig, Secret};
use crate::error::ProxyError;
use cache::{Cached, CredentialState, Unavailable};

/// The live credential of a cloud provider.
#[derive(Clone)]
enum Cred {
    Aws(Arc<Cached<aws::AwsCreds>>),
    Token(Arc<Cached<Secret>>),
    /// Azure with an api-key: the provider's ordinary key cell sends it.
    Key,
}

/// Where a provider's credential comes from, as configured.
#[derive(Clone, PartialEq)]
enum Source {
    Aws(AwsSource),
    Google(GoogleSource),
    Azure(AzureSource),
}

impl Source {
    fn of(platform: &Platform) -> Option<Source> {
        Some(match platform {
            Platform::Direct => return None,
            Platform::Bedrock(b) => Source::Aws(b.credentials.clone()),
            Platform::Vertex(v) => Source::Google(v.credentials.clone()),
            Platform::AzureOpenAi(a) => Source::Azure(a.credentials.clone()),
        })
    }
}

/// A provider's credential, held or being fetched, with the source it comes from: kept
/// across config reloads ([`crate::upstream::Lanes`]), so that a reload that leaves the source
/// as it was keeps the credential in hand (and its refresh schedule and history) instead of
/// fetching anew — with the endpoint down, a fresh fetch would fail requests the held
/// credential still serves.
#[derive(Clone)]
pub struct Kept {
    source: Source,
    cred: Cred,
}

pub struct CloudProvider {
    name: String,
    platform: Platform,
    source: Source,
    cred: Cred,
    client: fetch::FetchClient,
}

/// Characters left as they are in a path segment (RFC 3986 unreserved); everything else,
/// the `:` of Bedrock model ids included, is percent-encoded.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Vertex model versions are written `name@version`, as Google's own clients send them.
const VERTEX_SEGMENT: &percent_encoding::AsciiSet = &SEGMENT.remove(b'@');

fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

impl CloudProvider {
    /// The cloud side of a provider; `None` for a direct (`anthropic` / `openai`) one. Its
    /// credential is `kept`'s when that comes from the same source.
    pub fn new(
        cfg: &ProviderConfig,
        refreshes: IntCounterVec,
        kept: Option<&Kept>,
    ) -> Result<Option<Self>, String> {
        let Some(from) = Source::of(&cfg.platform) else {
            return Ok(None);
        };
        let cred = match kept {
            Some(k) if k.source == from => k.cred.clone(),
            _ => Self::new_cred(cfg, refreshes),
        };
        Ok(Some(CloudProvider {
            name: cfg.name.clone(),
            platform: cfg.platform.clone(),
            source: from,
            cred,
            client: fetch::client()?,
        }))
    }

    /// What a reload may carry over to the provider's next incarnation.
    pub fn kept(&self) -> Kept {
        Kept {
            source: self.source.clone(),
            cred: self.cred.clone(),
        }
    }

    /// A credential cell of its own, nothing held yet.
    fn new_cred(cfg: &ProviderConfig, refreshes: IntCounterVec) -> Cred {
        let source = cfg.platform.credential_source().unwrap_or_default();
        let (counter, name) = (refreshes, cfg.name.clone());
        let counted = move |ok: bool| {
            counter
                .with_label_values(&[name.as_str(), if ok { "ok" } else { "error" }])
                .inc()
        };
        match &cfg.platform {
            Platform::Bedrock(_) => Cred::Aws(Arc::new(Cached::new(source, counted))),
            Platform::Direct
            | Platform::AzureOpenAi(AzureConfig {
                credentials: AzureSource::ApiKey,
                ..
            }) => Cred::Key,
            Platform::Vertex(_) | Platform::AzureOpenAi(_) => {
                Cred::Token(Arc::new(Cached::new(source, counted)))
            }
        }
    }

    /// True when the provider sends its credential itself (the ordinary key is not used).
    pub fn owns_credential(&self) -> bool {
        !matches!(self.cred, Cred::Key)
    }

    /// The path and query of a generation call for `model`.
    pub fn path(&self, model: &str, stream: bool) -> String {
        match &self.platform {
            Platform::Direct => String::new(),
            Platform::Bedrock(_) => format!(
                "/model/{}/{}",
                segment(model),
                if stream {
                    "invoke-with-response-stream"
                } else {
                    "invoke"
                }
            ),
            Platform::Vertex(v) => format!(
                "/v1/projects/{}/locations/{}/publishers/anthropic/models/{}:{}",
                v.project,
                v.region,
                percent_encoding::utf8_percent_encode(model, VERTEX_SEGMENT),
                if stream {
                    "streamRawPredict"
                } else {
                    "rawPredict"
                }
            ),
            Platform::AzureOpenAi(a) => format!(
                "/openai/deployments/{}/chat/completions?api-version={}",
                segment(a.deployment(model)),
                segment(&a.api_version)
            ),
        }
    }

    /// Whether the platform serves the Responses API (Azure OpenAI's v1 surface, wire-protocol
    /// §G); Bedrock and Vertex serve Anthropic models only.
    pub fn serves_responses(&self) -> bool {
        matches!(self.platform, Platform::AzureOpenAi(_))
    }

    /// The platform's path for a Responses API path (`/v1/responses…`): Azure serves it on its
    /// v1 surface, `/openai/v1/responses…`, where the deployment is named by the body's
    /// `model` and no `api-version` is asked for.
    pub fn responses_path(&self, path: &str) -> String {
        format!("/openai{path}")
    }

    /// A Responses body for `model` on the platform: Azure names the deployment in the body's
    /// `model`, so a model mapped to a deployment of another name is rewritten there, every
    /// other byte left as the caller's.
    pub fn responses_body(&self, body: &Bytes, model: &str) -> Result<Bytes, ProxyError> {
        let Platform::AzureOpenAi(a) = &self.platform else {
            return Ok(body.clone());
        };
        let deployment = a.deployment(model);
        if deployment == model {
            return Ok(body.clone());
        }
        let name = crate::splice::json_string(deployment);
        crate::splice::replace_top_level(body, "model", &name)
            .map(Bytes::from)
            .ok_or(ProxyError::Internal)
    }

    /// Whether the platform answers a stream in Bedrock's binary event stream.
    pub fn event_stream(&self) -> bool {
        matches!(self.platform, Platform::Bedrock(_))
    }

    /// Whether only a minimal, signed set of headers may go out (SigV4 signs every header sent).
    pub fn minimal_headers(&self) -> bool {
        matches!(self.platform, Platform::Bedrock(_))
    }

    /// The body the platform wants: for the Anthropic platforms, the Messages body without
    /// `model` (and, on Bedrock, without `stream`), with `anthropic_version`, and on Bedrock the
    /// caller's `anthropic-beta` headers as `anthropic_beta`. Edited in place (SPEC §4): every
    /// other byte is the caller's, so key order (a tool schema's parameters), large integers
    /// and escapes reach the model as sent.
    pub fn body(&self, body: &Bytes, inbound: &HeaderMap) -> Result<Bytes, ProxyError> {
        match &self.platform {
            Platform::Direct | Platform::AzureOpenAi(_) => Ok(body.clone()),
            Platform::Bedrock(b) => platform_body(body, inbound, &b.anthropic_version, true),
            Platform::Vertex(v) => platform_body(body, inbound, &v.anthropic_version, false),
        }
    }

    fn failed(&self, what: String) -> ProxyError {
        ProxyError::CredentialUnavailable {
            provider: self.name.clone(),
            what,
        }
    }

    fn unavailable(&self, why: Unavailable) -> ProxyError {
        match why {
            Unavailable::Failed(what) => self.failed(what),
            Unavailable::Deadline => ProxyError::DeadlineExceeded,
        }
    }

    /// Puts the platform credential on `req` (whose body is `body`): SigV4 for Bedrock, a
    /// bearer token for Vertex and Entra-authenticated Azure. Fetches or refreshes it first
    /// when needed, waiting for a fetch as `wait` says.
    pub async fn authorize(
        &self,
        req: &mut Request<Full<Bytes>>,
        body: &[u8],
        wait: cache::Wait,
    ) -> Result<(), ProxyError> {
        // Each fetch runs in its own task (`cache`): it owns what it uses, copied only when a
        // fetch starts.
        let client = || self.client.clone();
        match (&self.cred, &self.platform) {
            (Cred::Aws(cell), Platform::Bedrock(b)) => {
                let fetch = || {
                    let (client, source) = (client(), b.credentials.clone());
                    async move { aws::fetch(&client, &source).await.and_then(sendable_aws) }
                };
                let creds = cell
                    .get(fetch, wait)
                    .await
                    .map_err(|e| self.unavailable(e))?;
                aws::sign(req, body, &creds, &b.region, "bedrock", SystemTime::now())
                    .map_err(|e| self.failed(e))
            }
            (Cred::Token(cell), Platform::Vertex(v)) => {
                let fetch = || {
                    let (client, source) = (client(), v.credentials.clone());
                    async move {
                        google::fetch(&client, &source)
                            .await
                            .and_then(sendable_token)
                    }
                };
                let token = cell
                    .get(fetch, wait)
                    .await
                    .map_err(|e| self.unavailable(e))?;
                bearer(req, &token).map_err(|e| self.failed(e))
            }
            (Cred::Token(cell), Platform::AzureOpenAi(a)) => {
                let AzureSource::WorkloadIdentity {
                    token_file,
                    client_id,
                    token_url,
                    ..
                } = &a.credentials
                else {
                    return Err(ProxyError::Internal);
                };
                let fetch = || {
                    let client = client();
                    let (file, id, url) =
                        (token_file.clone(), client_id.clone(), token_url.clone());
                    async move {
                        azure::fetch(&client, &file, &id, &url)
                            .await
                            .and_then(sendable_token)
                    }
                };
                let token = cell
                    .get(fetch, wait)
                    .await
                    .map_err(|e| self.unavailable(e))?;
                bearer(req, &token).map_err(|e| self.failed(e))
            }
            _ => Ok(()),
        }
    }

    /// Whether the platform's error answers need [`CloudProvider::map_error`].
    pub fn maps_errors(&self) -> bool {
        matches!(self.platform, Platform::Bedrock(_) | Platform::Vertex(_))
    }

    /// A platform error answer in the Anthropic shape (for Bedrock and Vertex); `None` when
    /// the answer is already in the shape of the API the provider speaks.
    pub fn map_error(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<(StatusCode, Bytes)> {
        match &self.platform {
            Platform::Bedrock(_) => Some(errors::bedrock(status, headers, body)),
            Platform::Vertex(_) => Some(errors::vertex(status, body)),
            Platform::Direct | Platform::AzureOpenAi(_) => None,
        }
    }

    /// The platform answered 401 or 403 to a call sent at `sent`. True when the call may be
    /// tried again with another credential (see `Cached::refused`).
    pub fn credential_refused(&self, sent: tokio::time::Instant) -> bool {
        match &self.cred {
            Cred::Aws(c) => c.refused(sent),
            Cred::Token(c) => c.refused(sent),
            Cred::Key => false,
        }
    }

    /// The secret this provider's requests carry now, to be kept out of what reaches the
    /// caller (SPEC §13, §14): the bearer token, or Bedrock's session token (its secret key
    /// is never sent, only a signature made with it for that one request). `None` for an
    /// Azure api-key provider, whose ordinary key is the secret.
    pub fn sent_secret(&self) -> Option<Arc<Secret>> {
        match &self.cred {
            Cred::Aws(c) => c.held()?.session_token.clone(),
            Cred::Token(c) => c.held(),
            Cred::Key => None,
        }
    }

    /// The secret the last refresh replaced: a request sent just before it carried that one.
    pub fn previous_secret(&self) -> Option<Arc<Secret>> {
        match &self.cred {
            Cred::Aws(c) => c.previous()?.session_token.clone(),
            Cred::Token(c) => c.previous(),
            Cred::Key => None,
        }
    }

    /// The credential's source and expiry for `/admin/state` (never its value).
    pub fn state(&self) -> Option<CredentialState> {
        match &self.cred {
            Cred::Aws(c) => Some(c.state()),
            Cred::Token(c) => Some(c.state()),
            Cred::Key => None,
        }
    }
}

/// An Anthropic Messages body as Bedrock (`bedrock`) or Vertex wants it; see
/// [`CloudProvider::body`].
fn platform_body(
    body: &Bytes,
    inbound: &HeaderMap,
    version: &str,
    bedrock: bool,
) -> Result<Bytes, ProxyError> {
    use crate::splice::{insert_top_level, json_string, remove_top_level, top_level_value_span};
    let not_object = || ProxyError::InvalidRequest {
        message: "the request body is not a JSON object".to_owned(),
    };
    let mut out = body.to_vec();
    let drop_key = |out: &mut Vec<u8>, key: &str| {
        if let Some(cut) = remove_top_level(out, key) {
            *out = cut;
        }
    };
    drop_key(&mut out, "model");
    if bedrock {
        drop_key(&mut out, "stream");
        let betas: Vec<String> = inbound
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(json_string)
            .collect();
        if !betas.is_empty() && top_level_value_span(&out, "anthropic_beta").is_none() {
            let list = format!("[{}]", betas.join(","));
            out = insert_top_level(&out, "anthropic_beta", &list).ok_or_else(not_object)?;
        }
    }
    if top_level_value_span(&out, "anthropic_version").is_none() {
        out = insert_top_level(&out, "anthropic_version", &json_string(version))
            .ok_or_else(not_object)?;
    }
    Ok(Bytes::from(out))
}

/// A credential is checked when it is fetched, not only when it is used: one that cannot go
/// in a header (a line break in a token, a NUL in a session token) held as good would fail
/// every request until it expired, an hour on, with nothing fetched again meanwhile. As a
/// failed fetch it is retried with the usual pauses, counted, and shown as `last_error`.
fn sendable(value: &str, what: &str) -> Result<(), String> {
    if value.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(format!(
            "the {what} fetched holds characters a request header cannot carry"
        ))
    }
}

fn sendable_token(f: cache::Fetched<Secret>) -> Result<cache::Fetched<Secret>, String> {
    sendable(f.value.expose(), "access token").map(|()| f)
}

fn sendable_aws(f: cache::Fetched<aws::AwsCreds>) -> Result<cache::Fetched<aws::AwsCreds>, String> {
    let c = &f.value;
    sendable(c.access_key_id.expose(), "access key id")?;
    sendable(c.secret_access_key.expose(), "secret access key")?;
    if let Some(t) = &c.session_token {
        sendable(t.expose(), "session token")?;
    }
    Ok(f)
}

fn bearer(req: &mut Request<Full<Bytes>>, token: &Arc<Secret>) -> Result<(), String> {
    let mut v = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
        .map_err(|_| "the access token is not a header value".to_owned())?;
    v.set_sensitive(true);
    req.headers_mut().insert(header::AUTHORIZATION, v);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_platform_body_is_the_callers_edited_in_place() {
        let body = Bytes::from_static(
            br#"{"model":"m", "max_tokens":5,"stream":true,"n":12345678901234567890123,"big":1e400,"tools":[{"name":"t","input_schema":{"properties":{"zcity":{},"alpha":{}}}}],"messages":[{"role":"user","content":"caf\u00e9 1e400"}]}"#,
        );
        let mut inbound = HeaderMap::new();
        inbound.insert("anthropic-beta", HeaderValue::from_static("a-1, b-2"));
        let out = platform_body(&body, &inbound, "bedrock-2023-05-31", true).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"max_tokens":5,"n":12345678901234567890123,"big":1e400,"tools":[{"name":"t","input_schema":{"properties":{"zcity":{},"alpha":{}}}}],"messages":[{"role":"user","content":"caf\u00e9 1e400"}],"anthropic_beta":["a-1","b-2"],"anthropic_version":"bedrock-2023-05-31"}"#
        );
        // Vertex keeps `stream`; a version the caller set stays.
        let body = Bytes::from_static(br#"{"model":"m","stream":true,"anthropic_version":"x"}"#);
        let out = platform_body(&body, &HeaderMap::new(), "vertex-2023-10-16", false).unwrap();
        assert_eq!(&out[..], br#"{"stream":true,"anthropic_version":"x"}"#);
        // Not an object: refused as before.
        let out = platform_body(&Bytes::from_static(b"[1]"), &HeaderMap::new(), "v", false);
        assert!(matches!(out, Err(ProxyError::InvalidRequest { .. })));
    }
}
