//! `[log]`, `[telemetry]` and `[journal]`: how legate reports what it does (SPEC §12). Types
//! only; `[log]` and `[journal]` are read as they are, `validate/observe.rs` builds the
//! telemetry settings from `[telemetry]` and the standard `OTEL_*` variables.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[log]`: stderr log lines, the access log included.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A tracing-subscriber filter (`info`, `legate=debug,info`); `$LEGATE_LOG` / `$RUST_LOG`
    /// take precedence when set.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Json => "json",
            LogFormat::Text => "text",
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Json,
            level: "info".to_string(),
        }
    }
}

/// `[telemetry]`: OpenTelemetry export over OTLP/HTTP protobuf. Off unless an endpoint is set
/// (here or through `OTEL_EXPORTER_OTLP_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// Full URL spans are posted to (`…/v1/traces`), if export is on.
    pub traces_endpoint: Option<String>,
    /// Full URL metrics are posted to (`…/v1/metrics`), if export is on.
    pub metrics_endpoint: Option<String>,
    /// Extra request headers for the collector (often a credential: masked when shown).
    pub headers: Vec<(String, String)>,
    pub service_name: String,
    /// One export call may take this long before its batch is dropped.
    pub export_timeout: Duration,
    pub metrics_interval: Duration,
    /// Spans waiting for export; beyond it spans are dropped and counted.
    pub queue_size: usize,
}

impl TelemetryConfig {
    pub fn enabled(&self) -> bool {
        self.traces_endpoint.is_some() || self.metrics_endpoint.is_some()
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            traces_endpoint: None,
            metrics_endpoint: None,
            headers: Vec::new(),
            service_name: "legate".to_string(),
            export_timeout: Duration::from_secs(10),
            metrics_interval: Duration::from_secs(60),
            queue_size: 2048,
        }
    }
}

/// `[journal]`: the last requests, on the admin plane.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct JournalConfig {
    /// Requests kept (a ring: the oldest goes first). 0 turns the journal off.
    pub size: usize,
    pub capture: Capture,
    /// With capture on: bytes kept of each request and response body.
    #[serde(deserialize_with = "super::adapt::positive")]
    pub capture_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Capture {
    Off,
    /// Body prefixes, with configured keys and bearer tokens removed.
    Redacted,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            size: 1000,
            capture: Capture::Off,
            capture_bytes: 4096,
        }
    }
}

/// The three sections together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObserveConfig {
    pub log: LogConfig,
    pub telemetry: TelemetryConfig,
    pub journal: JournalConfig,
}
