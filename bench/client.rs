//! The load generator's HTTP side: one pooled HTTP/1.1 keep-alive client shared by every
//! phase, the two request bodies, and the two ways a request is timed (to the last body byte,
//! and to the first body byte of a stream).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::error::BenchError;

pub(crate) type Client = LegacyClient<HttpConnector, Full<Bytes>>;

/// Longest a single request may take before it counts as failed; far above any latency the
/// benchmark expects, so only a real stall trips it.
pub(crate) const REQUEST_LIMIT: Duration = Duration::from_secs(10);

const MESSAGE: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"Say hello in one short sentence."}]}"#;
const STREAM_MESSAGE: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"Say hello in one short sentence."}]}"#;

/// The reply the mock is scripted with: a few hundred bytes of text, about the size of a short
/// model answer, so the proxy has a realistic body to carry.
pub(crate) const MOCK_SCRIPT: &str = r#"{"default":{"content":[{"type":"text","text":"Hello! legate is a model ambassador: a small proxy that sits beside an agent on localhost and owns the connection to the model providers, with their keys, timeouts, streaming, usage metering and metrics. This reply is padded to a few hundred bytes so that the benchmark carries a body about the size of a short real answer."}]}}"#;

/// Keep-alive pool with room for every connection the heaviest phase opens.
pub(crate) fn build() -> Client {
    let mut connector = HttpConnector::new();
    // Without it Nagle's algorithm would hold small writes and dwarf what is being measured.
    connector.set_nodelay(true);
    LegacyClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .pool_idle_timeout(Duration::from_secs(300))
        .build(connector)
}

/// One side of the comparison: the mock directly, or legate in front of it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub label: &'static str,
    messages: Uri,
}

impl Target {
    pub(crate) fn new(label: &'static str, base_url: &str) -> Result<Target, BenchError> {
        let messages = format!("{base_url}/v1/messages")
            .parse::<Uri>()
            .map_err(|e| BenchError::Request(e.into()))?;
        Ok(Target { label, messages })
    }

    /// `POST /v1/messages`, streaming or not, with the headers an Anthropic SDK sends.
    pub(crate) fn message(&self, stream: bool) -> Result<Request<Full<Bytes>>, BenchError> {
        let body = if stream { STREAM_MESSAGE } else { MESSAGE };
        Request::builder()
            .method(Method::POST)
            .uri(self.messages.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("anthropic-version", "2023-06-01")
            // legate consumes and never forwards the caller's key; the mock checks none.
            .header("x-api-key", "bench-caller-key")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .map_err(BenchError::Request)
    }
}

/// Sends a request and reads its body to the end; the caller times it.
pub(crate) async fn complete(
    client: &Client,
    request: Request<Full<Bytes>>,
) -> Result<(), BenchError> {
    let work = async {
        let response = client.request(request).await.map_err(BenchError::Client)?;
        let body = checked(response)?;
        body.collect().await.map_err(BenchError::Body)?;
        Ok(())
    };
    tokio::time::timeout(REQUEST_LIMIT, work)
        .await
        .map_err(|_| BenchError::Timeout(REQUEST_LIMIT))?
}

/// Sends a streaming request and returns the time from sending to the first body byte, then
/// reads the rest of the stream so the connection goes back to the pool clean.
pub(crate) async fn first_byte(
    client: &Client,
    request: Request<Full<Bytes>>,
) -> Result<Duration, BenchError> {
    let work = async {
        let start = Instant::now();
        let response = client.request(request).await.map_err(BenchError::Client)?;
        let mut body = checked(response)?;
        let ttfb = loop {
            let frame = body.frame().await.ok_or(BenchError::EmptyStream)?;
            let frame = frame.map_err(BenchError::Body)?;
            if frame.data_ref().is_some_and(|data| !data.is_empty()) {
                break start.elapsed();
            }
        };
        body.collect().await.map_err(BenchError::Body)?;
        Ok(ttfb)
    };
    tokio::time::timeout(REQUEST_LIMIT, work)
        .await
        .map_err(|_| BenchError::Timeout(REQUEST_LIMIT))?
}

/// Replaces the mock's script (control plane `PUT /_mock/script`).
pub(crate) async fn script_mock(
    client: &Client,
    mock_url: &str,
    script: &str,
) -> Result<(), BenchError> {
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("{mock_url}/_mock/script"))
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .body(Full::new(Bytes::copy_from_slice(script.as_bytes())))
        .map_err(BenchError::Request)?;
    complete(client, request).await
}

fn checked(response: hyper::Response<Incoming>) -> Result<Incoming, BenchError> {
    match response.status() {
        StatusCode::OK => Ok(response.into_body()),
        status => Err(BenchError::Status(status)),
    }
}
