//! Metrics (SPEC §8) registered on an injected prometheus `Registry`, so every server instance,
//! including each test's, has its own; and tracing initialisation for the binary.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// LLM calls take from milliseconds to many minutes: buckets reach 10 minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
];

/// legate's own overhead is sub-millisecond when healthy: buckets resolve tens of microseconds.
const OVERHEAD_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

/// Every metric legate exports. Label values are bounded by config (see `Labels`).
pub struct Metrics {
    pub requests: IntCounterVec,
    pub overhead: HistogramVec,
    pub request_duration: HistogramVec,
    pub upstream_attempts: IntCounterVec,
    pub upstream_duration: HistogramVec,
    pub ttft: HistogramVec,
    pub tokens: IntCounterVec,
    /// Cost is exported in USD as a float counter; the exact integer pico-USD lives in
    /// `/admin/usage`.
    pub cost: prometheus::CounterVec,
    pub inflight: IntGaugeVec,
    pub build_info: IntGaugeVec,
    pub retries: IntCounterVec,
    pub fallbacks: IntCounterVec,
    /// Cloud credentials obtained or refreshed, by provider and result (ok / error).
    pub credential_refreshes: IntCounterVec,
    pub breaker_state: IntGaugeVec,
    pub config_reloads: IntCounterVec,
    pub ratelimit_rejections: IntCounterVec,
    pub shed: IntCounterVec,
    pub queue_depth: IntGaugeVec,
    pub upstream_ratelimit_remaining: prometheus::GaugeVec,
    /// 1 while the shared (Redis) store is unreachable and local buckets are used.
    pub ratelimit_store_degraded: prometheus::IntGauge,
    /// Estimated input tokens / reported input tokens, per request.
    pub token_estimate_ratio: HistogramVec,
    pub translated: IntCounterVec,
    pub translation_drops: IntCounterVec,
    /// Requests a client sent as its own retry (`x-stainless-retry-count` above 0).
    pub client_retries: IntCounterVec,
    /// Open inbound connections per plane (data, admin).
    pub connections: IntGaugeVec,
    /// The request path's handles into the vectors above, resolved once per label combination.
    pub series: crate::series::Series,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Metrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "legate_requests_total",
                    "Requests answered, by inbound API, model, tenant and status (499: client went away)",
                ),
                &["api", "model", "tenant", "status"],
            )?,
            overhead: HistogramVec::new(
                HistogramOpts::new(
                    "legate_overhead_seconds",
                    "Time inside legate before the response headers, upstream time excluded",
                )
                .buckets(OVERHEAD_BUCKETS.to_vec()),
                &["api"],
            )?,
            request_duration: HistogramVec::new(
                HistogramOpts::new(
                    "legate_request_duration_seconds",
                    "Whole request duration, until the last body byte",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["api", "model"],
            )?,
            upstream_attempts: IntCounterVec::new(
                Opts::new(
                    "legate_upstream_attempts_total",
                    "Upstream attempts by outcome (ok, retryable, fatal, timeout, connect_error, breaker_open)",
                ),
                &["provider", "model", "outcome"],
            )?,
            upstream_duration: HistogramVec::new(
                HistogramOpts::new(
                    "legate_upstream_duration_seconds",
                    "Upstream request sent -> response headers",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["provider", "model"],
            )?,
            ttft: HistogramVec::new(
                HistogramOpts::new(
                    "legate_time_to_first_token_seconds",
                    "Request received -> first content event of a stream",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["provider", "model"],
            )?,
            tokens: IntCounterVec::new(
                Opts::new(
                    "legate_tokens_total",
                    "Tokens reported by providers, normalised (input excludes cache reads and writes)",
                ),
                &["tenant", "provider", "model", "kind"],
            )?,
            cost: prometheus::CounterVec::new(
                Opts::new(
                    "legate_cost_usd_total",
                    "Cost in USD from the [[prices]] table",
                ),
                &["tenant", "provider", "model"],
            )?,
            inflight: IntGaugeVec::new(
                Opts::new("legate_inflight_requests", "Upstream requests in flight"),
                &["provider"],
            )?,
            build_info: IntGaugeVec::new(
                Opts::new(
                    "legate_build_info",
                    "Always 1; the version label says which build",
                ),
                &["version"],
            )?,
            retries: IntCounterVec::new(
                Opts::new(
                    "legate_retries_total",
                    "Upstream attempts that were retries",
                ),
                &["provider", "model"],
            )?,
            credential_refreshes: IntCounterVec::new(
                Opts::new(
                    "legate_credential_refreshes_total",
                    "Cloud credentials obtained or refreshed, by provider and result",
                ),
                &["provider", "result"],
            )?,
            fallbacks: IntCounterVec::new(
                Opts::new(
                    "legate_fallbacks_total",
                    "Moves from one chain step to the next, by requested model",
                ),
                &["model", "from", "to"],
            )?,
            breaker_state: IntGaugeVec::new(
                Opts::new(
                    "legate_breaker_state",
                    "Circuit breaker per upstream: 0 closed, 1 open, 2 half-open",
                ),
                &["provider", "model"],
            )?,
            config_reloads: IntCounterVec::new(
                Opts::new(
                    "legate_config_reloads_total",
                    "Config reloads by result (ok, error)",
                ),
                &["result"],
            )?,
            ratelimit_rejections: IntCounterVec::new(
                Opts::new(
                    "legate_ratelimit_rejections_total",
                    "Requests refused by a tenant limit (requests, tokens, budget)",
                ),
                &["tenant", "limit"],
            )?,
            shed: IntCounterVec::new(
                Opts::new("legate_shed_total", "Requests shed by the admission queue"),
                &["priority"],
            )?,
            queue_depth: IntGaugeVec::new(
                Opts::new("legate_queue_depth", "Requests waiting for a provider slot"),
                &["priority"],
            )?,
            upstream_ratelimit_remaining: prometheus::GaugeVec::new(
                Opts::new(
                    "legate_upstream_ratelimit_remaining_ratio",
                    "Remaining share of the upstream's rate limit, from its response headers",
                ),
                &["provider", "kind"],
            )?,
            ratelimit_store_degraded: prometheus::IntGauge::new(
                "legate_ratelimit_store_degraded",
                "1 while the shared rate-limit store is unreachable and local buckets are used",
            )?,
            token_estimate_ratio: HistogramVec::new(
                HistogramOpts::new(
                    "legate_token_estimate_ratio",
                    "Estimated input tokens at admission / input tokens the provider reported",
                )
                .buckets(vec![0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0]),
                &["provider"],
            )?,
            translated: IntCounterVec::new(
                Opts::new(
                    "legate_translated_requests_total",
                    "Requests answered by a chain step of the other API, translated",
                ),
                &["from", "to"],
            )?,
            translation_drops: IntCounterVec::new(
                Opts::new(
                    "legate_translation_dropped_total",
                    "Request parts dropped by translation fitting rules (bounded set of names)",
                ),
                &["from", "to", "what"],
            )?,
            client_retries: IntCounterVec::new(
                Opts::new(
                    "legate_client_retries_total",
                    "Requests whose x-stainless-retry-count is above 0: a client retrying on top of legate",
                ),
                &["api", "tenant"],
            )?,
            connections: IntGaugeVec::new(
                Opts::new("legate_connections", "Open inbound connections"),
                &["plane"],
            )?,
            series: Default::default(),
        };
        registry.register(Box::new(m.client_retries.clone()))?;
        registry.register(Box::new(m.connections.clone()))?;
        registry.register(Box::new(m.translated.clone()))?;
        registry.register(Box::new(m.translation_drops.clone()))?;
        registry.register(Box::new(m.ratelimit_rejections.clone()))?;
        registry.register(Box::new(m.shed.clone()))?;
        registry.register(Box::new(m.queue_depth.clone()))?;
        registry.register(Box::new(m.upstream_ratelimit_remaining.clone()))?;
        registry.register(Box::new(m.ratelimit_store_degraded.clone()))?;
        registry.register(Box::new(m.token_estimate_ratio.clone()))?;
        registry.register(Box::new(m.config_reloads.clone()))?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.retries.clone()))?;
        registry.register(Box::new(m.fallbacks.clone()))?;
        registry.register(Box::new(m.credential_refreshes.clone()))?;
        registry.register(Box::new(m.breaker_state.clone()))?;
        registry.register(Box::new(m.overhead.clone()))?;
        registry.register(Box::new(m.request_duration.clone()))?;
        registry.register(Box::new(m.upstream_attempts.clone()))?;
        registry.register(Box::new(m.upstream_duration.clone()))?;
        registry.register(Box::new(m.ttft.clone()))?;
        registry.register(Box::new(m.tokens.clone()))?;
        registry.register(Box::new(m.cost.clone()))?;
        registry.register(Box::new(m.inflight.clone()))?;
        registry.register(Box::new(m.build_info.clone()))?;
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Both outcomes exist from the start, so an alert on errors sees a zero, not nothing.
        for result in ["ok", "error"] {
            m.config_reloads.with_label_values(&[result]);
        }
        for p in ["interactive", "background", "batch"] {
            m.queue_depth.with_label_values(&[p]);
        }
        for plane in ["data", "admin"] {
            m.connections.with_label_values(&[plane]);
        }
        Ok(m)
    }
}

/// Renders a registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec cannot fail for I/O reasons; a family that fails to encode is skipped.
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buf) {
        tracing::warn!(error = %e, "metrics encoding failed");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The log filter from a tracing-subscriber directive string (`info` when it does not parse),
/// with the directives no operator may override: the SigV4 signer traces canonical requests,
/// session token included, so its events are never shown, at any level.
pub fn log_filter(filter: &str) -> tracing_subscriber::EnvFilter {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match "aws_sigv4=off".parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    }
}

/// Installs the global tracing subscriber (stderr, filter from config::log_filter()).
pub fn init_tracing(filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter(filter))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
