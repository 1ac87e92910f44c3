//! The least a proxy built on legate's HTTP stack can cost: hyper's HTTP/1 server in front of
//! hyper's HTTP/1 client on one current-thread tokio runtime, each caller connection paired
//! with one upstream connection of its own, the request and the answer buffered whole (as
//! legate buffers both for a non-streamed call), headers passed through as hyper parsed them.
//! No routing, policy, metering, metrics or logging: what remains is what hyper, tokio and
//! the allocator spend per request, the floor under legate's own work.
//!
//! Not part of legate. `bench/per-request.py --floor` runs it under callgrind in front of the
//! same mock, to set legate's and nginx's instruction and code-footprint counts beside it:
//!
//!     cargo run --release --example hyper_floor -- 127.0.0.1:0 http://127.0.0.1:PORT
//!
//! A measuring stick for loopback only, not a server to run: it has none of legate's bounds
//! (no connection limit, no timeouts, bodies buffered whatever their size), so a slow or huge
//! peer holds its memory for as long as it likes.
//!
//! It prints `hyper floor listening on http://ADDR` once it accepts connections, and answers
//! `GET /readyz` itself. `BENCH_FLOOR=1 cargo bench --bench proxy` puts it in legate's place in
//! the benchmark.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: hyper_floor LISTEN_ADDR http://UPSTREAM_HOST:PORT");
        std::process::exit(2);
    };
    let upstream: SocketAddr = upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(listen, upstream))
}

async fn serve(listen: String, upstream: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(&listen).await?;
    println!("hyper floor listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let Ok(sender) = dial(upstream).await else {
                return;
            };
            let host = HeaderValue::from_str(&upstream.to_string()).ok();
            let svc = hyper::service::service_fn(move |req| {
                let mut sender = sender.clone();
                let host = host.clone();
                async move { Ok::<_, Infallible>(relay(&mut sender, host, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// One upstream connection for one caller connection; its driver runs as its own task.
async fn dial(upstream: SocketAddr) -> std::io::Result<Shared> {
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    Ok(Shared(Arc::new(Mutex::new(Some(sender)))))
}

/// The caller connection's upstream sender, taken out for a request and put back after its
/// answer's head: HTTP/1 serves one request at a time per connection, so it is always there.
#[derive(Clone)]
struct Shared(Arc<Mutex<Option<SendRequest<Full<Bytes>>>>>);

async fn relay(
    sender: &mut Shared,
    host: Option<HeaderValue>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    // Its own readiness probe, so that the benchmark can time its start as it times legate's.
    if req.uri().path() == "/readyz" {
        return status(StatusCode::OK);
    }
    let (mut parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST);
    };
    if let Some(host) = host {
        parts.headers.insert(HOST, host);
    }
    parts
        .headers
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    let Some(mut taken) = sender.0.lock().ok().and_then(|mut s| s.take()) else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let answer = taken
        .send_request(Request::from_parts(parts, Full::new(body)))
        .await;
    if let Ok(mut slot) = sender.0.lock() {
        *slot = Some(taken);
    }
    let Ok(answer) = answer else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let (parts, body) = answer.into_parts();
    match body.collect().await {
        Ok(body) => Response::from_parts(parts, Full::new(body.to_bytes())),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r
}
