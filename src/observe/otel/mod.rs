//! OpenTelemetry export (SPEC §12): a span per request and a child span per upstream attempt
//! with the GenAI semantic-convention attributes and `legate.*` ones, and the GenAI client
//! metrics — all over OTLP/HTTP protobuf. Spans are built once the request is over, from its
//! facts, with the ids allocated while it ran (the attempt's id already went upstream in
//! `traceparent`), so nothing on the request path waits on the SDK.

mod export;

use std::time::Duration;

use opentelemetry::metrics::{Histogram, MeterProvider};
use opentelemetry::trace::Span as _;
use opentelemetry::trace::{
    SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceState, Tracer, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use prometheus::IntCounterVec;

use super::facts::{AttemptFacts, Facts, TraceIds};
use super::traceparent::{span_id, trace_id};
use crate::config::observe::TelemetryConfig;

pub struct Otel {
    traces: Option<(SdkTracerProvider, SdkTracer)>,
    span_task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
    metrics: Option<(SdkMeterProvider, Instruments)>,
}

struct Instruments {
    duration: Histogram<f64>,
    tokens: Histogram<u64>,
    first_chunk: Histogram<f64>,
}

/// Buckets of the GenAI conventions.
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

impl Otel {
    /// Starts the exporters (inside the Tokio runtime). `dropped` is
    /// `legate_telemetry_dropped_total{signal}`.
    pub fn start(cfg: &TelemetryConfig, dropped: &IntCounterVec) -> Result<Self, String> {
        let http = export::OtlpHttp::new(cfg.export_timeout)?;
        let headers: std::collections::HashMap<String, String> =
            cfg.headers.iter().cloned().collect();
        let resource = Resource::builder()
            .with_service_name(cfg.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let mut span_task = None;
        let traces = match &cfg.traces_endpoint {
            Some(url) => {
                let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(http.clone())
                    .with_endpoint(url.clone())
                    .with_protocol(Protocol::HttpBinary)
                    .with_timeout(cfg.export_timeout)
                    .with_headers(headers.clone())
                    .with_retry_policy(no_retries())
                    .build()
                    .map_err(|e| format!("telemetry: {e}"))?;
                // The provider hands its resource to its processors, and the SDK's own pass it
                // on to their exporter; ours owns the exporter in its task, so it is given here
                // (without it every span was exported with no `service.name`).
                opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
                let (processor, task) = export::QueueProcessor::start(
                    exporter,
                    cfg.queue_size,
                    cfg.export_timeout,
                    dropped.with_label_values(&["spans"]),
                );
                span_task = Some(task);
                let provider = SdkTracerProvider::builder()
                    .with_id_generator(PresetIds)
                    .with_span_processor(processor)
                    .with_resource(resource.clone())
                    .build();
                let tracer = provider.tracer("legate");
                Some((provider, tracer))
            }
            None => None,
        };
        let metrics = match &cfg.metrics_endpoint {
            Some(url) => {
                let exporter = opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_http_client(http)
                    .with_endpoint(url.clone())
                    .with_protocol(Protocol::HttpBinary)
                    .with_timeout(cfg.export_timeout)
                    .with_headers(headers)
                    .with_retry_policy(no_retries())
                    .build()
                    .map_err(|e| format!("telemetry: {e}"))?;
                let exporter = export::CountingMetrics {
                    inner: exporter,
                    dropped: dropped.with_label_values(&["metrics"]),
                };
                let reader = PeriodicReader::builder(exporter)
                    .with_interval(cfg.metrics_interval)
                    .build();
                let provider = SdkMeterProvider::builder()
                    .with_reader(reader)
                    .with_resource(resource)
                    .build();
                let meter = provider.meter("legate");
                let instruments = Instruments {
                    duration: meter
                        .f64_histogram("gen_ai.client.operation.duration")
                        .with_unit("s")
                        .with_description("GenAI operation duration")
                        .with_boundaries(DURATION_BUCKETS.to_vec())
                        .build(),
                    tokens: meter
                        .u64_histogram("gen_ai.client.token.usage")
                        .with_unit("{token}")
                        .with_description("Number of input and output tokens used")
                        .with_boundaries(TOKEN_BUCKETS.to_vec())
                        .build(),
                    first_chunk: meter
                        .f64_histogram("gen_ai.client.operation.time_to_first_chunk")
                        .with_unit("s")
                        .with_description("Time to receive the first chunk of a stream")
                        .with_boundaries(DURATION_BUCKETS.to_vec())
                        .build(),
                };
                Some((provider, instruments))
            }
            None => None,
        };
        Ok(Otel {
            traces,
            span_task: parking_lot::Mutex::new(span_task),
            metrics,
        })
    }

    pub fn traces_on(&self) -> bool {
        self.traces.is_some()
    }

    /// Records one finished request: its spans and its metrics.
    pub fn record(&self, f: &Facts) {
        if let (Some((_, tracer)), Some(ids)) = (&self.traces, &f.trace) {
            spans(tracer, f, ids);
        }
        if let Some((_, m)) = &self.metrics {
            record_metrics(m, f);
        }
    }

    /// Flushes what is queued (bounded by `wait`) and stops the exporters.
    pub async fn shutdown(&self, wait: Duration) {
        if let Some((p, _)) = &self.traces {
            let _ = p.shutdown();
        }
        // The queued spans and the last metrics leave side by side, within one `wait` in
        // all: one after the other, a hung collector held the exit for twice as long.
        let task = self.span_task.lock().take();
        let spans = async {
            if let Some(t) = task {
                let _ = t.await;
            }
        };
        let metrics = async {
            if let Some((p, _)) = &self.metrics {
                let p = p.clone();
                // The SDK's reader thread blocks until the collector answers (or times out).
                let _ = tokio::task::spawn_blocking(move || {
                    let _ = p.force_flush();
                    let _ = p.shutdown();
                })
                .await;
            }
        };
        let _ = tokio::time::timeout(wait, futures_util::future::join(spans, metrics)).await;
    }
}

fn common(f: &Facts) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("legate.request_id", f.request_id.render()),
        KeyValue::new("legate.tenant", f.tenant.clone()),
        KeyValue::new("legate.api", f.api),
    ];
    if let Some(m) = &f.model {
        a.push(KeyValue::new("gen_ai.request.model", m.clone()));
    }
    a
}

fn spans(tracer: &SdkTracer, f: &Facts, ids: &TraceIds) {
    let flags = if ids.sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let parent = match ids.parent {
        Some(p) => Context::new().with_remote_span_context(SpanContext::new(
            trace_id(ids.trace_id),
            span_id(p),
            flags,
            true,
            TraceState::default(),
        )),
        None => Context::new(),
    };
    let end = f.started_wall + f.duration.unwrap_or_default();
    let mut attrs = common(f);
    let served = f.steps.iter().rev().find(|a| a.outcome == "ok");
    if let Some(a) = served {
        attrs.push(KeyValue::new("gen_ai.provider.name", a.provider_kind));
        if let Some(s) = &a.server {
            attrs.push(KeyValue::new("server.address", s.clone()));
        }
    }
    if let Some(s) = &f.served_by {
        attrs.push(KeyValue::new("legate.served_by", s.to_string()));
    }
    if let Some(m) = f
        .response_model
        .clone()
        .or_else(|| served.map(|a| a.called.model().to_owned()))
    {
        attrs.push(KeyValue::new("gen_ai.response.model", m));
    }
    if let Some(id) = &f.response_id {
        attrs.push(KeyValue::new("gen_ai.response.id", id.clone()));
    }
    if !f.finish_reasons.is_empty() {
        let v: Vec<opentelemetry::StringValue> =
            f.finish_reasons.iter().map(|r| r.clone().into()).collect();
        attrs.push(KeyValue::new(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(v.into()),
        ));
    }
    if let Some(n) = f.max_tokens {
        attrs.push(KeyValue::new("gen_ai.request.max_tokens", n as i64));
    }
    if let Some(u) = f.usage {
        attrs.push(KeyValue::new("gen_ai.usage.input_tokens", u.input as i64));
        attrs.push(KeyValue::new("gen_ai.usage.output_tokens", u.output as i64));
        attrs.push(KeyValue::new(
            "gen_ai.usage.cache_read.input_tokens",
            u.cache_read as i64,
        ));
        attrs.push(KeyValue::new(
            "gen_ai.usage.cache_creation.input_tokens",
            u.cache_write as i64,
        ));
    }
    attrs.push(KeyValue::new("legate.attempts", i64::from(f.attempts)));
    if let Some(p) = f.priority {
        attrs.push(KeyValue::new("legate.priority", p));
    }
    attrs.push(KeyValue::new(
        "http.response.status_code",
        i64::from(f.status()),
    ));
    if let Some(e) = f.error_type() {
        attrs.push(KeyValue::new("error.type", e));
    }
    let name = match &f.model {
        Some(m) => format!("chat {m}"),
        None => format!("{} {}", f.method, f.path),
    };
    let builder = tracer
        .span_builder(name)
        .with_kind(SpanKind::Server)
        .with_start_time(f.started_wall)
        .with_attributes(attrs);
    preset(Some(ids.trace_id), Some(ids.span_id));
    let mut span = builder.start_with_context(tracer, &parent);
    if f.status() >= 500 {
        span.set_status(Status::error(f.error_type().unwrap_or("error")));
    }
    span.end_with_timestamp(end);
    let here = Context::new().with_remote_span_context(SpanContext::new(
        trace_id(ids.trace_id),
        span_id(ids.span_id),
        flags,
        false,
        TraceState::default(),
    ));
    for a in &f.steps {
        attempt_span(tracer, f, a, &here);
    }
}

fn attempt_span(tracer: &SdkTracer, f: &Facts, a: &AttemptFacts, parent: &Context) {
    let mut attrs = vec![
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("gen_ai.request.model", a.called.model().to_owned()),
        KeyValue::new("legate.request_id", f.request_id.render()),
        KeyValue::new("legate.tenant", f.tenant.clone()),
        KeyValue::new("legate.fallback_step", a.step as i64),
        KeyValue::new("legate.target", a.called.target().to_owned()),
        KeyValue::new("legate.outcome", a.outcome),
    ];
    if !a.provider_kind.is_empty() {
        attrs.push(KeyValue::new("gen_ai.provider.name", a.provider_kind));
    }
    let number = f
        .steps
        .iter()
        .take_while(|x| !std::ptr::eq(*x, a))
        .filter(|x| x.sent)
        .count();
    if a.sent {
        attrs.push(KeyValue::new("legate.attempt", (number + 1) as i64));
    }
    if let Some(s) = &a.server {
        attrs.push(KeyValue::new("server.address", s.clone()));
    }
    if let Some(s) = a.status {
        attrs.push(KeyValue::new("http.response.status_code", i64::from(s)));
    }
    if a.outcome == "ok" {
        attrs.push(KeyValue::new(
            "gen_ai.response.model",
            a.called.model().to_owned(),
        ));
    } else {
        let e = a
            .status
            .map_or_else(|| a.outcome.to_string(), |s| s.to_string());
        attrs.push(KeyValue::new("error.type", e));
    }
    if let Some(w) = &a.why {
        attrs.push(KeyValue::new("legate.reason", w.clone()));
    }
    let builder = tracer
        .span_builder(format!("chat {}", a.called.model()))
        .with_kind(SpanKind::Client)
        .with_start_time(a.started_wall)
        .with_attributes(attrs);
    preset(None, a.span_id);
    let mut span = builder.start_with_context(tracer, parent);
    if a.outcome != "ok" {
        span.set_status(Status::error(a.outcome));
    }
    span.end_with_timestamp(a.started_wall + a.duration);
}

/// Metric attributes carry the model's bounded label, as `/metrics` does (SPEC §8, §14): the
/// caller's own name would make one series per name a caller invents, kept for the process's
/// life by cumulative export. Spans, one per request, carry the name as sent.
fn record_metrics(m: &Instruments, f: &Facts) {
    let served = f.steps.iter().rev().find(|a| a.outcome == "ok");
    let label = f.model_label.as_deref().unwrap_or("other");
    let mut attrs = vec![
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("gen_ai.request.model", label.to_string()),
    ];
    if let Some(a) = served {
        attrs.push(KeyValue::new("gen_ai.provider.name", a.provider_kind));
        // A step that calls the caller's own name (a default route) is labelled as the
        // request is; a configured chain's steps name configured models.
        let called = a.called.model();
        let response_model = if f.model.as_deref() == Some(called) {
            label.to_string()
        } else {
            called.to_owned()
        };
        attrs.push(KeyValue::new("gen_ai.response.model", response_model));
    }
    let mut with_error = attrs.clone();
    if let Some(e) = f.error_type() {
        with_error.push(KeyValue::new("error.type", e));
    }
    if let Some(d) = f.duration {
        m.duration.record(d.as_secs_f64(), &with_error);
    }
    if let Some(u) = f.usage {
        let mut input = attrs.clone();
        input.push(KeyValue::new("gen_ai.token.type", "input"));
        m.tokens
            .record(u.input + u.cache_read + u.cache_write, &input);
        let mut output = attrs.clone();
        output.push(KeyValue::new("gen_ai.token.type", "output"));
        m.tokens.record(u.output, &output);
    }
    if let (true, Some(t)) = (f.stream, f.ttft) {
        m.first_chunk.record(t.as_secs_f64(), &attrs);
    }
}

/// Time a span may wait in the queue at shutdown.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Preset (trace id, span id) for the next span built on this thread.
type Preset = (Option<[u8; 16]>, Option<[u8; 8]>);

thread_local! {
    /// Ids for the next span built on this thread: spans are built after the fact, with the
    /// ids the request already used (the SDK's builder takes no ids, its id generator does).
    static PRESET: std::cell::Cell<Preset> =
        const { std::cell::Cell::new((None, None)) };
}

fn preset(trace: Option<[u8; 16]>, span: Option<[u8; 8]>) {
    PRESET.with(|p| p.set((trace, span)));
}

/// Hands out the preset ids once, else random ones.
#[derive(Debug)]
struct PresetIds;

impl opentelemetry_sdk::trace::IdGenerator for PresetIds {
    fn new_trace_id(&self) -> opentelemetry::trace::TraceId {
        let (t, s) = PRESET.with(std::cell::Cell::get);
        PRESET.with(|p| p.set((None, s)));
        t.map_or_else(|| trace_id(super::traceparent::new_trace_id()), trace_id)
    }

    fn new_span_id(&self) -> opentelemetry::trace::SpanId {
        let (t, s) = PRESET.with(std::cell::Cell::get);
        PRESET.with(|p| p.set((t, None)));
        s.map_or_else(|| span_id(super::traceparent::new_span_id()), span_id)
    }
}

/// A failed export is not tried again: the batch is dropped and counted (SPEC §12). The
/// exporter's own retries wait out their backoff with `std::thread::sleep` unless built with
/// its `tokio` feature, and export runs on the server's runtime: a collector refusing
/// connections or answering 503 froze the thread that serves requests and probes for up to
/// a second per batch.
fn no_retries() -> opentelemetry_otlp::RetryPolicy {
    opentelemetry_otlp::RetryPolicy::disabled()
}
