//! The validated, typed runtime configuration. Built only by `validate.rs` from the raw
//! tree; everything downstream reads these types and never the raw values or the environment.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::adapt;
use super::secret::KeySource;
use crate::meter::Price;

pub use crate::api::ApiKind;

/// How the provider credential is sent upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthHeader {
    /// `x-api-key: KEY`
    XApiKey,
    /// `authorization: Bearer KEY`
    Bearer,
    /// `api-key: KEY` (Azure OpenAI)
    ApiKey,
}

/// Which trust anchors verify the provider's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsRoots {
    /// Mozilla's roots compiled in (webpki-roots): same answer on every machine.
    #[default]
    Webpki,
    /// The operating system's store (rustls-native-certs).
    Native,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub max_body_bytes: usize,
    pub default_deadline: Duration,
    pub shutdown_grace: Duration,
    /// Threads of the data plane's runtime (`TOKIO_WORKER_THREADS` overrides the file).
    pub worker_threads: usize,
    /// Limits that keep the process standing (SPEC §14).
    pub limits: ServerLimits,
}

/// `[server]` keys that bound what one peer can hold: connection deadlines and caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Request head (HTTP/1) or preface and first request (HTTP/2) must arrive within this.
    pub header_read_timeout: Duration,
    /// The whole request body must arrive within this.
    pub body_read_timeout: Duration,
    /// A connection with no request in flight is closed after this.
    pub connection_idle_timeout: Duration,
    /// Open data-plane connections; beyond it new ones wait in the accept backlog.
    pub max_connections: usize,
    /// Open admin-plane connections, counted apart so probes are never starved.
    pub admin_max_connections: usize,
    /// An upstream stream event (or unterminated line) larger than this breaks the stream.
    pub max_event_bytes: usize,
    /// Request bodies being read and held, all requests together; beyond it 529.
    pub max_buffered_bytes: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            connection_idle_timeout: Duration::from_secs(120),
            max_connections: 4096,
            admin_max_connections: 64,
            max_event_bytes: 4 << 20,
            max_buffered_bytes: 256 << 20,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// The table name under `[providers.NAME]`.
    pub name: String,
    pub kind: ApiKind,
    /// The cloud platform serving the API, or `Direct`.
    pub platform: super::cloud::Platform,
    /// Scheme + authority (+ optional path prefix), without a trailing slash.
    pub base_url: String,
    pub key: KeySource,
    pub auth_header: AuthHeader,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub max_concurrency: usize,
    pub tls_roots: TlsRoots,
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// An `openai` provider that serves `POST /v1/responses` (default). `false` (vLLM,
    /// Ollama): Responses callers are translated to Chat Completions for it.
    pub responses: bool,
}

/// One step of a model's chain: a provider, the model name sent to it, and how the request is
/// fitted to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainStep {
    /// `provider:model`, written once when the step is made (at config load for a configured
    /// step): headers, metrics, prices and the journal borrow it or share it, and a step
    /// copied for a request copies no string.
    target: Arc<str>,
    /// Length of the provider name at the start of `target` (a model name may hold `:`).
    provider_len: usize,
    /// Cap on `max_tokens` sent to this step.
    pub max_tokens: Option<u64>,
    /// Remove the `thinking` field before sending to this step.
    pub drop_thinking: bool,
}

impl ChainStep {
    pub fn new(provider: &str, model: &str, max_tokens: Option<u64>, drop_thinking: bool) -> Self {
        ChainStep {
            target: target_of(provider, model),
            provider_len: provider.len(),
            max_tokens,
            drop_thinking,
        }
    }

    /// The same step sending `model` instead.
    pub fn with_model(&self, model: &str) -> Self {
        ChainStep::new(self.provider(), model, self.max_tokens, self.drop_thinking)
    }

    pub fn provider(&self) -> &str {
        self.target.get(..self.provider_len).unwrap_or_default()
    }

    pub fn model(&self) -> &str {
        self.target.get(self.provider_len + 1..).unwrap_or_default()
    }

    /// `provider:model`, the form used in headers, metrics and prices.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// `target`, shared: cloning it copies no string.
    pub fn shared_target(&self) -> &Arc<str> {
        &self.target
    }
}

/// `provider:model` in one allocation: written on the stack when it is short (as a model name
/// is), then copied once into its shared string, instead of into a `String` and again into
/// the `Arc`.
fn target_of(provider: &str, model: &str) -> Arc<str> {
    let len = provider.len() + 1 + model.len();
    let mut buf = [0u8; 128];
    if let Some(out) = buf.get_mut(..len) {
        let (p, rest) = out.split_at_mut(provider.len());
        p.copy_from_slice(provider.as_bytes());
        if let Some((colon, m)) = rest.split_first_mut() {
            *colon = b':';
            m.copy_from_slice(model.as_bytes());
        }
        if let Ok(s) = std::str::from_utf8(out) {
            return Arc::from(s);
        }
    }
    let mut t = String::with_capacity(len);
    t.push_str(provider);
    t.push(':');
    t.push_str(model);
    Arc::from(t)
}

#[derive(Debug, Clone)]
pub struct ModelEntry {
    pub name: String,
    pub chain: Vec<ChainStep>,
}

#[derive(Debug, Clone)]
pub struct RoutingConfig {
    /// Provider for `/v1/messages` when the model has no `[[models]]` entry.
    pub anthropic: String,
    /// Provider for `/v1/chat/completions` when the model has no `[[models]]` entry.
    pub openai: String,
}

#[derive(Debug, Clone)]
pub struct ClientEntry {
    pub tenant: String,
    /// SHA-256 of the client key, 32 bytes.
    pub key_sha256: [u8; 32],
}

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    /// Keyed by provider name.
    pub providers: BTreeMap<String, ProviderConfig>,
    pub models: Vec<ModelEntry>,
    pub routing: RoutingConfig,
    pub clients: Vec<ClientEntry>,
    /// Keyed by `provider:model` (the model may be a `*` pattern).
    pub prices: BTreeMap<String, Price>,
    /// `[[limits]]`: output limits beyond (or instead of) the built-in table.
    pub limits: Vec<crate::limits::OutputLimit>,
    pub retry: RetryConfig,
    pub breaker: BreakerConfig,
    /// Always holds `default`; a tenant named by `[[clients]]` without its own table gets the
    /// default tenant's settings (and its own buckets).
    pub tenants: BTreeMap<String, TenantConfig>,
    pub ratelimit: RateLimitConfig,
    pub shedding: SheddingConfig,
    pub responses: ResponsesConfig,
    /// `[log]`, `[telemetry]`, `[journal]` (SPEC §12).
    pub observe: super::observe::ObserveConfig,
}

impl Config {
    /// The settings of `tenant` (falling back to `default`).
    pub fn tenant(&self, tenant: &str) -> TenantConfig {
        self.tenants
            .get(tenant)
            .or_else(|| self.tenants.get("default"))
            .cloned()
            .unwrap_or_default()
    }
}

/// `[retry]`: how one chain step is retried (SPEC §6).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Per chain step, first try included.
    #[serde(deserialize_with = "adapt::positive")]
    pub max_attempts: u32,
    #[serde(with = "adapt::positive_duration")]
    pub base_delay: Duration,
    #[serde(with = "adapt::positive_duration")]
    pub max_delay: Duration,
    /// A retry-after longer than this moves on to the next chain step instead of waiting.
    #[serde(with = "adapt::duration")]
    pub max_retry_after: Duration,
    /// Retries may add at most this share of extra upstream load (floor: 10 retries/s).
    #[serde(deserialize_with = "adapt::ratio")]
    pub budget_ratio: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(20),
            budget_ratio: 0.2,
        }
    }
}

/// `[breaker]`: the circuit breaker per upstream (provider + model).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    #[serde(with = "adapt::positive_duration")]
    pub window: Duration,
    #[serde(deserialize_with = "adapt::positive")]
    pub min_calls: u32,
    #[serde(deserialize_with = "adapt::ratio")]
    pub failure_ratio: f64,
    #[serde(with = "adapt::positive_duration")]
    pub open_for: Duration,
    #[serde(with = "adapt::positive_duration")]
    pub max_open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            window: Duration::from_secs(30),
            min_calls: 5,
            failure_ratio: 0.5,
            open_for: Duration::from_secs(30),
            max_open_for: Duration::from_secs(300),
        }
    }
}

/// A request's priority: the admission queue serves interactive before background before
/// batch, and sheds batch, then background, first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Interactive = 0,
    Background = 1,
    Batch = 2,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Interactive, Priority::Background, Priority::Batch];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Background => "background",
            Priority::Batch => "batch",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "interactive" => Some(Priority::Interactive),
            "background" => Some(Priority::Background),
            "batch" => Some(Priority::Batch),
            _ => None,
        }
    }
}

impl Serialize for Priority {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Read as the `x-legate-priority` header is: case and surrounding blanks do not matter.
impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Priority::parse(&s).ok_or_else(|| {
            serde::de::Error::custom("expected one of: interactive, background, batch")
        })
    }
}

/// `[tenants.NAME]`: limits of one tenant. 0 means unlimited.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    pub priority: Priority,
    pub requests_per_minute: u64,
    pub tokens_per_minute: u64,
    /// Exact integer pico-USD per UTC day.
    #[serde(rename = "daily_budget_usd", with = "adapt::usd")]
    pub daily_budget_pico: u128,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            priority: Priority::Interactive,
            requests_per_minute: 0,
            tokens_per_minute: 0,
            daily_budget_pico: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Memory,
    Redis,
}

/// `[ratelimit]`: where the tenants' buckets live.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    pub store: StoreKind,
    /// May carry a password: shown with its userinfo masked.
    #[serde(serialize_with = "adapt::masked_url")]
    pub redis_url: Option<String>,
    /// Output tokens reserved for a request that names no max_tokens.
    #[serde(deserialize_with = "adapt::positive")]
    pub default_output_reservation: u64,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            store: StoreKind::Memory,
            redis_url: None,
            default_output_reservation: 4096,
        }
    }
}

/// `[shedding]`: the admission queue and the pacer.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SheddingConfig {
    #[serde(deserialize_with = "adapt::positive")]
    pub queue_limit: usize,
    #[serde(deserialize_with = "adapt::ratio")]
    pub pace_below: f64,
}

impl Default for SheddingConfig {
    fn default() -> Self {
        SheddingConfig {
            queue_limit: 512,
            pace_below: 0.2,
        }
    }
}

/// `[responses]`: the conversation store of the Responses API (SPEC §11).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResponsesConfig {
    /// memory (one process) or redis (shared by replicas, at `ratelimit.redis_url`).
    pub store: StoreKind,
    /// Memory store: the oldest entries are evicted beyond this many bytes.
    #[serde(deserialize_with = "adapt::positive")]
    pub max_bytes: usize,
    #[serde(with = "adapt::positive_duration")]
    pub ttl: Duration,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig {
            store: StoreKind::Memory,
            max_bytes: 64 << 20,
            ttl: Duration::from_secs(3600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ChainStep;

    #[test]
    fn a_step_splits_its_target_at_the_provider() {
        let s = ChainStep::new("ollama", "qwen2.5:7b", Some(8), true);
        assert_eq!(
            (s.provider(), s.model(), s.target()),
            ("ollama", "qwen2.5:7b", "ollama:qwen2.5:7b")
        );
        let other = s.with_model("llama3");
        assert_eq!(other.target(), "ollama:llama3");
        assert_eq!((other.max_tokens, other.drop_thinking), (Some(8), true));
    }

    #[test]
    fn a_long_target_is_written_whole() {
        let model = "m".repeat(300);
        let s = ChainStep::new("p", &model, None, false);
        assert_eq!(s.target(), format!("p:{model}"));
        assert_eq!((s.provider(), s.model()), ("p", model.as_str()));
        let s = ChainStep::new("p", "", None, false);
        assert_eq!((s.target(), s.model()), ("p:", ""));
    }
}
