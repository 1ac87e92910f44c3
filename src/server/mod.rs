//! `legate serve`: binds the data and admin planes, wires the proxy, and runs graceful shutdown
//! (SPEC §6): readiness false at once, new connections refused, in-flight requests and streams
//! finish within `shutdown_grace`, streams still open then end with an error event.

pub mod admin;
pub mod caller;
pub mod conn;
pub(crate) mod h1;
pub mod listener;
pub mod release;
pub mod reload;
pub mod roster;
pub mod stall;
pub mod workers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::meter::Ledger;
use crate::proxy::{Proxy, Snapshot};
use crate::telemetry::Metrics;
use admin::Admin;
pub use caller::CallerBody;
pub use reload::{ConfigSource, ReloadOutcome, Reloader};

/// At most this much of a request body that was answered without being read (a refusal) is
/// read and thrown away afterwards, over either protocol, so that a client still sending it
/// gets to read the answer: a larger rest ends the connection (HTTP/1) or the stream (HTTP/2).
pub const REFUSED_BODY_MAX: u64 = 128 << 20;

/// A running legate: its bound addresses and the handle to stop it.
pub struct RunningServer {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub proxy: Arc<Proxy>,
    admin: Arc<Admin>,
    stop_data: CancellationToken,
    stop_admin: CancellationToken,
    data_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    release_task: JoinHandle<()>,
    pub reloader: Arc<Reloader>,
}

/// A listening socket at `addr` whose accept backlog is the kernel's bound
/// (`net.core.somaxconn`) rather than 128: a burst of connections past the backlog waits for
/// a SYN retransmit, a second or more, and connections past a full plane wait there
/// ([`listener`]).
fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    const BACKLOG: u32 = 4096;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As a listener bound by tokio has it: a restart can bind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Binds both listeners and starts serving, without a source to reload the config from.
pub async fn start(cfg: Config, registry: Registry) -> Result<RunningServer, String> {
    start_reloadable(cfg, registry, None).await
}

/// Binds both listeners and starts serving; `source` re-reads the config on reload. Fails
/// (before serving anything) when a listener cannot be bound or a provider's TLS material
/// cannot be loaded.
pub async fn start_reloadable(
    cfg: Config,
    registry: Registry,
    source: Option<ConfigSource>,
) -> Result<RunningServer, String> {
    let metrics = Arc::new(Metrics::new(&registry).map_err(|e| format!("metrics: {e}"))?);
    let cfg = Arc::new(cfg);
    let lanes = Arc::new(crate::upstream::Lanes::new(metrics.clone()));
    let snapshot = Snapshot::new(cfg.clone(), &lanes)?;
    let key_watchers: Vec<JoinHandle<()>> = snapshot
        .upstreams
        .values()
        .filter_map(|u| u.spawn_key_watch())
        .collect();
    let data = listen(cfg.server.listen)
        .map_err(|e| format!("server.listen {}: {e}", cfg.server.listen))?;
    let admin_l = listen(cfg.server.admin_listen)
        .map_err(|e| format!("server.admin_listen {}: {e}", cfg.server.admin_listen))?;
    let data_addr = data.local_addr().map_err(|e| e.to_string())?;
    let admin_addr = admin_l.local_addr().map_err(|e| e.to_string())?;

    let observer = Arc::new(crate::observe::Observer::start(&cfg.observe, &registry)?);
    let proxy = Arc::new(
        Proxy::new(
            snapshot,
            lanes,
            metrics,
            Arc::new(Ledger::default()),
            data_addr.ip(),
        )
        .with_observer(observer),
    );
    let reloader = Arc::new(Reloader::new(source, proxy.clone(), &cfg, key_watchers));
    let admin = Arc::new(Admin {
        proxy: proxy.clone(),
        registry,
        ready: Default::default(),
        reloader: reloader.clone(),
        held: Default::default(),
        listen_ip: admin_addr.ip(),
    });

    let stop_data = CancellationToken::new();
    let p = proxy.clone();
    let handler = Arc::new(move |req, _peer| p.clone().handle(req));
    let abort = proxy.abort_streams.clone();
    // The grace in force when shutdown starts: a reload may have changed it.
    let p = proxy.clone();
    let grace = move || p.snapshot.load().cfg.server.shutdown_grace;
    let limits = cfg.server.limits.clone();
    let p = proxy.clone();
    let conn_limits = move || {
        let l = &p.snapshot.load().cfg.server.limits;
        conn::ConnLimits {
            header_read_timeout: l.header_read_timeout,
            connection_idle_timeout: l.connection_idle_timeout,
            body_read_timeout: l.body_read_timeout,
        }
    };
    let data_workers = match cfg.server.worker_threads {
        0 | 1 => None,
        n => Some(Arc::new(
            workers::Workers::start(n)
                .await
                .map_err(|e| format!("server.worker_threads: {e}"))?,
        )),
    };
    let data_plane = listener::Plane {
        limits: conn_limits.clone(),
        max_connections: listener::data_cap(limits.max_connections, limits.admin_max_connections),
        gauge: proxy.metrics.connections.with_label_values(&["data"]),
        workers: data_workers,
        on_refused: Some({
            let proxy = proxy.clone();
            Arc::new(move |head: &listener::RefusedHead| Some(proxy.refused_head(head)))
        }),
        counts_ends: true,
    };
    let admin_plane = listener::Plane {
        limits: conn_limits,
        max_connections: limits.admin_max_connections,
        gauge: proxy.metrics.connections.with_label_values(&["admin"]),
        workers: None,
        on_refused: None,
        counts_ends: false,
    };
    let data_task = tokio::spawn(listener::serve(
        data,
        handler,
        data_plane,
        stop_data.clone(),
        grace,
        move || abort.cancel(),
    ));

    let stop_admin = CancellationToken::new();
    let a = admin.clone();
    // Boxed, as the listener used to box every handler's future: it keeps a handler's future
    // inline in each connection (see `listener::serve`), and the admin plane's is not made
    // small; a box per scrape or admin call costs the data plane nothing.
    let admin_handler = Arc::new(move |req, peer| {
        Box::into_pin(Box::write(Box::new_uninit(), a.clone().handle(req, peer)))
    });
    let admin_task = tokio::spawn(listener::serve(
        admin_l,
        admin_handler,
        admin_plane,
        stop_admin.clone(),
        || std::time::Duration::from_secs(1),
        || {},
    ));
    let release_task = release::spawn(proxy.clone());
    admin.ready.store(true, Ordering::SeqCst);
    Ok(RunningServer {
        data_addr,
        admin_addr,
        proxy,
        admin,
        stop_data,
        stop_admin,
        data_task,
        admin_task,
        release_task,
        reloader,
    })
}

impl RunningServer {
    /// Drains: `/readyz` turns 503 at once, the data listener closes, in-flight requests and
    /// streams get `shutdown_grace` to finish; then the admin plane stops too.
    pub async fn shutdown(self) {
        self.admin.ready.store(false, Ordering::SeqCst);
        self.stop_data.cancel();
        let _ = self.data_task.await;
        self.stop_admin.cancel();
        let _ = self.admin_task.await;
        self.release_task.abort();
        self.reloader.stop_watchers();
        // Spans of the requests that just finished still go out, within a bounded wait.
        self.proxy.observer.shutdown().await;
    }
}

/// Runs until SIGTERM or SIGINT (reloading on SIGHUP), then shuts down gracefully. Prints one
/// line with both bound addresses to stdout so that scripts and tests started with port 0 can
/// find them.
pub async fn run(cfg: Config, registry: Registry, source: ConfigSource) -> Result<(), String> {
    // Installed before anything is served: a signal that comes between readiness and its
    // handler took the default action (SIGHUP killed the process, SIGTERM ended it without
    // draining). One that comes before the wait below is kept for it.
    let signals = Signals::install();
    let server = start_reloadable(cfg, registry, Some(source)).await?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "legate listening on http://{} (admin http://{})",
            server.data_addr, server.admin_addr
        );
        let _ = out.flush();
    }
    tracing::info!(data = %server.data_addr, admin = %server.admin_addr, "legate serving");
    let mut signals = signals;
    signals.wait(&server.reloader).await;
    tracing::info!("shutting down: draining in-flight requests");
    // A second SIGTERM or SIGINT during the drain (an operator's second Ctrl-C) ends it at once:
    // what is still in flight is cut when the runtime stops. One within a second of the first
    // is the same stop told twice (a terminal's SIGINT to the process group and a
    // supervisor's SIGTERM after it), not a second one.
    let first = tokio::time::Instant::now();
    let second = async {
        loop {
            signals.next_stop().await;
            if first.elapsed() >= std::time::Duration::from_secs(1) {
                break;
            }
        }
    };
    tokio::select! {
        () = server.shutdown() => tracing::info!("stopped"),
        () = second => {
            tracing::warn!("a second stop signal during the drain: stopping now, cutting what is still in flight");
        }
    }
    Ok(())
}

/// The process's SIGTERM, SIGINT and SIGHUP handlers (None: they could not be installed).
struct Signals(
    Option<(
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
    )>,
);

impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(int), Ok(hup)) => Signals(Some((term, int, hup))),
            _ => Signals(None),
        }
    }

    /// Runs until SIGTERM or SIGINT, reloading on SIGHUP.
    async fn wait(&mut self, reloader: &Arc<Reloader>) {
        let Some((term, int, hup)) = &mut self.0 else {
            tracing::error!("could not install signal handlers; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        wait_for_signal(reloader, (term, int, hup)).await;
    }

    /// The next SIGTERM or SIGINT (never, without handlers).
    async fn next_stop(&mut self) {
        match &mut self.0 {
            Some((term, int, _)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// Waits for SIGTERM or SIGINT, reloading on each SIGHUP. A reload runs on the blocking pool
/// while the signals are still listened to: one that never ends (a config or key file on a
/// hung mount) must not keep SIGTERM from being seen. One reload runs at a time; SIGHUPs that
/// come meanwhile make one more after it.
async fn wait_for_signal(
    reloader: &Arc<Reloader>,
    (term, int, hup): (
        &mut tokio::signal::unix::Signal,
        &mut tokio::signal::unix::Signal,
        &mut tokio::signal::unix::Signal,
    ),
) {
    let start = || {
        let reloader = Arc::clone(reloader);
        // Reading and validating the config is blocking work: off the runtime worker.
        tokio::task::spawn_blocking(move || {
            reloader.reload();
        })
    };
    let mut running: Option<tokio::task::JoinHandle<()>> = None;
    let mut again = false;
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => {
                if running.is_some() {
                    tracing::info!("SIGHUP: a reload is under way; another follows it");
                    again = true;
                } else {
                    tracing::info!("SIGHUP: reloading the config");
                    running = Some(start());
                }
            }
            _ = async {
                match running.as_mut() {
                    Some(reload) => {
                        let _ = reload.await;
                    }
                    None => std::future::pending().await,
                }
            }, if running.is_some() => {
                running = std::mem::take(&mut again).then(|| {
                    tracing::info!("reloading the config again (a SIGHUP came during the last reload)");
                    start()
                });
            }
        }
    }
}
