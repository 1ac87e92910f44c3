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
//! With `HYPER_FLOOR_INLINE=1` each upstream connection is polled inside the request's own
//! future (its caller connection's task) instead of running as a task of its own: what handing
//! a request over between two tasks costs.
//!
//! It prints `hyper floor listening on http://ADDR` once it accepts connections, and answers
//! `GET /readyz` itself. `BENCH_FLOOR=1 cargo bench --bench proxy` puts it in legate's place in
//! the benchmark.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
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
    let inline = std::env::var("HYPER_FLOOR_INLINE").is_ok_and(|v| v == "1");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(listen, upstream, inline))
}

async fn serve(listen: String, upstream: SocketAddr, inline: bool) -> std::io::Result<()> {
    let listener = TcpListener::bind(&listen).await?;
    println!("hyper floor listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let Ok(sender) = dial(upstream, inline).await else {
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

/// One upstream connection for one caller connection; its driver runs as its own task, or
/// with `inline` is kept beside the sender for the requests to poll.
async fn dial(upstream: SocketAddr, inline: bool) -> std::io::Result<Shared> {
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    let driver = if inline {
        Some(Box::new(conn))
    } else {
        tokio::spawn(conn);
        None
    };
    Ok(Shared(Arc::new(Mutex::new(Some((sender, driver))))))
}

/// Boxed, so that taking it out for a request and putting it back moves a pointer.
type Driver = Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>;

/// The caller connection's upstream sender (and inline driver), taken out for a request and put
/// back after its answer: HTTP/1 serves one request at a time per connection, so it is always
/// there.
#[derive(Clone)]
struct Shared(Arc<Mutex<Option<Taken>>>);

/// What a request takes out of [`Shared`].
type Taken = (SendRequest<Full<Bytes>>, Option<Driver>);

/// Awaits `f`, polling the connection's driver (if inline) in the same poll: the driver is
/// polled with the task's waker (its socket wakes the task), `f` with a waker that does nothing,
/// since only the driver's progress can make `f` ready. A driver that has finished (the
/// upstream closed the connection) is dropped at once, which fails what is queued on it and
/// marks its sender closed; `f` is then polled with the task's waker.
async fn driven<F: Future>(driver: &mut Option<Driver>, f: F) -> F::Output {
    if driver.is_none() {
        return f.await;
    }
    let mut f = pin!(f);
    std::future::poll_fn(|cx| {
        if let Some(conn) = driver.as_mut() {
            let mut quiet = Context::from_waker(Waker::noop());
            if let Poll::Ready(v) = f.as_mut().poll(&mut quiet) {
                return Poll::Ready(v);
            }
            if Pin::new(&mut **conn).poll(cx).is_pending() {
                return f.as_mut().poll(&mut quiet);
            }
            *driver = None;
        }
        f.as_mut().poll(cx)
    })
    .await
}

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
    let Some((mut taken, mut driver)) = sender.0.lock().ok().and_then(|mut s| s.take()) else {
        return status(StatusCode::BAD_GATEWAY);
    };
    // An inline driver has to reach its idle state (asking for the next request) before the
    // sender takes one; a spawned one has, by the time its last answer was read.
    if driver.is_some() && driven(&mut driver, taken.ready()).await.is_err() {
        return status(StatusCode::BAD_GATEWAY);
    }
    let answer = driven(
        &mut driver,
        taken.send_request(Request::from_parts(parts, Full::new(body))),
    )
    .await;
    // A spawned driver reads the body on its own: the sender goes back with the answer's head.
    // An inline one is needed until the body is read.
    let mut slot = Some((taken, driver));
    if slot.as_ref().is_some_and(|(_, d)| d.is_none()) {
        sender.put_back(&mut slot);
    }
    let answer = match answer {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            let mut none = None;
            let driver = slot.as_mut().map_or(&mut none, |(_, d)| d);
            match driven(driver, body.collect()).await {
                Ok(body) => Response::from_parts(parts, Full::new(body.to_bytes())),
                Err(_) => status(StatusCode::BAD_GATEWAY),
            }
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    };
    sender.put_back(&mut slot);
    answer
}

impl Shared {
    /// Puts the taken sender (and driver) back, if `slot` still holds them.
    fn put_back(&self, slot: &mut Option<Taken>) {
        if let (Some(taken), Ok(mut s)) = (slot.take(), self.0.lock()) {
            *s = Some(taken);
        }
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r
}
