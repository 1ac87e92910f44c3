//! A test OTLP/HTTP collector on 127.0.0.1:0: it decodes what legate exports with the official
//! OpenTelemetry protobuf definitions (opentelemetry-proto + prost) and keeps it for asserts.
//! `dead()` is a collector that accepts connections and never answers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;

#[derive(Default)]
pub(crate) struct Received {
    pub spans: Vec<Span>,
    pub metric_names: Vec<String>,
    /// Every model attribute (`gen_ai.request.model`, `gen_ai.response.model`) of the
    /// histogram points exported.
    pub metric_models: Vec<String>,
    pub content_types: Vec<String>,
    /// The `service.name` of each span export's resource ("" when it has none).
    pub span_services: Vec<String>,
}

pub(crate) struct Collector {
    pub url: String,
    pub got: Arc<Mutex<Received>>,
    changed: Arc<tokio::sync::Notify>,
}

impl Collector {
    pub(crate) async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Received::default()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let (g, c) = (got.clone(), changed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (g, c) = (g.clone(), c.clone());
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let (g, c) = (g.clone(), c.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let ct = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        {
                            let mut r = g.lock().unwrap();
                            r.content_types.push(ct);
                            if path == "/v1/traces" {
                                let msg = ExportTraceServiceRequest::decode(body).unwrap();
                                for rs in msg.resource_spans {
                                    let attrs = rs.resource.map(|r| r.attributes);
                                    let name =
                                        attrs.as_deref().and_then(|a| find(a, "service.name"));
                                    r.span_services.push(match name {
                                        Some(any_value::Value::StringValue(s)) => s.clone(),
                                        _ => String::new(),
                                    });
                                    for ss in rs.scope_spans {
                                        r.spans.extend(ss.spans);
                                    }
                                }
                            } else if path == "/v1/metrics" {
                                let msg = ExportMetricsServiceRequest::decode(body).unwrap();
                                for rm in msg.resource_metrics {
                                    for sm in rm.scope_metrics {
                                        for m in sm.metrics {
                                            r.metric_models.extend(models_of(&m));
                                            r.metric_names.push(m.name);
                                        }
                                    }
                                }
                            }
                        }
                        c.notify_waiters();
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::new(),
                        )))
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Collector { url, got, changed }
    }

    /// Waits (at most 10 s) until `done` holds for what was received.
    pub(crate) async fn wait_for(&self, done: impl Fn(&Received) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let notified = self.changed.notified();
            if done(&self.got.lock().unwrap()) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("the collector did not receive what was expected within 10 s");
            }
        }
    }
}

/// A collector that accepts connections (they wait in the backlog) and never answers.
pub(crate) async fn dead() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// A collector that answers every export with 503 (a retryable status); it counts the spans
/// it was sent, each time it was sent one.
pub(crate) async fn unavailable() -> (Arc<std::sync::atomic::AtomicUsize>, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = sent.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let s = s.clone();
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let s = s.clone();
                async move {
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let msg = ExportTraceServiceRequest::decode(body).unwrap();
                    let spans: usize = msg
                        .resource_spans
                        .iter()
                        .flat_map(|rs| &rs.scope_spans)
                        .map(|ss| ss.spans.len())
                        .sum();
                    s.fetch_add(spans, std::sync::atomic::Ordering::SeqCst);
                    let mut resp = http::Response::new(Full::new(Bytes::new()));
                    *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (sent, url)
}

/// The model attributes of a histogram's points.
fn models_of(m: &opentelemetry_proto::tonic::metrics::v1::Metric) -> Vec<String> {
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let Some(Data::Histogram(h)) = &m.data else {
        return Vec::new();
    };
    h.data_points
        .iter()
        .flat_map(|p| &p.attributes)
        .filter(|kv| kv.key == "gen_ai.request.model" || kv.key == "gen_ai.response.model")
        .filter_map(
            |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            },
        )
        .collect()
}

pub(crate) fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    find(&span.attributes, key)
}

fn find<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

pub(crate) fn str_attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(any_value::Value::StringValue(s)) => Some(s.as_str()),
        _ => None,
    }
}

pub(crate) fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(any_value::Value::IntValue(n)) => Some(*n),
        _ => None,
    }
}
