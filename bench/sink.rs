//! A stand-in OpenTelemetry collector on loopback for the tracing-on measurement: it accepts
//! OTLP/HTTP exports (`POST /v1/traces`, `/v1/metrics`), counts them and their bytes, and
//! answers each with an empty success, as fast as a local collector would. It decodes
//! nothing: what is measured is legate's cost of building and sending the spans.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::BenchError;

/// Largest export body accepted; legate's batches of at most 512 spans are far smaller.
const MAX_EXPORT: usize = 16 << 20;

/// What the sink has received so far.
#[derive(Debug, Default)]
pub(crate) struct Received {
    pub exports: AtomicU64,
    pub bytes: AtomicU64,
}

/// The running sink; stops accepting when dropped.
pub(crate) struct Sink {
    pub addr: SocketAddr,
    pub received: Arc<Received>,
    task: JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the sink on a loopback port chosen by the kernel.
pub(crate) async fn start() -> Result<Sink, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::Wire)?;
    let addr = listener.local_addr().map_err(BenchError::Wire)?;
    let received = Arc::new(Received::default());
    let counts = Arc::clone(&received);
    let task = tokio::spawn(async move {
        // The only peer is the legate instance under measurement; an accept error ends the
        // sink, and the exporter then counts its drops.
        while let Ok((stream, _)) = listener.accept().await {
            let counts = Arc::clone(&counts);
            let service = service_fn(move |request| answer(request, Arc::clone(&counts)));
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(Sink {
        addr,
        received,
        task,
    })
}

/// Reads the export whole, counts it, and answers `200` with an empty protobuf body (an empty
/// `Export*ServiceResponse`: nothing rejected).
async fn answer(
    request: Request<Incoming>,
    counts: Arc<Received>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let status = match Limited::new(request.into_body(), MAX_EXPORT)
        .collect()
        .await
    {
        Ok(body) => {
            counts.exports.fetch_add(1, Ordering::Relaxed);
            let n = body.to_bytes().len() as u64;
            counts.bytes.fetch_add(n, Ordering::Relaxed);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    };
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(response)
}
