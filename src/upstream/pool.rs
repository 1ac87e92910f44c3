//! The pooled HTTP client of one upstream, and the one retry that lives below the attempt loop
//! (SPEC §6): a request that fails on a *reused* pooled connection before any byte of its
//! response arrived is sent once more, at once, on a fresh connection, and is not an attempt.
//!
//! That failure is the keep-alive race: the provider closed (or reset) an idle connection just
//! as legate wrote a request on it. A server closing an idle connection does not run what
//! arrives on it, so sending the request again does not run it twice; any byte of an answer
//! means the provider took it, and then it is never sent again here.
//!
//! hyper-util covers only the narrower case of a connection known closed before the request
//! was written (`retry_canceled_requests`); once written, its error no longer says whether the
//! connection was reused or whether anything came back. So every connection is counted here,
//! on its plaintext side (TLS records such as a `close_notify` are not response bytes): how
//! many bytes it has read, how many at the moment the current request started, and how many
//! answers it has given.
//!
//! Only HTTP/1 connections qualify. On an HTTP/2 connection requests share the bytes, so "no
//! response byte" cannot be told per request; its failures stay ordinary attempts.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::{Builder, Client, Error, connect::capture_connection};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

type Inner = HttpsConnector<HttpConnector>;
type Stream = MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;

/// The client requests go through: a pooled client, and an unpooled one for the retry (it
/// always opens a new connection, so the retry cannot land on another stale one).
pub struct PooledClient {
    pooled: Client<Counting, Full<Bytes>>,
    fresh: Client<Counting, Full<Bytes>>,
    host: Option<HostHeader>,
}

/// The `host` header hyper-util writes for requests to the provider's base URL, rendered once:
/// it formats the value for every request that comes without one. Only for an `http://` base
/// URL: there every connection is HTTP/1, while an `https://` one may negotiate HTTP/2, where
/// hyper-util sends `:authority` and no `host`, and that is left to it.
struct HostHeader {
    scheme: Box<str>,
    authority: Box<str>,
    value: HeaderValue,
}

impl PooledClient {
    /// Both clients from one builder (timeouts, pool idle timeout) and one connector, for the
    /// provider at `base` (its `host` header rendered once).
    pub fn new(builder: &Builder, connector: Inner, base: Option<&Uri>) -> Self {
        let connector = Counting(connector);
        let mut unpooled = builder.clone();
        unpooled.pool_max_idle_per_host(0);
        let host = base
            .filter(|uri| uri.scheme_str() == Some("http"))
            .and_then(|uri| {
                Some(HostHeader {
                    scheme: uri.scheme_str()?.into(),
                    authority: uri.authority()?.as_str().into(),
                    value: host_value(uri)?,
                })
            });
        PooledClient {
            pooled: builder.build(connector.clone()),
            fresh: unpooled.build(connector),
            host,
        }
    }

    /// Sends `req`; on a reused connection that failed before any response byte, sends it
    /// once more on a fresh connection.
    pub async fn request(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, Error> {
        self.set_host(&mut req);
        let replay = copy(&req);
        let captured = capture_connection(&mut req);
        let err = match self.pooled.request(req).await {
            Ok(resp) => {
                if let Some(conn) = resp.extensions().get::<Arc<ConnCount>>() {
                    conn.answers.fetch_add(1, Ordering::AcqRel);
                }
                return Ok(resp);
            }
            Err(e) => e,
        };
        let stale = captured
            .connection_metadata()
            .as_ref()
            .is_some_and(unanswered_on_reused);
        if !stale {
            return Err(err);
        }
        tracing::debug!(
            error = %err,
            "a reused upstream connection failed before answering; sending once more on a fresh one"
        );
        self.fresh.request(replay).await
    }
}

impl PooledClient {
    /// The `host` header hyper-util would add last, added here from the one rendered at load
    /// when the request goes to the base URL's scheme and authority (any other is left to it).
    fn set_host<B>(&self, req: &mut Request<B>) {
        let Some(h) = &self.host else {
            return;
        };
        let uri = req.uri();
        let ours = uri.scheme_str() == Some(&*h.scheme)
            && uri.authority().is_some_and(|a| a.as_str() == &*h.authority);
        if ours {
            req.headers_mut()
                .entry(http::header::HOST)
                .or_insert_with(|| h.value.clone());
        }
    }
}

/// hyper-util's `host` for `uri`: the host, with the port unless it is the scheme's default.
fn host_value(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let secure = matches!(uri.scheme_str(), Some("https" | "wss"));
    let value = match uri.port() {
        Some(p) if !matches!((p.as_u16(), secure), (443, true) | (80, false)) => {
            format!("{host}:{}", p.as_str())
        }
        _ => host.to_string(),
    };
    HeaderValue::from_str(&value).ok()
}

/// Whether the connection had answered before and read nothing since the failed request began.
fn unanswered_on_reused(conn: &Connected) -> bool {
    if conn.is_negotiated_h2() {
        return false;
    }
    let mut ext = http::Extensions::new();
    conn.get_extras(&mut ext);
    ext.get::<Arc<ConnCount>>()
        .is_some_and(|c| c.answers.load(Ordering::Acquire) > 0 && c.silent_since_request())
}

/// The same request again (the original is consumed by the first send). The body is shared
/// bytes, the headers mostly shared values: a cheap copy.
fn copy(req: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let mut r = Request::new(req.body().clone());
    *r.method_mut() = req.method().clone();
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    r
}

/// What one upstream connection has done.
#[derive(Default)]
struct ConnCount {
    /// Plaintext bytes read, in all.
    read: AtomicU64,
    /// `read` when the current request began (its first write after the last read).
    read_at_request: AtomicU64,
    /// The last transfer was a read, or nothing was transferred yet: the next write starts a
    /// request.
    reading: AtomicBool,
    /// Responses (heads) this connection delivered.
    answers: AtomicU64,
}

impl ConnCount {
    fn new() -> Arc<Self> {
        Arc::new(ConnCount {
            reading: AtomicBool::new(true),
            ..Default::default()
        })
    }

    fn on_read(&self, n: usize) {
        self.read.fetch_add(n as u64, Ordering::AcqRel);
        self.reading.store(true, Ordering::Release);
    }

    fn on_write(&self) {
        if self.reading.swap(false, Ordering::AcqRel) {
            self.read_at_request
                .store(self.read.load(Ordering::Acquire), Ordering::Release);
        }
    }

    fn silent_since_request(&self) -> bool {
        self.read.load(Ordering::Acquire) == self.read_at_request.load(Ordering::Acquire)
    }
}

/// The upstream connector, with every connection counted.
#[derive(Clone)]
pub(super) struct Counting(Inner);

impl tower_service::Service<Uri> for Counting {
    type Response = CountedIo;
    type Error = <Inner as tower_service::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<CountedIo, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.0.call(dst);
        Box::pin(async move {
            let stream = connecting.await?;
            Ok(CountedIo(TokioIo::new(Counted {
                inner: TokioIo::new(stream),
                count: ConnCount::new(),
            })))
        })
    }
}

/// The plaintext side of a connection (after TLS), its transfers counted. hyper's I/O traits
/// are bridged to tokio's and back, whose read buffer tells how much each read filled.
pub(super) struct CountedIo(TokioIo<Counted>);

pub(super) struct Counted {
    inner: TokioIo<Stream>,
    count: Arc<ConnCount>,
}

impl Connection for CountedIo {
    fn connected(&self) -> Connected {
        let counted = self.0.inner();
        counted
            .inner
            .inner()
            .connected()
            .extra(counted.count.clone())
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.count.on_read(n);
        }
        r
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.count.on_write();
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.count.on_write();
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl hyper::rt::Read for CountedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for CountedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        hyper::rt::Write::is_write_vectored(&self.0)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_is_hyper_utils_own() {
        let host = |u: &str| {
            let uri: Uri = u.parse().unwrap_or_else(|e| panic!("{u}: {e}"));
            host_value(&uri).and_then(|v| v.to_str().ok().map(str::to_owned))
        };
        assert_eq!(
            host("http://127.0.0.1:8080/v1"),
            Some("127.0.0.1:8080".into())
        );
        assert_eq!(host("http://example.com:80"), Some("example.com".into()));
        assert_eq!(
            host("https://example.com:443/x"),
            Some("example.com".into())
        );
        assert_eq!(
            host("https://example.com:80"),
            Some("example.com:80".into())
        );
        assert_eq!(
            host("http://example.com:443"),
            Some("example.com:443".into())
        );
        assert_eq!(host("https://[::1]:8443"), Some("[::1]:8443".into()));
        assert_eq!(
            host("https://api.example.com"),
            Some("api.example.com".into())
        );
    }

    #[test]
    fn only_requests_to_the_base_authority_get_the_rendered_host() {
        let builder = Builder::new(hyper_util::rt::TokioExecutor::new());
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let base: Uri = "http://127.0.0.1:9/v1"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let client = PooledClient::new(&builder, connector, Some(&base));
        let host_of = |uri: &str| {
            let mut req = Request::new(());
            *req.uri_mut() = uri.parse().unwrap_or_else(|e| panic!("{e}"));
            client.set_host(&mut req);
            req.headers().get(http::header::HOST).cloned()
        };
        assert_eq!(
            host_of("http://127.0.0.1:9/v1/messages"),
            Some(HeaderValue::from_static("127.0.0.1:9"))
        );
        assert_eq!(host_of("https://127.0.0.1:9/v1/messages"), None);
        assert_eq!(host_of("http://127.0.0.1:10/v1/messages"), None);

        // An https base URL may be served over HTTP/2, which carries no `host`: left to hyper-util.
        let tls_base: Uri = "https://127.0.0.1:9/v1"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let tls_client = PooledClient::new(&builder, connector, Some(&tls_base));
        let mut req = Request::new(());
        *req.uri_mut() = "https://127.0.0.1:9/v1/messages"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        tls_client.set_host(&mut req);
        assert_eq!(req.headers().get(http::header::HOST), None);
    }

    #[test]
    fn a_request_starts_at_the_first_write_after_a_read() {
        let c = ConnCount::new();
        c.on_write();
        c.on_write();
        assert!(c.silent_since_request(), "nothing read yet");
        c.on_read(100);
        assert!(!c.silent_since_request(), "the first answer arrived");
        // The next request on the connection: written, then nothing came back.
        c.on_write();
        c.on_write();
        assert!(c.silent_since_request());
        // Part of an answer came back: it is no longer safe to send again.
        c.on_read(3);
        assert!(!c.silent_since_request());
    }
}
