//! The configuration file as serde reads it: one struct per table, one field per key, unknown
//! keys refused (`deny_unknown_fields`), defaults as documented. Sections whose runtime shape is
//! the file's (`[retry]`, `[breaker]`, `[tenants.*]`, `[ratelimit]`, `[shedding]`,
//! `[responses]`, `[log]`, `[journal]`) are their runtime types; the others are mirrored here
//! and turned into runtime types by `validate`, which also does every check that spans keys.
//!
//! The same structs, filled from a validated [`super::Config`], are what `legate check`
//! serialises: a key added here is read, defaulted and shown.
//!
//! A key that must be present is an `Option` here and reported as missing by `validate`, so
//! that a missing key is one problem among all the others instead of the end of reading.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::adapt::{self, PerMtok};
use super::observe::{JournalConfig, LogConfig};
use super::secret::Secret;
use super::{
    AuthHeader, BreakerConfig, RateLimitConfig, ResponsesConfig, RetryConfig, SheddingConfig,
    TenantConfig, TlsRoots,
};

/// The whole file. Sections are tables or arrays of tables, in the order `check` prints them.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerFile,
    pub providers: BTreeMap<String, ProviderFile>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelFile>,
    pub routing: RoutingFile,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientFile>,
    pub tenants: BTreeMap<String, TenantConfig>,
    pub ratelimit: RateLimitConfig,
    pub shedding: SheddingConfig,
    pub responses: ResponsesConfig,
    pub retry: RetryConfig,
    pub breaker: BreakerConfig,
    pub log: LogConfig,
    pub telemetry: TelemetryFile,
    pub journal: JournalConfig,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prices: Vec<PriceFile>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitFile>,
}

/// `[server]`: listeners, per-request limits and the limits of SPEC §14.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerFile {
    #[serde(with = "adapt::socket_addr")]
    pub listen: SocketAddr,
    #[serde(with = "adapt::socket_addr")]
    pub admin_listen: SocketAddr,
    pub max_body_bytes: NonZeroUsize,
    #[serde(with = "adapt::positive_duration")]
    pub default_deadline: Duration,
    /// Zero is meaningful: stop at once without waiting for in-flight requests.
    #[serde(with = "adapt::duration")]
    pub shutdown_grace: Duration,
    /// Checked against [`WORKER_THREADS_MAX`] by `validate`, so that 0 gets a message.
    pub worker_threads: usize,
    #[serde(with = "adapt::positive_duration")]
    pub header_read_timeout: Duration,
    #[serde(with = "adapt::positive_duration")]
    pub body_read_timeout: Duration,
    #[serde(with = "adapt::positive_duration")]
    pub connection_idle_timeout: Duration,
    pub max_connections: NonZeroUsize,
    pub admin_max_connections: NonZeroUsize,
    pub max_event_bytes: NonZeroUsize,
    pub max_buffered_bytes: NonZeroUsize,
}

/// The most runtime threads `server.worker_threads` may ask for: far beyond any core count
/// legate is useful on, low enough that a typo cannot exhaust the process's threads.
pub const WORKER_THREADS_MAX: usize = 256;

/// A non-zero constant (`NonZeroUsize::new` is const, its unwrap is not allowed here).
const fn nz(n: usize) -> NonZeroUsize {
    match NonZeroUsize::new(n) {
        Some(n) => n,
        None => NonZeroUsize::MIN,
    }
}

impl Default for ServerFile {
    fn default() -> Self {
        let limits = super::ServerLimits::default();
        ServerFile {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8787),
            admin_listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9787),
            max_body_bytes: nz(32 * 1024 * 1024),
            default_deadline: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(30),
            worker_threads: 1,
            header_read_timeout: limits.header_read_timeout,
            body_read_timeout: limits.body_read_timeout,
            connection_idle_timeout: limits.connection_idle_timeout,
            max_connections: nz(limits.max_connections),
            admin_max_connections: nz(limits.admin_max_connections),
            max_event_bytes: nz(limits.max_event_bytes),
            max_buffered_bytes: nz(limits.max_buffered_bytes),
        }
    }
}

/// A provider `kind` as written: a wire API, or a platform serving one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    Anthropic,
    Openai,
    Bedrock,
    Vertex,
    AzureOpenai,
}

/// `[providers.NAME]`. The platform keys (region, project, …) belong to the cloud kinds only;
/// `validate` refuses them on the others.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderFile {
    /// May be left out by the providers named `anthropic` and `openai`.
    pub kind: Option<ProviderKind>,
    #[serde(serialize_with = "adapt::masked_url")]
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub auth_header: Option<AuthHeader>,
    #[serde(with = "adapt::positive_duration")]
    pub connect_timeout: Duration,
    #[serde(with = "adapt::positive_duration")]
    pub first_byte_timeout: Duration,
    #[serde(with = "adapt::positive_duration")]
    pub idle_timeout: Duration,
    #[serde(with = "adapt::positive_duration")]
    pub pool_idle_timeout: Duration,
    pub max_concurrency: NonZeroUsize,
    pub tls_roots: TlsRoots,
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// `openai` kinds: whether the server has `POST /v1/responses` (default true).
    pub responses: Option<bool>,
    pub region: Option<String>,
    pub project: Option<String>,
    pub anthropic_version: Option<String>,
    pub api_version: Option<String>,
    pub deployments: Option<Vec<DeploymentFile>>,
    pub credentials_file: Option<PathBuf>,
    #[serde(serialize_with = "adapt::masked_url")]
    pub sts_endpoint: Option<String>,
    #[serde(serialize_with = "adapt::masked_url")]
    pub credentials_url: Option<String>,
    #[serde(serialize_with = "adapt::masked_url")]
    pub metadata_url: Option<String>,
    #[serde(serialize_with = "adapt::masked_url")]
    pub token_url: Option<String>,
}

impl Default for ProviderFile {
    fn default() -> Self {
        ProviderFile {
            kind: None,
            base_url: None,
            api_key_env: None,
            api_key_file: None,
            auth_header: None,
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            pool_idle_timeout: Duration::from_secs(60),
            max_concurrency: nz(256),
            tls_roots: TlsRoots::Webpki,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            responses: None,
            region: None,
            project: None,
            anthropic_version: None,
            api_version: None,
            deployments: None,
            credentials_file: None,
            sts_endpoint: None,
            credentials_url: None,
            metadata_url: None,
            token_url: None,
        }
    }
}

/// `deployments = [{ model = "gpt-4o", deployment = "gpt4o-prod" }, …]`: an array of tables,
/// because model names contain dots that table keys would split.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeploymentFile {
    pub model: Option<String>,
    pub deployment: Option<String>,
}

/// `[[models]]`: a model name and its fallback chain.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelFile {
    pub name: Option<String>,
    pub chain: Option<Vec<StepFile>>,
}

/// One chain step: `"provider:model"` or a table that fits the request to the step.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum StepFile {
    Target(String),
    Fitted(StepTable),
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StepTable {
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<NonZeroU64>,
    pub drop_thinking: bool,
}

/// Read by hand rather than `untagged`, which would buffer the value and lose the key paths of
/// problems inside the table.
impl<'de> Deserialize<'de> for StepFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StepFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"provider:model\" or { target = \"provider:model\", … }")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StepFile, E> {
                Ok(StepFile::Target(s.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StepFile, A::Error> {
                StepTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(StepFile::Fitted)
            }
        }
        d.deserialize_any(V)
    }
}

/// `[routing]`: the provider of each inbound API for model names without an entry. Left out:
/// the provider named after the API, else the only provider of that kind.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingFile {
    pub anthropic: Option<String>,
    pub openai: Option<String>,
}

/// `[[clients]]`: a local caller's key, as a SHA-256 digest, and its tenant.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientFile {
    pub tenant: Option<String>,
    /// Shown by its first 8 hex digits only.
    #[serde(serialize_with = "digest_prefix")]
    pub key_sha256: Option<String>,
}

fn digest_prefix<S: serde::Serializer>(d: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&format!("{}…", d.get(..8).unwrap_or(""))),
        None => s.serialize_none(),
    }
}

/// `[[prices]]`: USD per million tokens of one `provider:model`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PriceFile {
    pub model: Option<String>,
    pub input: Option<PerMtok>,
    pub output: Option<PerMtok>,
    pub cache_write: PerMtok,
    pub cache_read: PerMtok,
}

/// `[[limits]]`: the largest `max_tokens` a model (or `*` pattern) accepts.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitFile {
    pub model: Option<String>,
    pub max_output_tokens: Option<NonZeroU64>,
}

/// `[telemetry]`. A key left out falls back to its standard `OTEL_*` variable, then to the
/// default, so absence is kept.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryFile {
    #[serde(serialize_with = "adapt::masked_url")]
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
    #[serde(with = "adapt::positive_duration::option")]
    pub export_timeout: Option<Duration>,
    #[serde(with = "adapt::positive_duration::option")]
    pub metrics_interval: Option<Duration>,
    pub queue_size: Option<NonZeroUsize>,
    /// Request headers for the collector; their values are usually credentials.
    pub headers: Option<BTreeMap<String, Secret>>,
}
