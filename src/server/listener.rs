//! Accept loops: one per listener, HTTP/1.1 and HTTP/2 (hyper-util auto), every connection
//! watched for graceful shutdown. Stopping the loop drops the listener, so new connections are
//! refused at once while the watched ones finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves `listener` with `handler` until `stop` fires; then waits for open connections to
/// finish, up to `grace`, calling `on_grace_expired` if they have not (so open streams can be
/// ended with an error event), and giving them a short final moment to flush it.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    handler: Arc<H>,
    stop: CancellationToken,
    grace: impl FnOnce() -> Duration,
    on_grace_expired: impl FnOnce(),
) where
    H: Fn(http::Request<Incoming>, std::net::SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Result<http::Response<B>, std::convert::Infallible>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(Duration::from_secs(30));
    let builder = Arc::new(builder);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // Typically EMFILE: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let h = handler.clone();
                let svc = service_fn(move |req| h(req, peer));
                let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            _ = stop.cancelled() => break,
        }
    }
    drop(listener);
    let all_done = graceful.shutdown();
    tokio::pin!(all_done);
    tokio::select! {
        _ = &mut all_done => {}
        _ = tokio::time::sleep(grace()) => {
            on_grace_expired();
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut all_done).await;
        }
    }
}
