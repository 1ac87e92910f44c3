//! The data plane: one function, `Proxy::handle`, takes a request through the fixed order of
//! policies below and returns the response. The order is the design; each step says why it
//! sits where it does.

pub mod attempt;
pub mod body;
pub mod buffers;
pub mod chain;
pub mod estimate;
pub mod inbound;
pub mod models;
pub mod record;
pub mod response;
pub mod responses;
pub mod upbody;
pub mod watch;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiShape, RequestMeta};
use crate::config::{ApiKind, Config, Priority, StoreKind};
use crate::error::ProxyError;
use crate::meter::Ledger;
use crate::policy::breaker::Breakers;
use crate::policy::ratelimit::redis::RedisStore;
use crate::policy::ratelimit::{Ask, Decision, Limiter, Reservation};
use crate::policy::retry::RetryBudget;
use crate::route::Labels;
use crate::telemetry::Metrics;
use crate::upstream::{Lanes, Upstream};
use inbound::{BodyError, Endpoint};
use record::RequestRecord;
pub use response::ProxyBody;

/// Everything that comes from one loaded config. Swapped whole, so a request sees one
/// consistent config from start to end.
pub struct Snapshot {
    pub cfg: Arc<Config>,
    pub upstreams: HashMap<String, Arc<Upstream>>,
    pub labels: Labels,
    pub hash: String,
}

impl Snapshot {
    pub fn new(cfg: Arc<Config>, lanes: &Lanes) -> Result<Self, String> {
        let mut upstreams = HashMap::new();
        for (name, p) in &cfg.providers {
            let up = Upstream::new(p, &cfg.shedding, lanes)
                .map_err(|e| format!("providers.{name}: {e}"))?;
            upstreams.insert(name.clone(), Arc::new(up));
        }
        let labels = Labels::from_config(&cfg);
        let hash = crate::config::render::config_hash(&cfg);
        Ok(Snapshot {
            cfg,
            upstreams,
            labels,
            hash,
        })
    }
}

/// Request ids: a random per-process prefix and a counter, unique without a syscall per request.
pub struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl RequestIds {
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        RequestIds {
            prefix: h.finish() & 0xffff_ffff_ffff,
            next: AtomicU64::new(1),
        }
    }

    pub fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("lgt_{:012x}{:08x}", self.prefix, n)
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}

pub struct Proxy {
    pub snapshot: ArcSwap<Snapshot>,
    pub metrics: Arc<Metrics>,
    pub ledger: Arc<Ledger>,
    /// Breakers and the retry budget outlive config snapshots: an upstream's health does not
    /// reset because the config was reloaded.
    pub breakers: Breakers,
    pub budget: RetryBudget,
    /// Tenant buckets; the store (memory or Redis) is chosen at start.
    pub limiter: Arc<Limiter>,
    /// Admission gates and pacers per provider, carried across reloads.
    pub lanes: Arc<Lanes>,
    ids: RequestIds,
    /// Fired when shutdown_grace has run out: open streams end with an error event.
    pub abort_streams: CancellationToken,
    /// The Responses API's conversation store (chosen at start, like the rate-limit store).
    pub conversations: Arc<crate::responses::ConversationStore>,
    listen_ip: IpAddr,
    /// Request bodies held by all requests together (`max_buffered_bytes`).
    pub buffers: Arc<buffers::BufferBudget>,
    /// Access log, journal and traces (SPEC §12).
    pub observer: Arc<crate::observe::Observer>,
}

/// What the caller asked for, once the body has been read and parsed.
pub struct Inbound {
    endpoint: Endpoint,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
    meta: RequestMeta,
    deadline: tokio::time::Instant,
    /// The tenant's priority, lowered (never raised) by `x-legate-priority`.
    priority: Priority,
    /// The body's share of `max_buffered_bytes`, held as long as the body is.
    _buffered: buffers::BufferShare,
    /// A Responses request's conversation (its `previous_response_id` looked up).
    conversation: Option<Arc<responses::Conversation>>,
    /// Where attempts are reported.
    pub(crate) obs: crate::observe::RequestObs,
}

impl Proxy {
    pub fn new(
        snapshot: Snapshot,
        lanes: Arc<Lanes>,
        metrics: Arc<Metrics>,
        ledger: Arc<Ledger>,
        listen_ip: IpAddr,
    ) -> Self {
        let breakers = Breakers::new(snapshot.cfg.breaker.clone(), metrics.breaker_state.clone());
        let budget = RetryBudget::new(snapshot.cfg.retry.budget_ratio);
        let shared: Option<Box<dyn crate::policy::ratelimit::Store>> = match (
            &snapshot.cfg.ratelimit.store,
            &snapshot.cfg.ratelimit.redis_url,
        ) {
            (StoreKind::Redis, Some(url)) => match RedisStore::new(url) {
                Ok(s) => Some(Box::new(s)),
                Err(e) => {
                    tracing::error!(error = %e.0, "the Redis store cannot be used; serving on local buckets");
                    None
                }
            },
            _ => None,
        };
        let limiter = Arc::new(Limiter::new(
            shared,
            metrics.ratelimit_store_degraded.clone(),
        ));
        let conversations = Arc::new(conversation_store(&snapshot.cfg));
        Proxy {
            conversations,
            breakers,
            budget,
            limiter,
            lanes,
            snapshot: ArcSwap::from_pointee(snapshot),
            metrics,
            ledger,
            ids: RequestIds::new(),
            abort_streams: CancellationToken::new(),
            listen_ip,
            buffers: Default::default(),
            observer: Arc::new(crate::observe::Observer::journal_only(0)),
        }
    }

    /// Reports finished requests to `observer` (access log, journal, export).
    pub fn with_observer(mut self, observer: Arc<crate::observe::Observer>) -> Self {
        self.observer = observer;
        self
    }

    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let started = Instant::now();
        let rid = self.ids.next_id();
        let snap = self.snapshot.load_full();
        let endpoint = inbound::classify(req.method(), req.uri().path());
        // One model is answered in the caller's own shape, told apart by its headers.
        let api = match endpoint {
            None | Some(Endpoint::Model) => inbound::shape_for_unknown(req.headers()),
            Some(e) => e.api(),
        };
        let websocket =
            responses::is_websocket_upgrade(req.method(), req.uri().path(), req.headers());
        let api_label = match api {
            _ if websocket => "responses",
            ApiShape::Anthropic => "anthropic",
            ApiShape::OpenAi => "openai",
            ApiShape::Responses => "responses",
        };
        let obs = crate::observe::RequestObs::start(
            &self.observer,
            &rid,
            api_label,
            req.method(),
            req.uri().path(),
            req.headers(),
        );
        // The record lives in this future until an upstream body takes it over: if the caller
        // goes away first, dropping the future records 499.
        if websocket {
            // Before the key or the body is read: a WebSocket-first client falls back at once.
            // Counted (api="responses", status 426) and logged, so the fallback can be seen.
            let mut rec = RequestRecord::new(self.metrics.clone(), "responses", started);
            obs.update(|f| f.error_type = Some("websocket_not_supported"));
            rec.observe(obs.clone());
            rec.finish(426);
            let mut resp = responses::upgrade_required();
            response::set_header(&mut resp, "x-legate-request-id", &rid);
            return Ok(resp);
        }
        let mut rec = RequestRecord::new(self.metrics.clone(), api_label, started);
        rec.observe(obs.clone());
        let mut record = Some(rec);
        let mut stats = chain::ExecStats::default();
        let span = obs.span().clone();
        let result = tracing::Instrument::instrument(
            self.serve(&snap, endpoint, req, &rid, &mut record, &mut stats, &obs),
            span.clone(),
        )
        .await;
        let _in = span.enter();
        let mut resp = match result {
            Ok(resp) => resp,
            Err(err) => {
                obs.update(|f| f.error_type = Some(err.kind()));
                if err.source() != crate::error::Source::Client {
                    tracing::warn!(request_id = %rid, error = err.kind(), "request failed");
                } else {
                    tracing::debug!(request_id = %rid, error = err.kind(), "request refused");
                }
                let r = err.render(api, &rid);
                let (parts, body) = r.into_parts();
                Response::from_parts(parts, ProxyBody::full(body))
            }
        };
        // Time inside legate before the response headers, upstream waits excluded.
        let overhead = started.elapsed().saturating_sub(stats.outside);
        if stats.attempts > 0 {
            if !resp.headers().contains_key("x-legate-attempts") {
                response::set_header(&mut resp, "x-legate-attempts", &stats.attempts.to_string());
            }
            if resp.status().as_u16() >= 400 {
                // Whatever ended it, this request already cost upstream attempts: the SDK must
                // not multiply them.
                response::set_header(&mut resp, "x-should-retry", "false");
            }
        }
        self.metrics
            .overhead
            .with_label_values(&[api_label])
            .observe(overhead.as_secs_f64());
        response::set_header(
            &mut resp,
            "x-legate-overhead-ms",
            &format!("{:.3}", overhead.as_secs_f64() * 1000.0),
        );
        if resp.status().as_u16() == 529
            && resp
                .extensions()
                .get::<hyper::ext::ReasonPhrase>()
                .is_none()
        {
            // hyper knows no reason phrase for 529 and would write "<none>".
            resp.extensions_mut()
                .insert(hyper::ext::ReasonPhrase::from_static(b"Overloaded"));
        }
        let served_by = resp
            .headers()
            .get("x-legate-served-by")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        obs.update(|f| {
            f.overhead = Some(overhead);
            f.attempts = stats.attempts;
            f.served_by = served_by;
        });
        if let Some(rec) = record.take() {
            rec.finish(resp.status().as_u16());
        }
        response::set_header(&mut resp, "x-legate-request-id", &rid);
        Ok(crate::observe::capture::wrap(resp, obs, &snap))
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the request's parts and its per-request sinks, each used once"
    )]
    async fn serve(
        &self,
        snap: &Snapshot,
        endpoint: Option<Endpoint>,
        req: Request<Incoming>,
        rid: &str,
        record: &mut Option<RequestRecord>,
        stats: &mut chain::ExecStats,
        obs: &crate::observe::RequestObs,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let cfg = &snap.cfg;
        // 0. Origin: a web page in a browser never gets further, whatever else it sends.
        inbound::check_origin(req.headers())?;
        // 1. Target: refuse anything that would make legate an open proxy, before anything else.
        inbound::check_target(
            req.method(),
            req.version(),
            req.uri(),
            req.headers(),
            self.listen_ip,
            !cfg.clients.is_empty(),
        )?;
        // 2. Endpoint: unknown routes are refused without reading the body.
        let Some(endpoint) = endpoint else {
            return Err(ProxyError::NotFound {
                method: req.method().to_string(),
                path: req.uri().path().to_string(),
            });
        };
        // 3. Caller: the cheapest refusal for a bad key; no body is read for it.
        let tenant = inbound::authenticate(req.headers(), &cfg.clients)?;
        if let Some(r) = record.as_mut() {
            r.set_tenant(snap.labels.tenant(&tenant));
        }
        if let Some(retries) = client_retry_count(req.headers()) {
            // The caller's own retry on top of legate's: worth seeing (README: turning them off).
            self.metrics
                .client_retries
                .with_label_values(&[endpoint.label(), snap.labels.tenant(&tenant)])
                .inc();
            tracing::debug!(
                client_retry = retries,
                "the client retried this request itself"
            );
        }
        match endpoint {
            Endpoint::Models => return Ok(models::list(cfg)),
            Endpoint::Model => {
                let id = inbound::model_id(req.uri().path()).unwrap_or_default();
                let api = inbound::shape_for_unknown(req.headers());
                return models::retrieve(cfg, &id, api);
            }
            _ => {}
        }
        if endpoint == Endpoint::StoredResponse {
            return responses::stored_response(
                snap,
                &self.conversations,
                req.method(),
                req.uri().path(),
                req.uri().query(),
                req.headers(),
            )
            .await;
        }
        // 4. Body: read once under the limit, parsed once into RequestMeta.
        let (parts, body) = req.into_parts();
        let limits = &cfg.server.limits;
        let mut share = buffers::BufferShare::new(self.buffers.clone());
        let read = inbound::read_body(
            &parts.headers,
            body,
            parts.version == http::Version::HTTP_2,
            cfg.server.max_body_bytes,
            limits.body_read_timeout,
            &mut share,
            limits.max_buffered_bytes,
        );
        let body = match read.await {
            Ok(b) => b,
            Err(BodyError::TimedOut) => return Err(ProxyError::BodyTimeout),
            Err(BodyError::Full) => {
                tracing::warn!("request refused: server.max_buffered_bytes is reached");
                return Err(ProxyError::BuffersFull {
                    retry_after: Duration::from_secs(1),
                });
            }
            Err(BodyError::TooLarge) => {
                return Err(ProxyError::TooLarge {
                    limit: cfg.server.max_body_bytes,
                });
            }
            Err(BodyError::Broken) => {
                if let Some(r) = record.as_mut() {
                    r.client_gone();
                }
                return Err(ProxyError::InvalidRequest {
                    message: "the request body could not be read completely".to_string(),
                });
            }
        };
        crate::observe::capture::request_body(obs, snap, &parts.headers, &body);
        let meta = parse_meta(endpoint, &body)?;
        if let Some(r) = record.as_mut() {
            r.set_model(snap.labels.model(&meta.model));
        }
        obs.update(|f| {
            f.model = Some(meta.model.clone());
            f.max_tokens = meta.max_tokens;
            f.stream = meta.stream;
        });
        let deadline = deadline(&parts.headers, cfg.server.default_deadline);
        // 5. Admission: the tenant's limits, before anything is sent upstream.
        let tenant_cfg = cfg.tenant(&tenant);
        let priority = requested_priority(&parts.headers)
            .map_or(tenant_cfg.priority, |p| p.max(tenant_cfg.priority));
        obs.update(|f| f.priority = Some(priority.as_str()));
        if !matches!(
            endpoint,
            Endpoint::CountTokens | Endpoint::ResponsesInputTokens
        ) {
            let reservation = self.admit(snap, &tenant, &tenant_cfg, &meta).await?;
            if let Some(r) = record.as_mut() {
                r.reserve(reservation);
            }
        }
        let conversation = if endpoint == Endpoint::Responses {
            let conv =
                responses::Conversation::load(self.conversations.clone(), &body, rid).await?;
            Some(Arc::new(conv))
        } else {
            None
        };
        let inbound = Inbound {
            conversation,
            priority,
            endpoint,
            headers: parts.headers,
            query: parts.uri.query().map(str::to_string),
            body,
            meta,
            deadline,
            _buffered: share,
            obs: obs.clone(),
        };
        if endpoint == Endpoint::ResponsesInputTokens {
            return responses::input_tokens(snap, &inbound).await;
        }
        // 6. The chain: breakers, fitting, attempts, retries and fallback, in one place.
        chain::run(self, snap, inbound, record, stats).await
    }
}

impl Proxy {
    /// Reserves the request's estimated tokens (input + max_tokens) and one request from the
    /// tenant's buckets, and checks its daily budget.
    async fn admit(
        &self,
        snap: &Snapshot,
        tenant: &str,
        t: &crate::config::TenantConfig,
        meta: &RequestMeta,
    ) -> Result<Reservation, ProxyError> {
        let output = meta
            .max_tokens
            .unwrap_or(snap.cfg.ratelimit.default_output_reservation);
        let tokens = meta.approx_input_tokens.saturating_add(output);
        let ask = Ask {
            tenant: tenant.to_string(),
            rpm: t.requests_per_minute,
            tpm: t.tokens_per_minute,
            tokens,
            budget_pico: t.daily_budget_pico,
        };
        if t.tokens_per_minute > 0 && tokens > t.tokens_per_minute {
            return Err(ProxyError::NeverFits {
                tokens,
                tokens_per_minute: t.tokens_per_minute,
            });
        }
        if ask.rpm > 0 || ask.tpm > 0 || ask.budget_pico > 0 {
            if let Decision::Refuse { limit, retry_after } = self.limiter.admit(&ask).await {
                self.metrics
                    .ratelimit_rejections
                    .with_label_values(&[snap.labels.tenant(tenant), limit.as_str()])
                    .inc();
                return Err(ProxyError::RateLimited {
                    limit: limit.as_str(),
                    retry_after,
                });
            }
        }
        Ok(Reservation::new(
            self.limiter.clone(),
            &ask,
            meta.approx_input_tokens,
        ))
    }
}

/// The caller's `x-stainless-retry-count` when it is above 0 (the SDK retrying by itself).
fn client_retry_count(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("x-stainless-retry-count")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
}

/// `x-legate-priority`, if the caller sent a valid one.
fn requested_priority(headers: &HeaderMap) -> Option<Priority> {
    headers
        .get("x-legate-priority")
        .and_then(|v| v.to_str().ok())
        .and_then(Priority::parse)
}

fn parse_meta(endpoint: Endpoint, body: &[u8]) -> Result<RequestMeta, ProxyError> {
    let invalid = |e: api::MetaError| ProxyError::InvalidRequest {
        message: e.to_string(),
    };
    let meta = match endpoint {
        Endpoint::Messages => api::anthropic::parse_request(body).map_err(invalid)?,
        Endpoint::ChatCompletions => api::openai::parse_request(body).map_err(invalid)?,
        Endpoint::Responses => api::responses::parse_request(body).map_err(invalid)?,
        Endpoint::CountTokens | Endpoint::ResponsesInputTokens => parse_count_tokens(body)?,
        Endpoint::Models | Endpoint::Model | Endpoint::StoredResponse => {
            return Err(ProxyError::Internal);
        }
    };
    // Names travel into logs, maps and labels: an absurd one is refused before it does.
    if meta.model.len() > crate::names::MAX_MODEL_NAME_BYTES {
        return Err(ProxyError::InvalidRequest {
            message: format!(
                "the model name is {} bytes long; legate accepts model names of at most {} bytes",
                meta.model.len(),
                crate::names::MAX_MODEL_NAME_BYTES
            ),
        });
    }
    Ok(meta)
}

/// count_tokens needs only the model to be routed; the provider validates the rest.
fn parse_count_tokens(body: &[u8]) -> Result<RequestMeta, ProxyError> {
    #[derive(serde::Deserialize)]
    struct CountTokens<'a> {
        #[serde(borrow)]
        model: std::borrow::Cow<'a, str>,
    }
    let parsed: CountTokens<'_> =
        serde_json::from_slice(body).map_err(|e| ProxyError::InvalidRequest {
            message: format!("the request body is not a JSON object with a string `model`: {e}"),
        })?;
    Ok(RequestMeta {
        model: parsed.model.into_owned(),
        stream: false,
        max_tokens: None,
        include_usage: false,
        approx_input_tokens: (body.len() as u64).div_ceil(4),
    })
}

/// `x-legate-deadline-ms` may shorten the configured deadline, never extend it.
fn deadline(headers: &HeaderMap, default: Duration) -> tokio::time::Instant {
    let asked = headers
        .get("x-legate-deadline-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    let d = asked.map_or(default, |a| a.min(default));
    tokio::time::Instant::now() + d
}

impl Endpoint {
    pub fn kind(self) -> ApiKind {
        match self.api() {
            ApiShape::Anthropic => ApiKind::Anthropic,
            // Responses callers are routed like the other OpenAI API ([routing] openai).
            ApiShape::OpenAi | ApiShape::Responses => ApiKind::OpenAi,
        }
    }
}

/// The conversation store of `[responses]`: Redis when configured (at `ratelimit.redis_url`),
/// else memory; a Redis URL that cannot be used falls back to memory, said in the log.
fn conversation_store(cfg: &Config) -> crate::responses::ConversationStore {
    use crate::responses::store::{MemoryStore, RedisConversations};
    let rs = &cfg.responses;
    if let (StoreKind::Redis, Some(url)) = (&rs.store, &cfg.ratelimit.redis_url) {
        match RedisConversations::new(url, rs.ttl) {
            Ok(r) => return crate::responses::ConversationStore::Redis(Box::new(r)),
            Err(e) => {
                tracing::error!(error = %e.0, "the Redis conversation store cannot be used; keeping conversations in memory");
            }
        }
    }
    crate::responses::ConversationStore::Memory(MemoryStore::new(rs.max_bytes, rs.ttl))
}
