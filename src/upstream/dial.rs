//! Opening one upstream connection: TCP (and TLS) through hyper-rustls's connector, then, in the
//! version the TLS handshake settled, legate's own HTTP/1.1 connection (see [`h1`](super::h1)),
//! or hyper's HTTP/2 handshake and its connection's task spawned (when the provider chose `h2`
//! over ALPN); every plaintext byte it reads is counted (see [`ConnCount`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper::client::conn::http2;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conns::Sender;
use super::h1::{H1Conn, H1Error};
use super::streams::{SettingsReader, Streams};

pub(super) type Connector = HttpsConnector<HttpConnector>;
type Stream = MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;

/// Why a connection could not be opened or a request not sent on it.
#[derive(Debug)]
pub enum SendError {
    /// TCP connect, TLS handshake or the HTTP handshake failed.
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// The request or its response head failed on an open HTTP/2 connection.
    Http(hyper::Error),
    /// The request or its response head failed on an open HTTP/1 connection.
    H1(H1Error),
    /// The request's URI has no scheme or authority (a bug in the caller).
    NotAbsolute,
}

impl SendError {
    /// Whether the connection was never established.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }

    /// How the call failed, for the caller's message, the retry and the journal. Writing the
    /// request on an open HTTP/1 connection had begun when it failed there (the provider may
    /// have read it); on HTTP/2 hyper does not say.
    pub fn failed(&self) -> crate::error::Failed {
        use crate::error::Failed;
        match self {
            SendError::Connect(e) => match tls_refusal(e.as_ref()) {
                Some(why) => Failed::Tls(why),
                None => Failed::Connecting,
            },
            SendError::H1(_) => Failed::AfterSending,
            SendError::Http(_) => Failed::OnOpenConnection,
            // Nothing was sent, nor could be: a request without a scheme and host.
            SendError::NotAbsolute => Failed::Connecting,
        }
    }
}

/// rustls's error, if the connection failed because the provider's certificate was refused
/// (expired, for another name, from an unknown CA, revoked): hyper-rustls wraps tokio-rustls's
/// `io::Error`, which wraps rustls's. (An `io::Error`'s `source` skips the error it wraps, so
/// that one is taken with `get_ref`.) Other handshake failures (an alert from a load balancer
/// under load, a protocol the two do not share) may pass, and stay ordinary connect errors.
fn tls_refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    // A chain is a few links; the bound keeps a cyclic one from spinning.
    for _ in 0..8 {
        let e = next?;
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return matches!(
                tls,
                rustls::Error::InvalidCertificate(_)
                    | rustls::Error::NoCertificatesPresented
                    | rustls::Error::UnsupportedNameType
                    | rustls::Error::InvalidCertRevocationList(_)
            )
            .then(|| tls.to_string());
        }
        next = match e.downcast_ref::<io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "connecting: {e}"),
            SendError::Http(e) => write!(f, "{e}"),
            SendError::H1(e) => write!(f, "{e}"),
            SendError::NotAbsolute => f.write_str("the request URI is not absolute"),
        }
    }
}

impl std::error::Error for SendError {}

/// Opens a connection to `uri`'s scheme and authority; `max_buf` bounds a response head.
/// `connect_timeout` bounds TCP connect and TLS handshake together: a provider that accepts
/// the connection and never finishes the handshake would otherwise hold the attempt until
/// its first-byte timeout, with nothing sent.
pub(super) async fn dial(
    connector: &Connector,
    uri: &Uri,
    max_buf: usize,
    connect_timeout: std::time::Duration,
) -> Result<(Sender, Arc<ConnCount>), SendError> {
    let mut connector = connector.clone();
    let call = tower_service::Service::call(&mut connector, uri.clone());
    let stream = match tokio::time::timeout(connect_timeout, call).await {
        Ok(r) => r.map_err(SendError::Connect)?,
        Err(_) => {
            return Err(SendError::Connect(Box::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "TCP connect and TLS handshake did not finish within connect_timeout",
            ))));
        }
    };
    let h2 = stream.connected().is_negotiated_h2();
    let count = ConnCount::new();
    let streams = h2.then(Streams::new);
    let counted = Counted {
        inner: TokioIo::new(stream),
        count: count.clone(),
        settings: streams.clone().map(SettingsReader::new),
    };
    let Some(streams) = streams else {
        return Ok((Sender::H1(Box::new(H1Conn::new(counted, max_buf))), count));
    };
    // The same bound on an answer's head as HTTP/1's (64 KiB of 100 lines; HTTP/2 counts 32
    // bytes more per line): hyper's default of 16 KiB refused heads HTTP/1 takes.
    let header_list = max_buf + super::h1::lines::MAX_HEADERS * 32;
    let (tx, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(header_list).unwrap_or(u32::MAX))
        .handshake::<_, Full<Bytes>>(CountedIo(TokioIo::new(counted)))
        .await
        .map_err(|e| SendError::Connect(Box::new(e)))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
        }
    });
    Ok((Sender::H2(tx, streams), count))
}

/// What one upstream connection has done: enough to tell whether a request that failed on it
/// got any byte of an answer (then the provider took it, and it is never sent again).
#[derive(Default)]
pub(super) struct ConnCount {
    /// Plaintext bytes read, in all.
    read: AtomicU64,
    /// `read` when the current request began (its first write after the last read).
    read_at_request: AtomicU64,
    /// The last transfer was a read, or nothing was transferred yet: the next write starts a
    /// request.
    reading: AtomicBool,
}

impl ConnCount {
    pub(super) fn new() -> Arc<Self> {
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

    /// Nothing was read since the current request began.
    pub(super) fn silent_since_request(&self) -> bool {
        self.read.load(Ordering::Acquire) == self.read_at_request.load(Ordering::Acquire)
    }
}

/// The plaintext side of a connection (after TLS), its transfers counted. hyper's I/O traits
/// are bridged to tokio's and back, whose read buffer tells how much each read filled.
struct CountedIo(TokioIo<Counted>);

pub(super) struct Counted {
    inner: TokioIo<Stream>,
    count: Arc<ConnCount>,
    /// An HTTP/2 connection's: what the provider allows, read from its frames.
    settings: Option<SettingsReader>,
}

impl Counted {
    /// A plain TCP connection's, for tests.
    #[cfg(test)]
    pub(super) fn plain(tcp: tokio::net::TcpStream) -> Counted {
        Counted {
            inner: TokioIo::new(MaybeHttpsStream::Http(TokioIo::new(tcp))),
            count: ConnCount::new(),
            settings: None,
        }
    }

    /// The TCP socket under the TLS, if any.
    pub(super) fn tcp(&self) -> &tokio::net::TcpStream {
        match self.inner.inner() {
            MaybeHttpsStream::Http(s) => s.inner(),
            MaybeHttpsStream::Https(s) => s.inner().get_ref().0.inner().inner(),
        }
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
            if let Some(settings) = &mut this.settings {
                settings.read(&buf.filled()[before..]);
            }
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
