//! The validated, typed runtime configuration. Built only by `validate.rs` from the raw
//! tree; everything downstream reads these types and never the raw values or the environment.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::secret::KeySource;
use crate::meter::Price;

/// Which wire API a provider speaks (and which inbound API a request came in on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiKind {
    Anthropic,
    OpenAi,
}

impl ApiKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiKind::Anthropic => "anthropic",
            ApiKind::OpenAi => "openai",
        }
    }
}

/// How the provider credential is sent upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthHeader {
    /// `x-api-key: KEY`
    XApiKey,
    /// `authorization: Bearer KEY`
    Bearer,
}

/// Which trust anchors verify the provider's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRoots {
    /// Mozilla's roots compiled in (webpki-roots): same answer on every machine.
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
}

#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// The table name under `[providers.NAME]`.
    pub name: String,
    pub kind: ApiKind,
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
}

/// One step of a model's chain: a provider, the model name sent to it, and how the request is
/// fitted to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainStep {
    pub provider: String,
    pub model: String,
    /// Cap on `max_tokens` sent to this step.
    pub max_tokens: Option<u64>,
    /// Remove the `thinking` field before sending to this step.
    pub drop_thinking: bool,
}

impl ChainStep {
    /// `provider:model`, the form used in headers, metrics and prices.
    pub fn target(&self) -> String {
        format!("{}:{}", self.provider, self.model)
    }
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
    /// Keyed by `provider:model`.
    pub prices: BTreeMap<String, Price>,
    pub retry: RetryConfig,
    pub breaker: BreakerConfig,
}

/// `[retry]`: how one chain step is retried (SPEC §6).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// Per chain step, first try included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// A retry-after longer than this moves on to the next chain step instead of waiting.
    pub max_retry_after: Duration,
    /// Retries may add at most this share of extra upstream load (floor: 10 retries/s).
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
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    pub window: Duration,
    pub min_calls: u32,
    pub failure_ratio: f64,
    pub open_for: Duration,
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
