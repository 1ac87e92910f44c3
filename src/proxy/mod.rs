//! The data plane: one function, `Proxy::handle`, takes a request through the fixed order of
//! policies below and returns the response. The order is the design; each step says why it
//! sits where it does.
//!
//! Why one function (its work one future) and not a stack of tower / tower-http layers: the
//! request id is written into legate's error bodies, the Responses ids and the journal, and the
//! request's span and access record are filled in step by step (`observe::RequestObs`), so
//! `SetRequestId` and `TraceLayer` would add a second place for what `handle` does in a few
//! lines; the policies below share the parsed body and the tenant, which layers would pass
//! through request extensions; compression would buffer event streams, and a timeout layer
//! covers only the response future (the idle timeout lives in the body). Retries are not a
//! layer either: see `policy::retry`.

pub mod answer;
pub mod background;
pub mod body;
pub mod buffers;
pub mod chain;
pub mod conversation;
pub mod estimate;
pub mod exchange;
pub mod inbound;
mod input_items;
mod intake;
pub mod models;
pub mod record;
pub mod response;
pub mod responses;
mod snapshot;
pub mod upbody;
pub mod upread;
pub mod watch;
pub mod within;

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::server::CallerBody;
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use tokio_util::sync::CancellationToken;

use crate::api::{ApiKind, Operation, RequestMeta};
use crate::config::{Priority, StoreKind};
use crate::error::ProxyError;
use crate::meter::Ledger;
use crate::policy::breakers::Breakers;
use crate::policy::ratelimit::Limiter;
use crate::policy::ratelimit::redis::RedisStore;
use crate::policy::retry::RetryBudget;
use crate::telemetry::Metrics;
use crate::upstream::Lanes;
use inbound::Endpoint;
use record::RequestRecord;
pub use response::ProxyBody;
pub use snapshot::{RequestIds, Snapshot};

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
    /// Background responses relayed whose usage comes with a later poll (`background.rs`).
    pub unsettled: Arc<background::Unsettled>,
    listen_ip: IpAddr,
    /// Request bodies held by all requests together (`max_buffered_bytes`).
    pub buffers: Arc<buffers::BufferBudget>,
    /// Upstream answers held whole by all requests together, in a bound of the same size of
    /// their own (`buffers`).
    pub answers: Arc<buffers::BufferBudget>,
    /// Access log, journal and traces (SPEC §12).
    pub observer: Arc<crate::observe::Observer>,
    /// Local token estimates running at once (CPU work on blocking threads).
    pub estimates: Arc<tokio::sync::Semaphore>,
}

/// What the caller asked for, once the body has been read and parsed.
pub struct Inbound {
    endpoint: Endpoint,
    headers: HeaderMap,
    /// The caller's lines that go upstream as written (an HTTP/1 caller's, when all can).
    verbatim: Option<Box<crate::verbatim::Verbatim>>,
    query: Option<String>,
    body: Bytes,
    meta: RequestMeta,
    deadline: tokio::time::Instant,
    /// The tenant's priority, lowered (never raised) by `x-legate-priority`.
    priority: Priority,
    /// The body's share of `max_buffered_bytes`, held as long as the body is.
    _buffered: buffers::BufferShare,
    /// A Responses request's conversation (its `previous_response_id` looked up).
    conversation: Option<Arc<conversation::Conversation>>,
    /// The tenant's part of the answers' budget, when there are several tenants.
    answer_part: Option<Arc<buffers::TenantPart>>,
    /// The tenant's part of the local token estimates, for a count request when there are
    /// several tenants.
    estimate_part: Option<Arc<tokio::sync::Semaphore>>,
    /// Where attempts are reported.
    pub(crate) obs: crate::observe::RequestObs,
}

impl Drop for Inbound {
    /// The caller's head map is kept for the next head this thread reads (`header_maps`).
    fn drop(&mut self) {
        crate::header_maps::give(std::mem::take(&mut self.headers));
    }
}

/// What `Proxy::serve` hands back: the outcome, and what it owned on the way.
struct Served {
    proxy: Arc<Proxy>,
    snap: Arc<Snapshot>,
    rid: crate::observe::RequestId,
    obs: crate::observe::RequestObs,
    /// Still here unless an upstream body took it over.
    record: Option<RequestRecord>,
    stats: exchange::Spent,
    result: Result<Response<ProxyBody>, ProxyError>,
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
        let conversations = Arc::new(responses::conversation_store(&snapshot.cfg));
        Proxy {
            conversations,
            unsettled: Default::default(),
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
            answers: Default::default(),
            observer: Arc::new(crate::observe::Observer::journal_only(0)),
            estimates: Arc::new(tokio::sync::Semaphore::new(estimate::CONCURRENT)),
        }
    }

    /// How many requests the data plane has seen since start (it only grows).
    pub fn requests_seen(&self) -> u64 {
        self.ids.issued()
    }

    /// Records a request whose head the connection refused before it could be served (a
    /// malformed or badly framed head, one too large, a transfer coding or version legate does
    /// not speak), as every other request is: an access-log line and journal entry under a
    /// request id of its own, and `legate_requests_total`. Returns that id, for the answer.
    pub fn refused_head(&self, head: &crate::server::listener::RefusedHead) -> String {
        let started = Instant::now();
        let rid = self.ids.next_id();
        let api = head.api.as_str();
        let obs = crate::observe::RequestObs::start(
            &self.observer,
            rid,
            api,
            &head.method,
            &head.path,
            &http::HeaderMap::new(),
            started,
        );
        let mut rec = RequestRecord::new(self.metrics.clone(), api, started);
        rec.observe(obs.clone());
        obs.update(|f| f.error_type = Some(head.error.kind()));
        rec.finish(head.error.status().as_u16());
        rid.render()
    }

    /// Reports finished requests to `observer` (access log, journal, export).
    pub fn with_observer(mut self, observer: Arc<crate::observe::Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Serves one request. The work up to the answer (policies, the chain) is one boxed
    /// future written into its allocation; what is returned around it is 184 bytes (the box,
    /// the span, what stamping the answer needs, or the rare websocket refusal's response),
    /// so hyper keeps that small slot per connection and no second box is made per request.
    /// The work before the box (request id, journal entry, accounting record) runs when hyper
    /// calls this, not at the first poll: a future dropped unpolled still counts its request,
    /// as a 499.
    pub fn handle(
        self: Arc<Self>,
        req: Request<CallerBody>,
    ) -> impl std::future::Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static
    {
        use futures_util::future::Either;
        let started = Instant::now();
        let rid = self.ids.next_id();
        let snap = self.snapshot.load_full();
        let endpoint = inbound::classify(req.method(), req.uri().path());
        // The model list and one model are answered (and counted) in the caller's own shape,
        // told apart by its headers: both APIs share their paths.
        let api = match endpoint {
            Some(e) if !matches!(e.op, Operation::Model | Operation::Models) => e.api,
            _ => inbound::shape_for_unknown(req.headers()),
        };
        let http1 = matches!(
            req.version(),
            http::Version::HTTP_10 | http::Version::HTTP_11
        );
        let websocket =
            responses::is_websocket_upgrade(req.method(), req.uri().path(), req.headers());
        let api_label = if websocket {
            ApiKind::Responses.as_str()
        } else {
            api.as_str()
        };
        let obs = crate::observe::RequestObs::start(
            &self.observer,
            rid,
            api_label,
            req.method(),
            req.uri().path(),
            req.headers(),
            started,
        );
        // The record lives in the serving future until an upstream body takes it over: if the
        // caller goes away first, dropping the future records 499.
        let mut rec = RequestRecord::new(self.metrics.clone(), api_label, started);
        rec.observe(obs.clone());
        if websocket {
            // legate's own headers, as on every other answer (`x-legate-overhead-ms`).
            let mut refused = responses::refuse_websocket(&obs);
            let (at, stamped) =
                self.stamp(&mut refused, exchange::Spent::default(), started, api_label);
            rec.finish_noting(426, at, |f| stamped.note(f, &refused));
            response::set_request_id(&mut refused, &rid);
            return Either::Left(std::future::ready(Ok(refused)));
        }
        let span = obs.span().clone();
        // Boxed, once: the request's way through the chain is a future of kilobytes. The
        // allocation is made first and the future written into it: `Box::pin(f)` builds the
        // 6 KB future on the stack and then copies all of it into the box.
        let serving = Box::into_pin(Box::write(
            Box::new_uninit(),
            self.serve(snap, endpoint, req, rid, Some(rec), obs),
        ));
        let serving = tracing::Instrument::instrument(serving, span.clone());
        Either::Right(async move {
            let Served {
                proxy,
                snap,
                rid,
                obs,
                mut record,
                stats,
                result,
            } = serving.await;
            let _in = span.enter();
            let mut resp = match result {
                Ok(resp) => resp,
                Err(err) => {
                    obs.update(|f| f.error_type = Some(err.kind()));
                    // Refused by legate before anything was sent: the request counts against
                    // no `requests_per_minute` (an SDK retrying a 529 would otherwise spend
                    // its tenant's requests on answers that never reached a provider).
                    if stats.attempts == 0
                        && matches!(
                            err,
                            ProxyError::CredentialUnavailable { .. }
                                | ProxyError::NoProviderKey { .. }
                                | ProxyError::Shed { .. }
                                | ProxyError::AllBreakersOpen { .. }
                                | ProxyError::DeadlineExceeded
                                | ProxyError::ShuttingDown
                                | ProxyError::BuffersFull { .. }
                        )
                        && let Some(rec) = record.as_mut()
                    {
                        rec.never_sent();
                    }
                    if err.source() != crate::error::Source::Client {
                        tracing::warn!(request_id = %rid, error = err.kind(), "request failed");
                    } else {
                        tracing::debug!(request_id = %rid, error = err.kind(), "request refused");
                    }
                    let close = http1 && err.ends_connection();
                    let (parts, body) = err.render(api, &rid.render()).into_parts();
                    let mut resp = Response::from_parts(parts, ProxyBody::full(body));
                    // The rest of a body left unread is read and dropped by the HTTP/1
                    // connection after the answer, which then goes on; only one too slow to
                    // wait for ends the connection.
                    if close {
                        resp.headers_mut().insert(
                            http::header::CONNECTION,
                            http::HeaderValue::from_static("close"),
                        );
                    }
                    resp
                }
            };
            let (at, stamped) = proxy.stamp(&mut resp, stats, started, api_label);
            // One update of the request's facts for the stamp and the record, where the
            // record is written here (each update takes a lock and a compare-and-swap); a
            // streamed answer's body holds the record, and the stamp is noted on its own.
            match record.take() {
                Some(rec) => {
                    rec.finish_noting(resp.status().as_u16(), at, |f| stamped.note(f, &resp))
                }
                None => obs.update(|f| stamped.note(f, &resp)),
            }
            response::set_request_id(&mut resp, &rid);
            Ok(crate::observe::capture::wrap(resp, obs, &snap))
        })
    }

    /// legate's own response headers, stamped here only, on answers and errors alike, and the
    /// overhead metric; the instant it was stamped at, and what the request's facts are to
    /// note of it ([`Stamped::note`], written with the record's own in one update).
    fn stamp(
        &self,
        resp: &mut Response<ProxyBody>,
        stats: exchange::Spent,
        started: Instant,
        api_label: &str,
    ) -> (Instant, Stamped) {
        // Time inside legate before the response headers, upstream waits excluded.
        let now = Instant::now();
        let overhead = now
            .saturating_duration_since(started)
            .saturating_sub(stats.outside);
        if stats.attempts > 0 {
            response::set_count(resp, "x-legate-attempts", stats.attempts);
            if resp.status().as_u16() >= 400 {
                // Whatever ended it, this request already cost upstream attempts: the SDK must
                // not multiply them.
                response::set_header(resp, "x-should-retry", "false");
            }
        }
        self.metrics
            .series
            .overhead(&self.metrics, api_label)
            .observe(overhead.as_secs_f64());
        response::set_header_owned(resp, "x-legate-overhead-ms", millis_3(overhead));
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
        (
            now,
            Stamped {
                overhead,
                attempts: stats.attempts,
            },
        )
    }

    /// The request's way through legate's policies, in their fixed order (the numbered steps
    /// here and in `screen` and `take_in`). It owns what the request needs on the way and
    /// hands it back with the outcome: borrowed from the future around it, it could not be
    /// boxed before that future exists.
    async fn serve(
        self: Arc<Self>,
        snap: Arc<Snapshot>,
        endpoint: Option<Endpoint>,
        req: Request<CallerBody>,
        rid: crate::observe::RequestId,
        mut record: Option<RequestRecord>,
        obs: crate::observe::RequestObs,
    ) -> Served {
        let mut stats = exchange::Spent::default();
        // A block, not a nested future: its steps' futures are this one's, not moved into it.
        let result = 'served: {
            let (endpoint, tenant) = match self.screen(&snap, endpoint, &req, &mut record, &obs) {
                Ok(screened) => screened,
                Err(e) => break 'served Err(e),
            };
            // What is answered without a body: from config, or the conversation store.
            if let Some(answered) = self
                .answer_locally(&snap, endpoint, &req, (&tenant, &obs))
                .await
            {
                break 'served answered;
            }
            let inbound = match self
                .take_in(
                    &snap,
                    endpoint,
                    &tenant,
                    req,
                    rid,
                    (&mut record, &mut stats),
                    &obs,
                )
                .await
            {
                Ok(inbound) => inbound,
                Err(e) => break 'served Err(e),
            };
            let priority = inbound.priority;
            let result = if endpoint.op == Operation::InputTokens {
                responses::input_tokens(&snap, (&self.answers, &self.estimates), &inbound).await
            } else {
                // 6. The chain: breakers, fitting, attempts, retries and fallback, in one place.
                chain::run(&self, &snap, &inbound, &mut record, &mut stats).await
            };
            // A local token count with no turn free in time is shed with 529, as the
            // admission queue sheds: counted with them.
            if let Err(ProxyError::Shed { counting: true, .. }) = &result {
                self.metrics
                    .shed
                    .with_label_values(&[priority.as_str()])
                    .inc();
            }
            result
        };
        Served {
            proxy: self,
            snap,
            rid,
            obs,
            record,
            stats,
            result,
        }
    }

    /// Steps 0 to 3, everything decided from the request line and headers alone, so that a
    /// refusal costs no body read: the endpoint and the caller's tenant, or why not.
    fn screen(
        &self,
        snap: &Snapshot,
        endpoint: Option<Endpoint>,
        req: &Request<CallerBody>,
        record: &mut Option<RequestRecord>,
        obs: &crate::observe::RequestObs,
    ) -> Result<(Endpoint, Cow<'static, str>), ProxyError> {
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
        self.note_client_retry(snap, endpoint, &tenant, obs.client_retry());
        Ok((endpoint, tenant))
    }

    /// The caller's own retry on top of legate's: worth seeing (README: turning them off).
    fn note_client_retry(
        &self,
        snap: &Snapshot,
        endpoint: Endpoint,
        tenant: &str,
        client_retry: Option<u64>,
    ) {
        if let Some(retries) = client_retry {
            self.metrics
                .client_retries
                .with_label_values(&[endpoint.api.as_str(), snap.labels.tenant(tenant)])
                .inc();
            tracing::debug!(
                client_retry = retries,
                "the client retried this request itself"
            );
        }
    }

    /// The operations answered without reading a body or calling the chain: the model list and
    /// one model (from config), a stored response (the conversation store, or its provider).
    async fn answer_locally(
        &self,
        snap: &Snapshot,
        endpoint: Endpoint,
        req: &Request<CallerBody>,
        (tenant, obs): (&str, &crate::observe::RequestObs),
    ) -> Option<Result<Response<ProxyBody>, ProxyError>> {
        let cfg = &snap.cfg;
        match endpoint.op {
            Operation::Models => Some(Ok(models::list(cfg))),
            Operation::Model => {
                let id = inbound::model_id(req.uri().path()).unwrap_or_default();
                let api = inbound::shape_for_unknown(req.headers());
                Some(models::retrieve(cfg, &id, api))
            }
            // Boxed: a store lookup and an upstream call, kilobytes of future that would
            // otherwise be part of every request's.
            Operation::StoredResponse => Some(
                Box::pin(responses::stored_response(
                    snap,
                    (&self.conversations, &self.unsettled),
                    &self.answers,
                    req,
                    (tenant, obs),
                ))
                .await,
            ),
            Operation::Generate | Operation::CountTokens | Operation::InputTokens => None,
        }
    }
}

/// What [`Proxy::stamp`] tells the request's facts.
struct Stamped {
    overhead: std::time::Duration,
    attempts: u32,
}

impl Stamped {
    /// Notes the stamp, and who answered (`resp`'s `x-legate-served-by`), in `f`.
    fn note(&self, f: &mut crate::observe::facts::Facts, resp: &Response<ProxyBody>) {
        f.overhead = Some(self.overhead);
        f.attempts = self.attempts;
        let served_by = resp
            .headers()
            .get(&response::X_LEGATE_SERVED_BY)
            .and_then(|v| v.to_str().ok());
        // Nearly always the target of the attempt that answered: shared, not copied. The
        // header escapes what it cannot hold; the record keeps the name itself.
        f.served_by = served_by.map(|s| match f.steps.last() {
            Some(a) if a.called.target() == s => a.called.shared_target().clone(),
            Some(a) if response::escaped(a.called.target()) == s => {
                a.called.shared_target().clone()
            }
            _ => std::sync::Arc::from(s),
        });
    }
}

/// A duration as milliseconds with three decimals, rounded to the microsecond. Integer
/// formatting: `{:.3}` on an f64 took thousands of instructions per request.
fn millis_3(d: std::time::Duration) -> String {
    let micros = (d.as_nanos() + 500) / 1_000;
    // Nor `format!`: itoa and three digits by hand are a fraction of its cost.
    let mut whole = itoa::Buffer::new();
    let whole = whole.format(micros / 1_000);
    // Exactly its length: the header value takes a string with no spare room as it is, while
    // one with spare room costs a second allocation to be shared.
    let mut out = String::with_capacity(whole.len() + 4);
    out.push_str(whole);
    out.push('.');
    let frac = (micros % 1_000) as u32;
    for digit in [frac / 100, frac / 10 % 10, frac % 10] {
        out.push(char::from(b'0' + digit as u8));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn overhead_is_written_in_milliseconds_with_three_decimals() {
        assert_eq!(super::millis_3(Duration::ZERO), "0.000");
        assert_eq!(super::millis_3(Duration::from_nanos(1_499)), "0.001");
        assert_eq!(super::millis_3(Duration::from_nanos(1_500)), "0.002");
        assert_eq!(super::millis_3(Duration::from_micros(12_345)), "12.345");
        assert_eq!(super::millis_3(Duration::from_secs(3)), "3000.000");
    }
}
