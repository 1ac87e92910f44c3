//! The mock's listener: accepts connections (plain or TLS), serves HTTP/1.1 and h2 on each,
//! and exposes what tests need: the address, the recorded requests, the counters, and waits
//! on those counters.

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use super::handler;
use super::script::Script;
use super::state::{MockStats, RecordedRequest, Shared};

/// How long a test may wait on the mock's counters before the wait fails.
pub(super) const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A running mock provider. Dropping it (or calling [`MockServer::shutdown`]) stops it and
/// closes every open connection.
pub struct MockServer {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl MockServer {
    /// Binds `listen` (tests pass 127.0.0.1:0) and serves until dropped.
    pub async fn start(
        listen: SocketAddr,
        script: Script,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> io::Result<MockServer> {
        Self::start_with(listen, script, tls, None).await
    }

    /// Like [`MockServer::start`], also playing the cloud platforms when `cloud` is set.
    pub async fn start_with(
        listen: SocketAddr,
        script: Script,
        tls: Option<Arc<rustls::ServerConfig>>,
        cloud: Option<super::cloud::CloudOptions>,
    ) -> io::Result<MockServer> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(match cloud {
            Some(opts) => Shared::with_cloud(script, opts),
            None => Shared::new(script),
        });
        let tls_enabled = tls.is_some();
        let acceptor = tls.map(TlsAcceptor::from);
        let accept = tokio::spawn(accept_loop(listener, acceptor, Arc::clone(&shared)));
        Ok(MockServer {
            addr,
            tls: tls_enabled,
            shared,
            accept,
        })
    }

    /// The bound address (with the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` with TLS (certificates name hosts,
    /// not loopback addresses).
    pub fn base_url(&self) -> String {
        if self.tls {
            return format!("https://localhost:{}", self.addr.port());
        }
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, self.addr.port()))
    }

    /// Replaces the script; every queued reply gets its full `times` again.
    pub fn set_script(&self, script: Script) {
        self.shared.set_script(script);
    }

    /// API requests received, in arrival order (control-plane calls are not recorded).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests()
    }

    pub fn stats(&self) -> MockStats {
        self.shared.stats()
    }

    /// Resolves once `stats().cancelled >= n`.
    ///
    /// # Panics
    /// After [`WAIT_LIMIT`] without getting there (for tests: a regression fails, never hangs).
    pub async fn wait_cancelled(&self, n: u64) {
        self.wait_for("cancelled", n, |s| s.cancelled >= n).await;
    }

    /// Resolves once `stats().requests >= n`.
    ///
    /// # Panics
    /// After [`WAIT_LIMIT`] without getting there.
    pub async fn wait_requests(&self, n: u64) {
        self.wait_for("requests", n, |s| s.requests >= n).await;
    }

    /// Resolves once `stats().completed >= n`.
    ///
    /// # Panics
    /// After [`WAIT_LIMIT`] without getting there.
    pub async fn wait_completed(&self, n: u64) {
        self.wait_for("completed", n, |s| s.completed >= n).await;
    }

    async fn wait_for(&self, what: &str, n: u64, done: impl FnMut(&MockStats) -> bool) {
        let mut stats = self.shared.subscribe();
        // The sender lives in `self.shared`, so the channel cannot close while we wait.
        if tokio::time::timeout(WAIT_LIMIT, stats.wait_for(done))
            .await
            .is_err()
        {
            panic!(
                "the mock's `{what}` count did not reach {n} within {WAIT_LIMIT:?}: {:?}",
                self.stats()
            );
        }
    }

    /// Stops accepting, closes every connection, and waits for the listener to be released.
    pub async fn shutdown(mut self) {
        self.accept.abort();
        let _ = (&mut self.accept).await;
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        // The accept task owns the connection tasks: aborting it drops (and aborts) them all.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream, tls.clone(), Arc::clone(&shared)));
                }
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
            // Reap finished connections so the set does not grow with every one served.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(stream: TcpStream, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    // Events are small writes that must leave at once; Nagle would hold them back.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| {
        let shared = Arc::clone(&shared);
        async move { Ok::<_, Infallible>(handler::handle(shared, request).await) }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    // Connection errors (client resets, scripted cuts, failed handshakes) are part of the job;
    // there is no one to report them to.
    match tls {
        None => {
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
        Some(acceptor) => {
            if let Ok(stream) = acceptor.accept(stream).await {
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        }
    }
}
