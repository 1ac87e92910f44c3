//! `[log]`, `[telemetry]` and `[journal]`. The standard OpenTelemetry variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `…_TRACES_ENDPOINT`, `…_METRICS_ENDPOINT`, `…_HEADERS`,
//! `…_TIMEOUT`, `…_PROTOCOL`, `OTEL_SERVICE_NAME`, `OTEL_METRIC_EXPORT_INTERVAL`,
//! `OTEL_SDK_DISABLED`) are read here, so the rest of legate never looks at the environment;
//! a key in the file wins over its variable.

use std::time::Duration;

use super::reader::{self, Cx, Table};
use crate::config::observe::{
    Capture, JournalConfig, LogConfig, LogFormat, ObserveConfig, TelemetryConfig,
};

/// Largest capture prefix: the journal holds `size` of them, twice.
const MAX_CAPTURE_BYTES: usize = 1 << 20;

pub(crate) fn parse(
    log: Option<Table>,
    telemetry: Option<Table>,
    journal: Option<Table>,
    cx: &mut Cx,
) -> ObserveConfig {
    ObserveConfig {
        log: log.map(|t| parse_log(t, cx)).unwrap_or_default(),
        telemetry: parse_telemetry(telemetry.unwrap_or_else(|| Table::absent("telemetry")), cx),
        journal: journal.map(|t| parse_journal(t, cx)).unwrap_or_default(),
    }
}

fn parse_log(mut t: Table, cx: &mut Cx) -> LogConfig {
    let d = LogConfig::default();
    let format = match t.opt(cx, "format", reader::string).as_deref() {
        None => d.format,
        Some("json") => LogFormat::Json,
        Some("text") => LogFormat::Text,
        Some(other) => {
            cx.err(
                &t.child("format"),
                format!("`{other}` is not a log format (json or text)"),
            );
            d.format
        }
    };
    let level = match t.opt(cx, "level", reader::non_empty_string) {
        Some(l) if tracing_subscriber::EnvFilter::try_new(&l).is_err() => {
            cx.err(
                &t.child("level"),
                format!("`{l}` is not a log filter (e.g. info, warn, legate=debug)"),
            );
            d.level
        }
        Some(l) => l,
        None => d.level,
    };
    t.finish(cx);
    LogConfig { format, level }
}

fn parse_journal(mut t: Table, cx: &mut Cx) -> JournalConfig {
    let d = JournalConfig::default();
    let size = t
        .opt(cx, "size", reader::uint)
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        .unwrap_or(d.size);
    if size > 1_000_000 {
        cx.err(&t.child("size"), "at most 1000000 requests are kept");
    }
    let capture = match t.opt(cx, "capture", reader::string).as_deref() {
        None | Some("off") => Capture::Off,
        Some("redacted") => Capture::Redacted,
        Some(other) => {
            cx.err(
                &t.child("capture"),
                format!("`{other}` is not a capture mode (off or redacted)"),
            );
            Capture::Off
        }
    };
    let capture_bytes = t
        .opt(cx, "capture_bytes", reader::positive_usize)
        .unwrap_or(d.capture_bytes);
    if capture_bytes > MAX_CAPTURE_BYTES {
        cx.err(
            &t.child("capture_bytes"),
            format!("at most {MAX_CAPTURE_BYTES} bytes per body are kept"),
        );
    }
    t.finish(cx);
    JournalConfig {
        size,
        capture,
        capture_bytes,
    }
}

fn parse_telemetry(mut t: Table, cx: &mut Cx) -> TelemetryConfig {
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

    let base = t.opt(cx, "otlp_endpoint", reader::non_empty_string);
    let (traces_endpoint, metrics_endpoint) = match base {
        Some(b) => {
            let path = t.child("otlp_endpoint");
            check_url(&b, &path, cx);
            (Some(join(&b, "v1/traces")), Some(join(&b, "v1/metrics")))
        }
        None => {
            let from_base = |signal: &str| env_base.as_ref().map(|b| join(b, signal));
            let traces = env_traces.clone().or_else(|| from_base("v1/traces"));
            let metrics = env_metrics.clone().or_else(|| from_base("v1/metrics"));
            for (var, url) in [
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces),
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", &metrics),
            ] {
                if let Some(u) = url {
                    check_url(u, var, cx);
                }
            }
            (traces, metrics)
        }
    };
    if let Some(p) = protocol.filter(|p| p.trim() != "http/protobuf") {
        if traces_endpoint.is_some() && !disabled {
            cx.err(
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                format!("`{p}` is not supported; legate exports OTLP over http/protobuf"),
            );
        }
    }
    let in_file = t.keys().contains(&"headers");
    let headers = match t.table(cx, "headers") {
        Some(h) if in_file => read_headers(h, cx),
        _ => env_headers
            .as_deref()
            .map(parse_header_list)
            .unwrap_or_default(),
    };
    let service_name = t
        .opt(cx, "service_name", reader::non_empty_string)
        .or(env_service)
        .unwrap_or_else(|| d.service_name.clone());
    let export_timeout = t
        .opt(cx, "export_timeout", reader::positive_duration)
        .or_else(|| env_millis(env_timeout.as_deref(), "OTEL_EXPORTER_OTLP_TIMEOUT", cx))
        .unwrap_or(d.export_timeout);
    let metrics_interval = t
        .opt(cx, "metrics_interval", reader::positive_duration)
        .or_else(|| env_millis(env_interval.as_deref(), "OTEL_METRIC_EXPORT_INTERVAL", cx))
        .unwrap_or(d.metrics_interval);
    let queue_size = t
        .opt(cx, "queue_size", reader::positive_usize)
        .unwrap_or(d.queue_size);
    t.finish(cx);
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

fn check_url(url: &str, path: &str, cx: &mut Cx) {
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.parse::<http::Uri>().is_ok_and(|u| u.host().is_some());
    if !ok {
        cx.err(
            path,
            "expected an http:// or https:// URL of an OTLP collector (e.g. http://127.0.0.1:4318)",
        );
    }
}

fn read_headers(mut h: Table, cx: &mut Cx) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for key in h.keys() {
        if let Some(v) = h.opt(cx, key, reader::string) {
            if http::HeaderName::from_bytes(key.as_bytes()).is_err()
                || http::HeaderValue::from_str(&v).is_err()
            {
                cx.err(&h.child(key), "not a valid HTTP header");
                continue;
            }
            out.push((key.to_string(), v));
        }
    }
    h.finish(cx);
    out
}

/// `k1=v1,k2=v2` (values may be percent-encoded per the OTel spec; `%20` and friends decoded).
fn parse_header_list(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), percent_decode(v.trim())))
        .filter(|(k, v)| {
            http::HeaderName::from_bytes(k.as_bytes()).is_ok()
                && http::HeaderValue::from_str(v).is_ok()
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn env_millis(v: Option<&str>, var: &str, cx: &mut Cx) -> Option<Duration> {
    let v = v?;
    match v.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Some(Duration::from_millis(ms)),
        _ => {
            cx.err(
                var,
                format!("`{v}` is not a positive number of milliseconds"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use crate::config::load_str;
    use crate::config::observe::{Capture, LogFormat};

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_json_logs_no_export_and_a_thousand_requests_without_capture() {
        let cfg = load_str("", &env(&[])).unwrap();
        assert_eq!(cfg.observe.log.format, LogFormat::Json);
        assert!(!cfg.observe.telemetry.enabled());
        assert_eq!(cfg.observe.journal.size, 1000);
        assert_eq!(cfg.observe.journal.capture, Capture::Off);
    }

    #[test]
    fn the_file_endpoint_wins_over_the_standard_variables() {
        let cfg = load_str(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/\"\n",
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318")]),
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
            &env(&[
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
            &env(&[
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
            &env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
        ) else {
            panic!("invalid config loaded");
        };
        for path in [
            "log.format",
            "journal.capture",
            "journal.size",
            "telemetry.otlp_endpoint",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            assert!(e.has_path(path), "{path} not reported: {e}");
        }
    }
}
