//! `[log]`, `[telemetry]` and `[journal]`. The standard OpenTelemetry variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `…_TRACES_ENDPOINT`, `…_METRICS_ENDPOINT`, `…_HEADERS`,
//! `…_TIMEOUT`, `…_PROTOCOL`, `OTEL_SERVICE_NAME`, `OTEL_METRIC_EXPORT_INTERVAL`,
//! `OTEL_SDK_DISABLED`) are read here, so the rest of legate never looks at the environment;
//! a key in the file wins over its variable.

use std::time::Duration;

use super::Cx;
use crate::config::file::TelemetryFile;
use crate::config::observe::{JournalConfig, LogConfig, ObserveConfig, TelemetryConfig};

/// The most spans that may wait for export.
const MAX_QUEUE: usize = 1 << 20;

/// Largest capture prefix: the journal holds `size` of them, twice.
const MAX_CAPTURE_BYTES: usize = 1 << 20;

/// A directive of `filter` that is a word alone (no `=level`, no span filter) but no level,
/// and not a module of legate's (a deliberate `legate` or `legate::…`): `warning`, `warn-only`
/// or a pasted key would each log one unknown module alone.
fn bare_word(filter: &str) -> Option<&str> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    filter.split(',').map(str::trim).find(|d| {
        !d.is_empty()
            && !d.contains(['=', '['])
            && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(d))
            && *d != "legate"
            && !d.starts_with("legate::")
    })
}

pub(crate) fn build(
    log: LogConfig,
    telemetry: &TelemetryFile,
    journal: JournalConfig,
    cx: &mut Cx,
) -> ObserveConfig {
    if log.level.trim().is_empty() {
        cx.err("log.level", "must not be empty");
    } else if tracing_subscriber::EnvFilter::try_new(&log.level).is_err() {
        cx.err(
            "log.level",
            "not a log filter (e.g. info, warn, legate=debug)",
        );
    } else if let Some(word) = bare_word(&log.level) {
        // The filter syntax reads a bare word as a module name: `warning` would log that
        // module alone, and every line legate writes (the access log too) would be lost.
        cx.err(
            "log.level",
            format!(
                "`{}` is not a level (trace, debug, info, warn, error, off); a word alone \
                 names a module, whose lines alone would be logged: write `warn`, or \
                 `module=level`",
                crate::config::shown::shown(word)
            ),
        );
    }
    if journal.size > 1_000_000 {
        cx.err("journal.size", "at most 1000000 requests are kept");
    }
    if journal.capture_bytes > MAX_CAPTURE_BYTES {
        cx.err(
            "journal.capture_bytes",
            format!("at most {MAX_CAPTURE_BYTES} bytes per body are kept"),
        );
    }
    ObserveConfig {
        log,
        telemetry: build_telemetry(telemetry, cx),
        journal,
    }
}

fn build_telemetry(t: &TelemetryFile, cx: &mut Cx) -> TelemetryConfig {
    let d = TelemetryConfig::default();
    let env = |name: &str| cx.env.get(name).filter(|v| !v.trim().is_empty()).cloned();
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let protocol = env("OTEL_EXPORTER_OTLP_PROTOCOL");
    let env_base = env("OTEL_EXPORTER_OTLP_ENDPOINT");
    let env_traces = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let env_metrics = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    let env_headers = env("OTEL_EXPORTER_OTLP_HEADERS");
    let env_timeout = env("OTEL_EXPORTER_OTLP_TIMEOUT");
    let env_service = env("OTEL_SERVICE_NAME");
    let env_interval = env("OTEL_METRIC_EXPORT_INTERVAL");

    let (traces_endpoint, metrics_endpoint) = match &t.otlp_endpoint {
        Some(b) => {
            check_base(b, "telemetry.otlp_endpoint", cx);
            (Some(join(b, "v1/traces")), Some(join(b, "v1/metrics")))
        }
        None => {
            // Each URL is checked under the variable the operator set.
            if let Some(b) = &env_base {
                check_base(b, "OTEL_EXPORTER_OTLP_ENDPOINT", cx);
            }
            for (var, url) in [
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &env_traces),
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", &env_metrics),
            ] {
                if let Some(u) = url {
                    check_url(u, var, cx);
                }
            }
            let from_base = |signal: &str| env_base.as_ref().map(|b| join(b, signal));
            let traces = env_traces.clone().or_else(|| from_base("v1/traces"));
            let metrics = env_metrics.clone().or_else(|| from_base("v1/metrics"));
            (traces, metrics)
        }
    };
    // The general variable and each signal's own (which the OpenTelemetry spec lets override
    // it): a collector's gRPC port sent http/protobuf would refuse every export.
    let protocols = [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            protocol,
            traces_endpoint.is_some(),
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
            traces_endpoint.is_some(),
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"),
            metrics_endpoint.is_some(),
        ),
    ];
    for (var, value, exported) in protocols {
        if let Some(p) = value.filter(|p| p.trim() != "http/protobuf")
            && exported
            && !disabled
        {
            cx.err(
                var,
                format!(
                    "`{}` is not supported; legate exports OTLP over http/protobuf",
                    crate::config::shown::shown(&p)
                ),
            );
        }
    }
    let headers = match &t.headers {
        Some(h) => {
            let mut out = Vec::new();
            for (name, value) in h {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                    || http::HeaderValue::from_str(value.expose()).is_err()
                {
                    cx.err(
                        &format!("telemetry.headers.{name}"),
                        "not a valid HTTP header",
                    );
                    continue;
                }
                out.push((name.clone(), value.expose().to_owned()));
            }
            out
        }
        None => {
            let (headers, bad) = env_headers
                .as_deref()
                .map(parse_header_list)
                .unwrap_or_default();
            if !bad.is_empty() {
                // Dropped in silence, the collector's credentials went missing and its 401s
                // were the first sign. Positions only: a value may be a token.
                let at: Vec<String> = bad.iter().map(ToString::to_string).collect();
                cx.err(
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    format!(
                        "entry {} is not `name=value` with a header name and a value HTTP allows (values percent-encoded); entries are comma-separated",
                        at.join(", ")
                    ),
                );
            }
            headers
        }
    };
    let service_name = match &t.service_name {
        Some(s) if s.trim().is_empty() => {
            cx.err("telemetry.service_name", "must not be empty");
            d.service_name.clone()
        }
        Some(s) => s.clone(),
        None => env_service.unwrap_or_else(|| d.service_name.clone()),
    };
    let export_timeout = t
        .export_timeout
        .or_else(|| env_millis(env_timeout.as_deref(), "OTEL_EXPORTER_OTLP_TIMEOUT", cx))
        .unwrap_or(d.export_timeout);
    let metrics_interval = t
        .metrics_interval
        .or_else(|| env_millis(env_interval.as_deref(), "OTEL_METRIC_EXPORT_INTERVAL", cx))
        .unwrap_or(d.metrics_interval);
    let queue_size = t.queue_size.map_or(d.queue_size, |n| n.get());
    // Spans are held in memory (a few hundred bytes each), and a count past tokio's channel
    // limit made the start panic.
    if queue_size > MAX_QUEUE {
        cx.err(
            "telemetry.queue_size",
            format!("at most {MAX_QUEUE} spans wait for export, not {queue_size}"),
        );
    }
    if disabled {
        return TelemetryConfig {
            traces_endpoint: None,
            metrics_endpoint: None,
            ..d
        };
    }
    TelemetryConfig {
        traces_endpoint,
        metrics_endpoint,
        headers,
        service_name,
        export_timeout,
        metrics_interval,
        queue_size,
    }
}

/// `base` + `/` + `signal`, whatever `base` ends with (the OTLP convention for the base URL).
fn join(base: &str, signal: &str) -> String {
    format!("{}/{signal}", base.trim_end_matches('/'))
}

/// A base URL, to which `/v1/traces` and `/v1/metrics` are appended: a query would end up
/// before them.
fn check_base(url: &str, path: &str, cx: &mut Cx) {
    check_url(url, path, cx);
    if url.contains('?') {
        cx.err(
            path,
            "a base URL takes no query (the signal's path is appended to it); give the collector's credentials as headers",
        );
    }
}

fn check_url(url: &str, path: &str, cx: &mut Cx) {
    let parsed = url.parse::<http::Uri>().ok();
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && parsed.as_ref().is_some_and(|u| u.host().is_some());
    if !ok {
        cx.err(
            path,
            "expected an http:// or https:// URL of an OTLP collector (e.g. http://127.0.0.1:4318)",
        );
    } else if parsed
        .and_then(|u| u.authority().cloned())
        .is_some_and(|a| a.as_str().contains('@'))
    {
        // Never sent as credentials by the exporter, and a URL reaches logs whole.
        cx.err(
            path,
            "must not carry credentials (user:password@); give the collector's in [telemetry.headers] or OTEL_EXPORTER_OTLP_HEADERS",
        );
    }
}

/// `k1=v1,k2=v2` (values may be percent-encoded per the OTel spec; `%20` and friends decoded).
/// The entries that are headers, and the 1-based positions of those that are not (empty
/// entries, as a trailing comma leaves, are skipped).
fn parse_header_list(s: &str) -> (Vec<(String, String)>, Vec<usize>) {
    let (mut headers, mut bad) = (Vec::new(), Vec::new());
    for (i, kv) in s.split(',').enumerate() {
        if kv.trim().is_empty() {
            continue;
        }
        let header = kv
            .split_once('=')
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), percent_decode(v.trim())))
            .filter(|(k, v)| {
                http::HeaderName::from_bytes(k.as_bytes()).is_ok()
                    && http::HeaderValue::from_str(v).is_ok()
            });
        match header {
            Some(h) => headers.push(h),
            None => bad.push(i + 1),
        }
    }
    (headers, bad)
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn env_millis(v: Option<&str>, var: &str, cx: &mut Cx) -> Option<Duration> {
    let v = v?;
    match v.trim().parse::<u64>() {
        Ok(ms) if ms > 0 && Duration::from_millis(ms) <= crate::config::adapt::MAX_DURATION => {
            Some(Duration::from_millis(ms))
        }
        _ => {
            cx.err(
                var,
                "not a positive number of milliseconds (at most one year)",
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {

    use crate::config::load::env_of;
    use crate::config::load_str;
    use crate::config::observe::{Capture, LogFormat};

    #[test]
    fn defaults_are_json_logs_no_export_and_a_thousand_requests_without_capture() {
        let cfg = load_str("", &env_of(&[])).unwrap();
        assert_eq!(cfg.observe.log.format, LogFormat::Json);
        assert!(!cfg.observe.telemetry.enabled());
        assert_eq!(cfg.observe.journal.size, 1000);
        assert_eq!(cfg.observe.journal.capture, Capture::Off);
    }

    #[test]
    fn the_file_endpoint_wins_over_the_standard_variables() {
        let cfg = load_str(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/\"\n",
            &env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318")]),
        )
        .unwrap();
        let t = &cfg.observe.telemetry;
        assert_eq!(
            t.traces_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            t.metrics_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/metrics")
        );
    }

    #[test]
    fn standard_variables_turn_export_on() {
        let cfg = load_str(
            "",
            &env_of(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4318/x"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20abc,x-a=1",
                ),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                ("OTEL_SERVICE_NAME", "agent-sidecar"),
            ]),
        )
        .unwrap();
        let t = &cfg.observe.telemetry;
        assert_eq!(t.traces_endpoint.as_deref(), Some("http://t:4318/x"));
        assert_eq!(
            t.metrics_endpoint.as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        assert_eq!(
            t.headers,
            vec![
                ("authorization".to_string(), "Bearer abc".to_string()),
                ("x-a".to_string(), "1".to_string())
            ]
        );
        assert_eq!(t.export_timeout.as_millis(), 2500);
        assert_eq!(t.service_name, "agent-sidecar");
        let off = load_str(
            "",
            &env_of(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_SDK_DISABLED", "true"),
            ]),
        )
        .unwrap();
        assert!(!off.observe.telemetry.enabled());
    }

    #[test]
    fn bad_values_are_reported_with_their_key_paths() {
        let Err(e) = load_str(
            "[log]\nformat = \"xml\"\nlevel = \"legate=loud\"\n[journal]\ncapture = \"all\"\nsize = 2000000\n[telemetry]\notlp_endpoint = \"collector:4318\"\n",
            &env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
        ) else {
            panic!("invalid config loaded");
        };
        for path in [
            "log.format",
            "log.level",
            "journal.capture",
            "journal.size",
            "telemetry.otlp_endpoint",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            assert!(e.has_path(path), "{path} not reported: {e}");
        }
    }
}
