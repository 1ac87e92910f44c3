//! Opens a Redis connection over a stream legate makes itself, so that the stream can carry
//! the reply bound ([`super::reply_bound::Capped`]): the Redis client's own connect gives no
//! way in between its socket and its parser.
//!
//! Plain TCP (`redis://`) and TLS (`rediss://`, verified against the system's roots, as the
//! client's own TLS does) are what legate's configuration accepts. `rediss://…#insecure`,
//! which skips verification, is refused when the store is built, as the client built without
//! its insecure feature refused it (at every connect).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::reply_bound::Capped;

/// A connection's driver task, ended when this is dropped. The client's own connect ties its
/// driver to the last handle of the connection; a connection built on a stream of one's own
/// leaves the task to its maker, and a driver blocked writing to a Redis that stopped reading
/// would otherwise outlive every handle, with its socket and the bytes it was writing.
pub(super) struct Driver {
    task: tokio::task::AbortHandle,
    too_large: Arc<AtomicBool>,
}

impl Driver {
    /// Whether the connection has ended (Redis closed it, say after its idle timeout): a
    /// call on it would fail without being sent.
    pub(super) fn ended(&self) -> bool {
        self.task.is_finished()
    }

    /// Whether the connection failed on a reply refused for its size.
    pub(super) fn refused_a_reply(&self) -> bool {
        self.too_large.load(Ordering::Acquire)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where and how to connect, checked once.
pub(super) struct Target {
    info: ConnectionInfo,
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

impl Target {
    pub(super) fn new(info: ConnectionInfo) -> Result<Self, RedisError> {
        let (host, port, tls) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host.clone(), *port, None),
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                ..
            } => (host.clone(), *port, Some(tls_connector()?)),
            ConnectionAddr::TcpTls { insecure: true, .. } => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "rediss:// without certificate verification (#insecure) is not supported",
                )));
            }
            _ => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "only redis:// and rediss:// addresses are supported",
                )));
            }
        };
        Ok(Target {
            info,
            host,
            port,
            tls,
        })
    }

    /// A new connection, set up (authenticated, database selected) within `timeout`, whose
    /// replies may each be at most `max_reply` bytes. Its driver runs as a task of the
    /// current runtime until the [`Driver`] returned with it is dropped.
    pub(super) async fn open(
        &self,
        config: &AsyncConnectionConfig,
        timeout: Duration,
        max_reply: usize,
    ) -> Result<(MultiplexedConnection, Driver), RedisError> {
        let too_large = Arc::new(AtomicBool::new(false));
        let opened = tokio::time::timeout(timeout, async {
            let stream = self.stream().await?;
            MultiplexedConnection::new_with_config(
                self.info.redis_settings(),
                Capped::new(stream, max_reply, too_large.clone()),
                config.clone(),
            )
            .await
        })
        .await;
        let (conn, driver) = match opened {
            Ok(result) => result?,
            Err(_) => {
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connecting to Redis timed out",
                )));
            }
        };
        let task = tokio::spawn(driver).abort_handle();
        Ok((conn, Driver { task, too_large }))
    }

    /// A TCP connection to the first of the host's addresses to answer, all tried at once (as
    /// the client's own connect does): one address that drops packets must not use up the
    /// whole connect timeout when another answers.
    async fn tcp(&self) -> std::io::Result<TcpStream> {
        let addrs: Vec<_> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .take(MAX_ADDRS)
            .collect();
        if addrs.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the Redis host has no address",
            ));
        }
        let tries = addrs.into_iter().map(|a| Box::pin(TcpStream::connect(a)));
        futures_util::future::select_ok(tries)
            .await
            .map(|(tcp, _)| tcp)
    }

    async fn stream(&self) -> Result<Box<dyn Io>, RedisError> {
        let tcp = self.tcp().await?;
        // Calls are small and each waits for its reply.
        tcp.set_nodelay(true)?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let name = ServerName::try_from(self.host.clone()).map_err(|_| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "the Redis host is not a valid TLS server name",
            ))
        })?;
        Ok(Box::new(tls.connect(name, tcp).await?))
    }
}

/// The most addresses of one host tried at once.
const MAX_ADDRS: usize = 8;

/// TLS verified against the system's roots, as the Redis client's own TLS is.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, RedisError> {
    let mut roots = rustls::RootCertStore::empty();
    crate::upstream::add_native_roots(&mut roots);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| RedisError::from((ErrorKind::InvalidClientConfig, "TLS setup failed")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
