//! What a request asks, once its caller is known: its body read once under the size, time and
//! buffer limits and parsed into `RequestMeta`, its deadline and priority, and the tenant's
//! admission (rate limits and daily budget) before anything is sent upstream.

use std::time::Duration;

use crate::server::CallerBody;
use bytes::Bytes;
use http::{HeaderMap, Request};

use super::conversation::Conversation;
use super::exchange::Spent;
use super::inbound::{self, BodyError, Endpoint};
use super::record::RequestRecord;
use super::{Inbound, Proxy, Snapshot, buffers};
use crate::api::{Operation, RequestMeta};
use crate::config::{Config, Priority};
use crate::error::ProxyError;
use crate::observe::RequestObs;
use crate::policy::ratelimit::{Ask, Charged, Decision, HOLD_PAST_DEADLINE, Limit, Reservation};

impl Proxy {
    /// Reserves the request's estimated tokens (input + max_tokens) and one request from the
    /// tenant's buckets, and checks its daily budget, holding the request's estimated cost
    /// against it until the request is settled.
    pub(super) async fn admit(
        &self,
        snap: &Snapshot,
        endpoint: Endpoint,
        tenant: &str,
        t: &crate::config::TenantConfig,
        meta: &RequestMeta,
        deadline: tokio::time::Instant,
    ) -> Result<Reservation, ProxyError> {
        // An output the caller did not bound (OpenAI callers often do not) reserves the usual
        // amount, but never more than the tenant's minute leaves after the input: past it,
        // every such request would be a 400 for a `max_tokens` it never sent. Its budget hold
        // is still the usual amount (the most such a request is taken to write).
        let usual = snap.cfg.ratelimit.default_output_reservation;
        let output = meta
            .max_tokens
            .unwrap_or_else(|| match t.tokens_per_minute {
                0 => usual,
                tpm => usual.min(tpm.saturating_sub(meta.approx_input_tokens)),
            });
        // The estimate counts an image's base64 as what the provider bills for an image, not
        // as text (`api::fields`), so a request it puts past the whole minute is one that can
        // never fit.
        let tokens = meta.approx_input_tokens.saturating_add(output);
        if t.tokens_per_minute > 0 && tokens > t.tokens_per_minute {
            // Refused by the tenant's tokens limit, as a 429 is: a dashboard of refusals sees
            // the tenant whose requests can never fit.
            self.metrics
                .ratelimit_rejections
                .with_label_values(&[snap.labels.tenant(tenant), Limit::Tokens.as_str()])
                .inc();
            return Err(ProxyError::NeverFits {
                tokens,
                tokens_per_minute: t.tokens_per_minute,
            });
        }
        let hold_pico = match t.daily_budget_pico {
            0 => 0,
            _ => estimated_cost(&snap.cfg, endpoint, meta, meta.max_tokens.unwrap_or(usual)),
        };
        let ask = Ask {
            tenant: crate::route::tenant_name(tenant),
            rpm: t.requests_per_minute,
            tpm: t.tokens_per_minute,
            tokens,
            budget_pico: t.daily_budget_pico,
            hold_pico,
            hold_id: match hold_pico {
                0 => 0,
                _ => crate::policy::ratelimit::next_hold_id(),
            },
            // A clock read only for a request that holds something.
            hold_ms: match hold_pico {
                0 => 0,
                _ => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    u64::try_from((left + HOLD_PAST_DEADLINE).as_millis()).unwrap_or(u64::MAX)
                }
            },
        };
        let mut charged = Charged::Nowhere;
        if ask.rpm > 0 || ask.tpm > 0 || ask.budget_pico > 0 {
            let decision;
            (decision, charged) = self.limiter.admit(&ask).await;
            if let Decision::Refuse { limit, retry_after } = decision {
                self.metrics
                    .ratelimit_rejections
                    .with_label_values(&[snap.labels.tenant(tenant), limit.as_str()])
                    .inc();
                return Err(ProxyError::RateLimited {
                    limit: limit.reason(),
                    retry_after,
                });
            }
        }
        Ok(Reservation::new(
            self.limiter.clone(),
            &ask,
            charged,
            meta.approx_input_tokens,
        ))
    }
}

impl Proxy {
    /// Reads the body once, under the size limit and within the read timeout, its bytes held
    /// against `share` of the global buffer budget. Over HTTP/2 (`h2`) the rest of a refused
    /// body is read and thrown away, so the client sees the answer.
    pub(super) async fn read_body(
        &self,
        cfg: &Config,
        headers: &HeaderMap,
        h2: bool,
        body: CallerBody,
        share: &mut buffers::BufferShare,
        (record, spent): (&mut Option<RequestRecord>, &mut Spent),
    ) -> Result<Bytes, ProxyError> {
        let limit = cfg.server.max_body_bytes;
        let limits = &cfg.server.limits;
        let mut waited = None;
        let read = {
            let read = inbound::read_body(
                headers,
                body,
                h2,
                (limit, limits.body_read_timeout),
                share,
                limits.max_buffered_bytes,
                &mut waited,
            );
            let mut read = std::pin::pin!(read);
            // Past `shutdown_grace` a caller still uploading is answered (503), as a request
            // still without an answer is, rather than dropped at exit without a word. The
            // token is waited on only once the read has to wait: a body that came with its
            // head costs nothing more.
            match futures_util::FutureExt::now_or_never(read.as_mut()) {
                Some(read) => Some(read),
                None => tokio::select! {
                    biased;
                    read = read.as_mut() => Some(read),
                    () = self.abort_streams.cancelled() => None,
                },
            }
        };
        // The wait for the caller's bytes is the caller's time, not legate's overhead (a slow
        // upload read as a slow legate). A body that came with its head took no wait.
        if let Some(since) = waited {
            spent.leave(since);
            spent.come_back(tokio::time::Instant::now());
        }
        let Some(read) = read else {
            return Err(ProxyError::ShuttingDown);
        };
        match read {
            Ok(b) => Ok(b),
            Err(BodyError::TimedOut) => Err(ProxyError::BodyTimeout),
            Err(BodyError::Full) => {
                tracing::warn!("request refused: server.max_buffered_bytes is reached");
                Err(ProxyError::BuffersFull {
                    retry_after: Duration::from_secs(1),
                })
            }
            Err(BodyError::TooLarge) => Err(ProxyError::TooLarge { limit }),
            Err(BodyError::Broken) => {
                if let Some(r) = record.as_mut() {
                    r.client_gone();
                }
                Err(ProxyError::InvalidRequest {
                    message: "the request body could not be read completely".to_string(),
                })
            }
        }
    }
}

impl Proxy {
    /// Steps 4 and 5: the body read and parsed, the tenant admitted, and the request's
    /// conversation looked up; what the chain needs, gathered in one `Inbound`.
    #[expect(
        clippy::too_many_arguments,
        reason = "the request's parts and its per-request sinks, each used once"
    )]
    pub(super) async fn take_in(
        &self,
        snap: &Snapshot,
        endpoint: Endpoint,
        tenant: &str,
        req: Request<CallerBody>,
        rid: crate::observe::RequestId,
        (record, spent): (&mut Option<RequestRecord>, &mut Spent),
        obs: &RequestObs,
    ) -> Result<Inbound, ProxyError> {
        let cfg = &snap.cfg;
        // 4. Body: read once under the limit, parsed once into RequestMeta.
        let (parts, mut body) = req.into_parts();
        let verbatim = match &mut body {
            http_body_util::Either::Left(h1) => h1.take_verbatim(),
            http_body_util::Either::Right(_) => None,
        };
        let mut share =
            buffers::BufferShare::new(self.buffers.clone()).within(snap.buffer_part(tenant));
        let h2 = parts.version == http::Version::HTTP_2;
        let priority_of = || {
            let tenant_cfg = cfg.tenant(tenant);
            requested_priority(&parts.headers)
                .map_or(tenant_cfg.priority, |p| p.max(tenant_cfg.priority))
        };
        let body = match self
            .read_body(cfg, &parts.headers, h2, body, &mut share, (record, spent))
            .await
        {
            Ok(body) => body,
            Err(e @ ProxyError::BuffersFull { .. }) => {
                // Shed with 529 as the admission queue sheds: counted with them.
                self.metrics
                    .shed
                    .with_label_values(&[priority_of().as_str()])
                    .inc();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        crate::observe::capture::request_body(obs, snap, &parts.headers, &body);
        let meta = parse_meta(endpoint, &body)?;
        let label = snap.labels.shared_model(&meta.model);
        if let Some(r) = record.as_mut() {
            r.set_model(label.clone());
        }
        let priority = priority_of();
        // One write of the facts for all of these: each costs a lock and a compare-and-swap.
        obs.update(|f| {
            f.model = Some(meta.model.clone());
            f.model_label = label;
            f.max_tokens = meta.max_tokens;
            f.stream = meta.stream;
            f.priority = Some(priority.as_str());
        });
        // From the request's arrival, as its record counts it (one clock read per request).
        let arrived = record
            .as_ref()
            .map_or_else(tokio::time::Instant::now, |r| r.started().into());
        let deadline = deadline(&parts.headers, cfg.server.default_deadline, arrived);
        // 5. Admission: the tenant's limits, before anything is sent upstream.
        let tenant_cfg = cfg.tenant(tenant);
        // Counting tokens is never metered.
        let counting = matches!(endpoint.op, Operation::CountTokens | Operation::InputTokens);
        if !counting {
            let reservation = self
                .admit(snap, endpoint, tenant, &tenant_cfg, &meta, deadline)
                .await?;
            if let Some(r) = record.as_mut() {
                r.reserve(reservation);
            }
        }
        let store = &self.conversations;
        let conversation = Conversation::for_call(
            store,
            endpoint,
            &body,
            rid,
            (tenant, snap.several_tenants(), cfg.clients.is_empty()),
        )
        .await?;
        Ok(Inbound {
            conversation,
            answer_part: snap.answer_part(tenant),
            estimate_part: if counting {
                snap.estimate_part(tenant)
            } else {
                None
            },
            priority,
            endpoint,
            headers: parts.headers,
            verbatim,
            query: parts.uri.query().map(str::to_string),
            body,
            meta,
            deadline,
            _buffered: share,
            obs: obs.clone(),
        })
    }
}

/// What the request may cost at most, as admission holds it against the daily budget: its
/// estimated input and all the output it asks for (`output`), priced as the dearest step of its
/// chain, since any of them may serve it. A step without a price counts nothing, as its usage
/// is not counted against the budget either.
fn estimated_cost(cfg: &Config, endpoint: Endpoint, meta: &RequestMeta, output: u64) -> u128 {
    let Ok(resolved) = crate::route::resolve(cfg, endpoint.api, &meta.model) else {
        return 0;
    };
    let usage = crate::meter::Usage {
        input: meta.approx_input_tokens,
        output,
        ..Default::default()
    };
    resolved
        .steps()
        .iter()
        .filter_map(|step| crate::meter::price_for(&cfg.prices, step.target()))
        .map(|price| usage.cost_pico(&price))
        .max()
        .unwrap_or(0)
}

// Looked up by name: a `&str` name is parsed and validated again on every lookup.
const PRIORITY: http::HeaderName = http::HeaderName::from_static("x-legate-priority");
const DEADLINE_MS: http::HeaderName = http::HeaderName::from_static("x-legate-deadline-ms");
const STAINLESS_TIMEOUT: http::HeaderName = http::HeaderName::from_static("x-stainless-timeout");
const STAINLESS_READ_TIMEOUT: http::HeaderName =
    http::HeaderName::from_static("x-stainless-read-timeout");

/// `x-legate-priority`, if the caller sent a valid one.
pub(super) fn requested_priority(headers: &HeaderMap) -> Option<Priority> {
    headers
        .get(&PRIORITY)
        .and_then(|v| v.to_str().ok())
        .and_then(Priority::parse)
}

pub(super) fn parse_meta(endpoint: Endpoint, body: &[u8]) -> Result<RequestMeta, ProxyError> {
    let invalid = |e: crate::api::MetaError| ProxyError::InvalidRequest {
        message: e.to_string(),
    };
    let meta = match endpoint.op {
        Operation::Generate => endpoint
            .api
            .dialect()
            .parse_request(body)
            .map_err(invalid)?,
        Operation::CountTokens | Operation::InputTokens => parse_count_tokens(body)?,
        Operation::Models | Operation::Model | Operation::StoredResponse => {
            return Err(ProxyError::Internal);
        }
    };
    // No provider serves a model without a name: said here, before a step is chosen for it
    // (a route would otherwise send `""` on and name the step `provider:`).
    if meta.model.is_empty() {
        return Err(ProxyError::InvalidRequest {
            message: "the field `model` is empty; name the model to call".to_owned(),
        });
    }
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
        model: std::sync::Arc::from(parsed.model.as_ref()),
        stream: false,
        max_tokens: None,
        include_usage: false,
        approx_input_tokens: (body.len() as u64).div_ceil(4),
    })
}

/// `x-legate-deadline-ms` may shorten the configured deadline, never extend it; so does an
/// official SDK's own timeout, less a margin. The SDK retries a call it timed out on its own,
/// and each of its retries runs the whole chain again: answered 504 (`x-should-retry: false`)
/// a little before its timer fires, it does not. The SDKs say it in seconds, in two headers:
/// `x-stainless-timeout` (the TypeScript SDKs' whole timeout; the Python SDKs' only when set on
/// the call) and `x-stainless-read-timeout` (the Python SDKs' read timeout, which a whole answer
/// or a stream's first bytes must come within: legate sends nothing before either).
pub(super) fn deadline(
    headers: &HeaderMap,
    default: Duration,
    arrived: tokio::time::Instant,
) -> tokio::time::Instant {
    let asked = headers
        .get(&DEADLINE_MS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    let sdk = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(sdk_timeout)
    };
    let d = [asked, sdk(&STAINLESS_TIMEOUT), sdk(&STAINLESS_READ_TIMEOUT)]
        .into_iter()
        .flatten()
        .fold(default, Duration::min);
    arrived + d
}

/// The deadline an SDK's timeout header leaves legate: its seconds (an integer, or a decimal
/// from the Python SDKs) less 5 % (at most 2 s) and 200 ms, for the time the request took to
/// get here and the answer to get back, and at least half of them. None for anything else
/// (`NOT_GIVEN`, which the Python SDKs send when no timeout applies, or a number out of range).
fn sdk_timeout(v: &str) -> Option<Duration> {
    let secs: f64 = v.trim().parse().ok()?;
    if !(secs > 0.0 && secs < 1e9) {
        return None;
    }
    let left = (secs - (secs * 0.05).min(2.0) - 0.2).max(secs / 2.0);
    Some(Duration::from_secs_f64(left))
}
