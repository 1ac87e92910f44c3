//! One upstream provider: its pooled HTTP client (legate's own HTTP/1.1 and hyper's HTTP/2,
//! over hyper-rustls's connector, see [`pool`]),
//! its live credential, its concurrency cap, and how a request to it is built. The per-attempt
//! timeouts are applied by the caller (`proxy::exchange`), which knows the request's deadline.

mod body;
mod conns;
mod dial;
pub(crate) mod h1;
mod pool;
mod streams;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;

use crate::cloud::CloudProvider;
use crate::config::secret::KeyCell;
use crate::config::{ApiKind, AuthHeader, KeySource, ProviderConfig, SheddingConfig, TlsRoots};
use crate::error::ProxyError;
use crate::policy::admission::Gate;
use crate::policy::pacer::Pacer;
use crate::telemetry::Metrics;

pub use body::{BodyError, ResponseBody};
pub use dial::SendError;
pub use pool::{PooledClient as HttpClient, Sent};

/// Request headers never forwarded upstream: hop-by-hop headers (RFC 9110 §7.6.1), the caller's
/// credentials (consumed here; the provider key is injected instead), headers legate recomputes,
/// and legate's own control headers. A `match` rather than a list to search: it is asked once
/// per header of every request, and compiles to a switch on the length.
fn dropped_request_header(name: &str) -> bool {
    matches!(
        name,
        "connection"
            // Reserved (RFC 9110 §7.6.1): never a field to pass on, listed or not.
            | "close"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
            | "x-api-key"
            | "authorization"
            | "api-key"
            | "accept-encoding"
    ) || name.starts_with("x-legate-")
}

/// Whether a caller's line of this name goes upstream as the caller wrote it
/// ([`crate::verbatim`]): every name the upstream request carries as it came, which is every
/// one not dropped but `traceparent`, which legate replaces when it traces the request. Names
/// a `Connection` line lists are dropped too; a head with such a line has no verbatim lines.
pub(crate) fn verbatim_name(name: &HeaderName) -> bool {
    !dropped_request_header(name.as_str()) && name != TRACEPARENT
}

/// The upstream paths legate calls (see `Endpoint::upstream_path`), each parsed once per
/// provider: a path missing here is formatted and parsed into a URL on every request (two
/// allocations and about 1,000 instructions, as every `/v1/responses` call was).
const ENDPOINT_PATHS: [&str; 6] = [
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/responses/input_tokens",
];

pub struct Upstream {
    pub name: String,
    pub kind: ApiKind,
    /// An `openai` provider that serves the Responses API (else Responses callers are
    /// translated to Chat Completions for it).
    pub responses: bool,
    base_url: String,
    /// The base URL's host, for the journal and traces (shared by every attempt's facts).
    pub host: Option<Arc<str>>,
    /// The URL of each endpoint path without a query, parsed once.
    uris: Vec<(&'static str, Uri)>,
    client: HttpClient,
    key: Arc<KeyCell>,
    /// This config made the key cell (its watcher is to be started); else it shares the one
    /// of a config before it, watched already.
    key_is_new: bool,
    /// No key source configured (a local vLLM / Ollama server): no credential is sent.
    keyless: bool,
    key_hint: String,
    auth_header: AuthHeader,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    /// `max_concurrency` with its priority queue: beyond it requests wait, or are shed.
    pub gate: Arc<Gate>,
    /// Spaces out non-interactive calls when the provider's rate limit runs low.
    pub pacer: Arc<Pacer>,
    /// The platform side of a cloud provider (Bedrock, Vertex, Azure OpenAI).
    pub cloud: Option<CloudProvider>,
}

/// Per-provider state that outlives config snapshots: the admission gate (with whoever holds
/// or waits for its slots) and the pacer's reading of the provider's rate limit. A reload
/// resizes them in place instead of starting from zero.
pub struct Lanes {
    pub(crate) metrics: Arc<Metrics>,
    /// Keyed by configured provider names (Fx-hashed: nothing a caller sends is inserted).
    map: parking_lot::Mutex<rustc_hash::FxHashMap<String, Lane>>,
    /// Cloud providers' credentials, by provider name: a reload that keeps a provider's
    /// credential source keeps its credential (`cloud::Kept`).
    clouds: parking_lot::Mutex<rustc_hash::FxHashMap<String, crate::cloud::Kept>>,
    /// Key cells read from files, by provider name and path: a reload that keeps a provider's
    /// key file shares its cell (and the one watcher that keeps it current) with the configs
    /// before it, whose requests may still be in flight. A cell of its own per config left
    /// those requests with the key read before a rotation, or, kept current, one watcher per
    /// reload while they lasted. Held weakly: a cell goes with the last config using it.
    keys: parking_lot::Mutex<
        rustc_hash::FxHashMap<String, (std::path::PathBuf, std::sync::Weak<KeyCell>)>,
    >,
}

/// One provider's gate and pacer.
type Lane = (Arc<Gate>, Arc<Pacer>);

impl Lanes {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Lanes {
            metrics,
            map: Default::default(),
            clouds: Default::default(),
            keys: Default::default(),
        }
    }

    /// Provider `cfg`'s key cell, and whether it is new (and so needs a watcher of its own):
    /// the cell of the configs before when its key comes from the same file.
    fn key(&self, cfg: &ProviderConfig) -> (Arc<KeyCell>, bool) {
        let KeySource::File { path } = &cfg.key else {
            return (Arc::new(KeyCell::from_source(&cfg.key)), false);
        };
        let mut keys = self.keys.lock();
        if let Some((kept_path, cell)) = keys.get(&cfg.name)
            && kept_path == path
            && let Some(cell) = cell.upgrade()
        {
            return (cell, false);
        }
        let cell = Arc::new(KeyCell::from_source(&cfg.key));
        keys.insert(cfg.name.clone(), (path.clone(), Arc::downgrade(&cell)));
        (cell, true)
    }

    /// The cloud side of provider `cfg`, with the credential its last incarnation held when
    /// the source is the same. Nothing is kept for the next incarnation until the config is
    /// taken ([`Lanes::settle`]): a refused reload leaves the running one's.
    fn cloud(&self, cfg: &ProviderConfig) -> Result<Option<CloudProvider>, String> {
        let clouds = self.clouds.lock();
        let refreshes = self.metrics.credential_refreshes.clone();
        CloudProvider::new(cfg, refreshes, clouds.get(&cfg.name))
    }

    /// A config's upstreams were all made: its providers' gates take its sizes, and their
    /// credentials are kept for the next reload. Until then a config that may still be
    /// refused (a CA file that cannot be read, a credential source that cannot be set up)
    /// changes nothing the running one uses.
    pub(crate) fn settle<'n>(
        &self,
        providers: impl Iterator<Item = (&'n str, usize, Option<crate::cloud::Kept>)>,
        queue_limit: usize,
    ) {
        let (map, mut clouds) = (self.map.lock(), self.clouds.lock());
        for (name, max_concurrency, cloud) in providers {
            if let Some((gate, _)) = map.get(name) {
                gate.resize(max_concurrency, queue_limit);
            }
            match cloud {
                Some(kept) => clouds.insert(name.to_owned(), kept),
                None => clouds.remove(name),
            };
        }
    }

    /// The provider's lane: the one it had (resized only by [`Lanes::settle`]), or a new one.
    fn get(&self, provider: &str, max: usize, queue_limit: usize) -> Lane {
        let mut map = self.map.lock();
        if let Some((gate, pacer)) = map.get(provider) {
            return (gate.clone(), pacer.clone());
        }
        let lane = (
            Arc::new(Gate::new(
                max,
                queue_limit,
                self.metrics.queue_depth.clone(),
                self.metrics.shed.clone(),
            )),
            Arc::new(Pacer::new(
                provider,
                self.metrics.upstream_ratelimit_remaining.clone(),
            )),
        );
        map.insert(provider.to_string(), lane.clone());
        lane
    }
}

impl Upstream {
    pub fn new(
        cfg: &ProviderConfig,
        shedding: &SheddingConfig,
        lanes: &Lanes,
        workers: usize,
    ) -> Result<Self, String> {
        let (gate, pacer) = lanes.get(&cfg.name, cfg.max_concurrency, shedding.queue_limit);
        let tls = tls_config(cfg)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(cfg.connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let base = cfg.base_url.parse::<Uri>().ok();
        let client = HttpClient::new(
            https,
            base.as_ref(),
            pool::PoolOptions {
                idle_timeout: cfg.pool_idle_timeout,
                max_conns: cfg.max_concurrency,
                lists: workers,
                max_buf: crate::server::listener::HTTP1_MAX_BUF,
                connect_timeout: cfg.connect_timeout,
            },
        );
        let cloud = lanes.cloud(cfg)?;
        let (key, key_is_new) = lanes.key(cfg);
        let key_hint = match &cfg.key {
            KeySource::Env { var, .. } => format!("set the environment variable {var}"),
            KeySource::File { path } => format!("check the key file {}", path.display()),
            KeySource::None => "configure api_key_env or api_key_file".to_string(),
        };
        let uris = ENDPOINT_PATHS
            .iter()
            .filter_map(|p| Some((*p, format!("{}{p}", cfg.base_url).parse().ok()?)))
            .collect();
        Ok(Upstream {
            name: cfg.name.clone(),
            kind: cfg.kind,
            responses: cfg.responses,
            base_url: cfg.base_url.clone(),
            host: base.as_ref().and_then(Uri::host).map(Arc::from),
            uris,
            client,
            key,
            key_is_new,
            keyless: matches!(cfg.key, KeySource::None),
            key_hint,
            auth_header: cfg.auth_header,
            first_byte_timeout: cfg.first_byte_timeout,
            idle_timeout: cfg.idle_timeout,
            gate,
            pacer,
            cloud,
        })
    }

    /// Starts the key-file watcher, if the key comes from a file and no config before this one
    /// watches it already.
    pub fn spawn_key_watch(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.key_is_new.then(|| self.key.spawn_watch()).flatten()
    }

    /// Builds the request to a cloud provider: the model in the URL, the platform's body, and
    /// its credential (obtained or refreshed here when due, waited for as `wait` says).
    pub async fn build_cloud_request(
        &self,
        cloud: &CloudProvider,
        target: (&str, bool, ApiKind),
        inbound: &HeaderMap,
        body: Bytes,
        translated: bool,
        wait: crate::cloud::cache::Wait,
    ) -> Result<Request<Full<Bytes>>, ProxyError> {
        let (model, stream, spoken) = target;
        let (body, path) = if spoken == ApiKind::Responses {
            let path = cloud.responses_path("/v1/responses");
            (cloud.responses_body(&body, model)?, path)
        } else {
            (cloud.body(&body, inbound)?, cloud.path(model, stream))
        };
        let mut req = if cloud.minimal_headers() {
            let uri: Uri = format!("{}{}", self.base_url, path)
                .parse()
                .map_err(|_| ProxyError::Internal)?;
            let host = uri
                .authority()
                .map(|a| a.as_str().to_owned())
                .unwrap_or_default();
            let mut req = Request::new(Full::new(body.clone()));
            *req.method_mut() = Method::POST;
            *req.uri_mut() = uri;
            let h = req.headers_mut();
            h.insert(
                header::HOST,
                HeaderValue::from_str(&host).map_err(|_| ProxyError::Internal)?,
            );
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            h.insert(
                header::ACCEPT,
                HeaderValue::from_static(if stream {
                    crate::cloud::eventstream::CONTENT_TYPE
                } else {
                    "application/json"
                }),
            );
            req
        } else {
            let mut req = self.build_request(
                Method::POST,
                &path,
                inbound,
                false,
                body.clone(),
                translated,
                !cloud.owns_credential(),
            )?;
            // The model travels in the URL; the platform's own version goes in the body.
            req.headers_mut().remove("anthropic-version");
            req
        };
        if cloud.owns_credential() {
            cloud.authorize(&mut req, &body, wait).await?;
        }
        Ok(req)
    }

    /// The request for one of the Responses API's small endpoints (stored responses,
    /// `input_tokens`): `target` is the API's own path and query, which a cloud platform that
    /// serves the API (Azure) has under a path of its own, with its own credential (obtained
    /// or refreshed here when due, waited for as `wait` says).
    pub async fn build_plain_request(
        &self,
        method: Method,
        target: &str,
        inbound: &HeaderMap,
        body: Bytes,
        wait: crate::cloud::cache::Wait,
    ) -> Result<Request<Full<Bytes>>, ProxyError> {
        let Some(cloud) = &self.cloud else {
            return self.build_request(method, target, inbound, false, body, false, true);
        };
        if !cloud.serves_responses() {
            return Err(ProxyError::InvalidRequest {
                message: format!(
                    "provider `{}` is a cloud platform that does not serve this endpoint",
                    self.name
                ),
            });
        }
        let path = cloud.responses_path(target);
        let own = cloud.owns_credential();
        let mut req =
            self.build_request(method, &path, inbound, false, body.clone(), false, !own)?;
        if own {
            cloud.authorize(&mut req, &body, wait).await?;
        }
        Ok(req)
    }

    /// Builds the upstream request: the provider's URL + the inbound path, the caller's headers
    /// minus hop-by-hop and credentials, exactly one provider credential (when `with_key`),
    /// the body as given. With `verbatim`, the caller's lines that go as written travel beside
    /// the request ([`crate::verbatim`], to be passed to the send with it): its map then holds
    /// only what legate sets and the forwarded lines those leave out.
    #[expect(
        clippy::too_many_arguments,
        reason = "the request's parts, each used once; a struct of them would be built per request to be taken apart here"
    )]
    pub fn build_request(
        &self,
        method: Method,
        path_and_query: &str,
        inbound: &HeaderMap,
        verbatim: bool,
        body: Bytes,
        translated: bool,
        with_key: bool,
    ) -> Result<Request<Full<Bytes>>, ProxyError> {
        let uri = match self.uris.iter().find(|(p, _)| *p == path_and_query) {
            Some((_, uri)) => uri.clone(),
            None => format!("{}{}", self.base_url, path_and_query)
                .parse()
                .map_err(|_| ProxyError::Internal)?,
        };
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        let key_name = (!self.keyless && with_key).then(|| self.key_name());
        // A translated request's caller lines are filtered below: never verbatim.
        debug_assert!(
            !(verbatim && translated),
            "a translated request has no verbatim lines"
        );
        *req.headers_mut() = if verbatim {
            beside_verbatim(inbound)
        } else {
            forwardable(inbound, key_name.as_ref().map(|(n, _)| n))
        };
        let headers = req.headers_mut();
        if translated {
            // The caller spoke the other API: its API's headers mean nothing here.
            let other: Vec<HeaderName> = headers
                .keys()
                .filter(|n| {
                    n.as_str().starts_with("anthropic-") || n.as_str().starts_with("openai-")
                })
                .cloned()
                .collect();
            for n in other {
                headers.remove(n);
            }
            if self.kind == ApiKind::Anthropic {
                // The version whose request fields the translation produces (temperature and
                // top_p are refused by later versions).
                headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
            }
        }
        // Metering reads usage from the response bytes, so they must arrive uncompressed.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        let Some((name, bearer)) = key_name else {
            return Ok(req);
        };
        // On an error below the request, which may still hold the caller's own credential
        // line under `name` (see `forwardable`), is dropped unsent.
        let key = self
            .key
            .current()
            .ok_or_else(|| ProxyError::NoProviderKey {
                provider: self.name.clone(),
                hint: self.key_hint.clone(),
            })?;
        let value = key
            .header_value(bearer)
            .ok_or_else(|| ProxyError::NoProviderKey {
                provider: self.name.clone(),
                hint: "the configured key contains characters not allowed in a header".to_string(),
            })?;
        headers.insert(name, value);
        Ok(req)
    }

    /// The header the provider's key goes in, and whether it is written as a bearer token.
    fn key_name(&self) -> (HeaderName, bool) {
        match self.auth_header {
            AuthHeader::XApiKey => (HeaderName::from_static("x-api-key"), false),
            AuthHeader::Bearer => (header::AUTHORIZATION, true),
            AuthHeader::ApiKey => (HeaderName::from_static("api-key"), false),
        }
    }

    /// Writes the key loaded now into a request [`Upstream::build_request`] made with its key
    /// some time ago (a request that then waited for its turn): a key file rotated meanwhile
    /// (the old key revoked) is what the provider must see. Nothing changes when no key is
    /// loaded, or the request carries none.
    pub fn renew_key(&self, headers: &mut HeaderMap) {
        if self.keyless {
            return;
        }
        let (name, bearer) = self.key_name();
        if !headers.contains_key(&name) {
            return;
        }
        if let Some(value) = self.key.current().and_then(|k| k.header_value(bearer)) {
            headers.insert(name, value);
        }
    }

    /// Whether a key is loaded now (for `/admin/state`; never the key itself).
    pub fn has_key(&self) -> bool {
        self.key.current().is_some()
    }

    /// The API a step on this provider is called in for a caller of `caller`: the Responses
    /// API when the caller speaks it and this `openai` provider serves it (directly, or on
    /// Azure's v1 surface), else the provider's own kind.
    pub fn speaks(&self, caller: ApiKind) -> ApiKind {
        let responses = caller == ApiKind::Responses
            && self.kind == ApiKind::OpenAi
            && self.responses
            && self.cloud.as_ref().is_none_or(|c| c.serves_responses());
        if responses { caller } else { self.kind }
    }

    /// What removes this provider's key from its answers (`None` without a key).
    pub fn redactor(&self) -> Option<crate::redact::Redactor> {
        let r = crate::redact::Redactor::new(self.current_key())?;
        // A key file's rotation, or a platform credential's refresh, leaves the old one valid
        // for a while, and a request sent just before it carried that one.
        Some(match &self.cloud {
            Some(cloud) if cloud.owns_credential() => r.with_previous(cloud.previous_secret()),
            _ => r.with_previous(self.key.previous()),
        })
    }

    /// The secret this provider's requests carry now (its key, or a cloud platform's own
    /// credential), only so that answers and captured payloads can be stripped of it (never
    /// shown).
    pub fn current_key(&self) -> Option<Arc<crate::config::Secret>> {
        match &self.cloud {
            Some(cloud) if cloud.owns_credential() => cloud.sent_secret(),
            _ if self.keyless => None,
            _ => self.key.current(),
        }
    }

    pub fn client(&self) -> &HttpClient {
        &self.client
    }
}

/// The most headers `build_request` and the exchange add to the caller's: `accept-encoding`,
/// the credential, `content-length`, `traceparent` (and a translated step's
/// `anthropic-version`).
const ADDED_HEADERS: usize = 5;

/// From this many caller lines on, `forwardable` copies the caller's map instead of building
/// a new one. Measured (valgrind, profile-guided builds): with an SDK's eighteen lines the copy
/// took 1,300 instructions fewer per request; with four or five plain lines, 540–660 more
/// (the copy's fixed part: two removals, the two lists allocated and filled) — most of those
/// names are standard ones, which hash in a step.
const COPY_FROM: usize = 10;

/// The caller's end-to-end headers, as the upstream request's: every line but hop-by-hop ones
/// (including any named in `Connection`), credentials and legate's own `x-legate-*` controls.
///
/// With many lines (an SDK's dozen and more, mostly names `http` does not know) the map is a
/// copy of the caller's with those taken out, not made line by line: a copy keeps each line's
/// hash and slot, where appending hashed every name again (FNV, a byte at a time) and probed
/// for its slot. The lines the caller of this is about to set anyway are then left in place
/// for it to overwrite (an `insert` replaces in the same slot): `accept-encoding`, and
/// `credential`, the name the provider key goes under — its caller must set it or drop the
/// map.
fn forwardable(inbound: &HeaderMap, credential: Option<&HeaderName>) -> HeaderMap {
    // What an SDK's `Connection` says (`keep-alive`, or `close`) names no header: the names
    // are collected only when it names more.
    let tokens = || {
        inbound
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
    };
    let names_more =
        tokens().any(|t| !t.eq_ignore_ascii_case("keep-alive") && !t.eq_ignore_ascii_case("close"));
    let connection_named: Vec<String> = if names_more {
        tokens().map(str::to_ascii_lowercase).collect()
    } else {
        Vec::new()
    };
    let dropped = |name: &HeaderName| {
        let n = name.as_str();
        dropped_request_header(n) || connection_named.iter().any(|c| c == n)
    };
    if inbound.len() < COPY_FROM {
        // Sized once for the caller's lines and the few legate adds, instead of growing (a
        // rehash each time) on the way.
        let mut out = crate::header_maps::take(inbound.len() + ADDED_HEADERS);
        for (name, value) in inbound {
            if !dropped(name) {
                out.append(name.clone(), value.clone());
            }
        }
        return out;
    }
    let mut out = inbound.clone();
    for name in inbound.keys() {
        if dropped(name) && *name != header::ACCEPT_ENCODING && Some(name) != credential {
            out.remove(name);
        }
    }
    out
}

/// The upstream request's map beside the caller's verbatim lines ([`crate::verbatim`]): those
/// hold every forwarded line but `traceparent` ([`verbatim_name`]), so the caller's
/// `traceparent`, if any, is all it takes from the caller's map; the rest is what
/// `build_request` and the exchange set.
fn beside_verbatim(inbound: &HeaderMap) -> HeaderMap {
    let mut out = crate::header_maps::take(ADDED_HEADERS + 1);
    for value in inbound.get_all(TRACEPARENT) {
        out.append(TRACEPARENT, value.clone());
    }
    out
}

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The system's trusted roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` replace them).
pub(crate) fn add_native_roots(roots: &mut rustls::RootCertStore) {
    for cert in rustls_native_certs::load_native_certs().certs {
        // A malformed system certificate is skipped, as every TLS client does.
        let _ = roots.add(cert);
    }
}

fn tls_config(cfg: &ProviderConfig) -> Result<rustls::ClientConfig, String> {
    use crate::config::tls;
    let mut roots = rustls::RootCertStore::empty();
    match cfg.tls_roots {
        TlsRoots::Webpki => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        TlsRoots::Native => add_native_roots(&mut roots),
    }
    if let Some(path) = &cfg.ca_file {
        tls::add_ca_file(&mut roots, path)?;
    }
    let client = match (&cfg.client_cert_file, &cfg.client_key_file) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        _ => None,
    };
    tls::client_config(roots, client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_upstream_path_is_parsed_once() {
        use crate::api::Operation;
        let ops = [
            Operation::Generate,
            Operation::CountTokens,
            Operation::Models,
            Operation::Model,
            Operation::InputTokens,
            Operation::StoredResponse,
        ];
        // A new operation fails to compile here until it is in the list above.
        let _every = |op: Operation| match op {
            Operation::Generate
            | Operation::CountTokens
            | Operation::Models
            | Operation::Model
            | Operation::InputTokens
            | Operation::StoredResponse => (),
        };
        for kind in ApiKind::ALL {
            for op in ops {
                if let Some(path) = kind.dialect().upstream_path(op) {
                    assert!(
                        ENDPOINT_PATHS.contains(&path),
                        "{path} ({kind:?} {op:?}) is parsed once per provider"
                    );
                }
            }
        }
    }

    #[test]
    fn hop_by_hop_credentials_and_legate_headers_are_not_forwarded() {
        let mut inbound = HeaderMap::new();
        inbound.insert(
            "connection",
            HeaderValue::from_static("Keep-Alive, X-Secret-Hop"),
        );
        inbound.insert("x-secret-hop", HeaderValue::from_static("1"));
        inbound.insert("x-api-key", HeaderValue::from_static("client-key"));
        inbound.insert("authorization", HeaderValue::from_static("Bearer client"));
        inbound.insert("x-legate-priority", HeaderValue::from_static("batch"));
        inbound.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        inbound.append("x-stainless-lang", HeaderValue::from_static("python"));
        let names = |m: &HeaderMap| {
            let mut n: Vec<String> = m
                .keys()
                .map(|k| k.to_string())
                .filter(|k| !k.starts_with("x-pad-"))
                .collect();
            n.sort();
            n
        };
        // Built line by line (few lines), and copied (padded to many): the same lines go.
        let mut padded = inbound.clone();
        for i in 0..COPY_FROM {
            padded.append(
                HeaderName::from_bytes(format!("x-pad-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("1"),
            );
        }
        assert!(inbound.len() < COPY_FROM && padded.len() >= COPY_FROM);
        for map in [&inbound, &padded] {
            let out = forwardable(map, None);
            assert_eq!(names(&out), vec!["anthropic-version", "x-stainless-lang"]);
            assert_eq!(out.len(), map.len() - inbound.len() + 2);
        }
        // A copy keeps the line of the name the provider key is about to go under, for it to
        // overwrite; a map built line by line never had it.
        let key = HeaderName::from_static("x-api-key");
        let out = forwardable(&padded, Some(&key));
        assert_eq!(
            names(&out),
            vec!["anthropic-version", "x-api-key", "x-stainless-lang"]
        );
        let out = forwardable(&inbound, Some(&key));
        assert_eq!(names(&out), vec!["anthropic-version", "x-stainless-lang"]);

        let mut all = HeaderMap::new();
        for n in [
            "connection",
            "close",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "host",
            "content-length",
            "x-api-key",
            "authorization",
            "api-key",
            "accept-encoding",
            "x-legate-tenant",
            "anthropic-beta",
        ] {
            all.append(n, HeaderValue::from_static("1"));
        }
        // Copied: `accept-encoding` is left for `build_request`, which always sets it.
        assert!(all.len() >= COPY_FROM);
        let out = forwardable(&all, None);
        assert_eq!(names(&out), vec!["accept-encoding", "anthropic-beta"]);
        assert_eq!(out.len(), 2, "every value of a dropped name goes");
        // Built line by line from a few of them.
        let few: HeaderMap = all
            .iter()
            .skip(all.len() - 6)
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        assert!(few.len() < COPY_FROM);
        assert_eq!(names(&forwardable(&few, None)), vec!["anthropic-beta"]);
    }
}
