//! The plumbing that keeps export off the request path: a bounded span queue drained by one
//! background task (a full queue drops the span and counts it), an export call bounded by
//! `export_timeout` (a slow or dead collector drops the batch and counts it), a metrics
//! exporter that counts what it could not deliver, and the HTTP client both use.
//!
//! The HTTP client is legate's own hyper-util client (already in the build for upstream calls)
//! behind `opentelemetry_http::HttpClient`: no second HTTP stack. Requests run on the server's
//! Tokio runtime even when the SDK's metrics thread asks for them.

use parking_lot::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus::IntCounter;
use tokio::sync::mpsc;

/// Spans sent to the collector in one request, at most.
const MAX_BATCH: usize = 512;
/// A collector's answer is read up to this size (it is only a status).
const MAX_RESPONSE: usize = 64 << 10;

/// `opentelemetry_http::HttpClient` over hyper-util, with rustls for https collectors.
#[derive(Clone)]
pub(super) struct OtlpHttp {
    client: crate::cloud::fetch::FetchClient,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl std::fmt::Debug for OtlpHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtlpHttp")
    }
}

impl OtlpHttp {
    pub(super) fn new(timeout: Duration) -> Result<Self, String> {
        let client = crate::cloud::fetch::own_client(timeout)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "telemetry export needs the Tokio runtime".to_string())?;
        Ok(OtlpHttp {
            client,
            runtime,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for OtlpHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let req = http::Request::from_parts(parts, Full::new(body));
        let client = self.client.clone();
        let timeout = self.timeout;
        let task = self.runtime.spawn(async move {
            let call = async {
                let resp = client.request(req).await?;
                let (parts, body) = resp.into_parts();
                let body = Limited::new(body, MAX_RESPONSE)
                    .collect()
                    .await
                    .map_err(|e| -> HttpError { e })?
                    .to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(r) => r,
                Err(_) => Err("the collector did not answer within export_timeout".into()),
            }
        });
        task.await.map_err(|e| -> HttpError { Box::new(e) })?
    }
}

/// The span processor: `on_end` never waits; the queue is bounded.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    tx: Mutex<Option<mpsc::Sender<SpanData>>>,
    dropped: IntCounter,
}

impl QueueProcessor {
    /// Starts the export task; returns the processor and the task (which ends once the
    /// processor is shut down and the queue drained).
    pub(super) fn start<E: SpanExporter + 'static>(
        exporter: E,
        queue: usize,
        timeout: Duration,
        dropped: IntCounter,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let task = tokio::spawn(drain(exporter, rx, timeout, dropped.clone()));
        (
            QueueProcessor {
                tx: Mutex::new(Some(tx)),
                dropped,
            },
            task,
        )
    }
}

async fn drain<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    timeout: Duration,
    dropped: IntCounter,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let n = batch.len() as u64;
        let sent = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
        match tokio::time::timeout(timeout, exporter.export(sent)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                dropped.inc_by(n);
                tracing::debug!(error = %e, spans = n, "span export failed; spans dropped");
            }
            Err(_) => {
                dropped.inc_by(n);
                tracing::debug!(spans = n, "span export timed out; spans dropped");
            }
        }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let tx = self.tx.lock();
        let queued = tx.as_ref().is_some_and(|t| t.try_send(span).is_ok());
        if !queued {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // Closing the queue lets the task export what is left and end.
        self.tx.lock().take();
        Ok(())
    }
}

/// Wraps the OTLP metrics exporter to count metric streams that could not be delivered.
pub(super) struct CountingMetrics<E> {
    pub inner: E,
    pub dropped: IntCounter,
}

impl<E: PushMetricExporter> PushMetricExporter for CountingMetrics<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        if result.is_err() {
            let n: usize = metrics.scope_metrics().map(|s| s.metrics().count()).sum();
            self.dropped.inc_by(n as u64);
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}
