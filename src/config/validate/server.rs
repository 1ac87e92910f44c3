//! `[server]`: the listeners, the runtime's threads and the limits of the data plane.

use super::Cx;
use crate::config::file::{ServerFile, WORKER_THREADS_MAX};
use crate::config::{ServerConfig, ServerLimits};

/// tokio's own variable for its worker count; kept working, and it wins over the file.
pub(crate) const WORKER_THREADS_ENV: &str = "TOKIO_WORKER_THREADS";

/// The most connections a plane may be given: a process holds no more descriptors than
/// this on any system legate runs on, and a larger count overflowed the semaphore that holds
/// the slots (a panic at start for the data plane, a dead admin plane beside a live one).
const MAX_CONNECTIONS: usize = 1 << 20;
/// The admin plane's cap: probes, scrapes and operators, counted apart from the data plane.
const MAX_ADMIN_CONNECTIONS: usize = 1 << 16;

pub(crate) fn build(s: &ServerFile, cx: &mut Cx) -> ServerConfig {
    for (key, n, max) in [
        (
            "server.max_connections",
            s.max_connections.get(),
            MAX_CONNECTIONS,
        ),
        (
            "server.admin_max_connections",
            s.admin_max_connections.get(),
            MAX_ADMIN_CONNECTIONS,
        ),
    ] {
        if n > max {
            cx.err(key, format!("at most {max}, not {n}"));
        }
    }
    // Port 0 asks the OS for a free port, so two such listeners never collide. An
    // unspecified address (0.0.0.0, ::) takes its port on every address, the other's too.
    let overlap = s.listen.ip() == s.admin_listen.ip()
        || s.listen.ip().is_unspecified()
        || s.admin_listen.ip().is_unspecified();
    if overlap && s.listen.port() == s.admin_listen.port() && s.listen.port() != 0 {
        cx.err(
            "server.admin_listen",
            format!(
                "`{}` takes the port of the data plane's listen address `{}`",
                s.admin_listen, s.listen
            ),
        );
    }
    if s.max_body_bytes.get() > s.max_buffered_bytes.get() {
        // Such a body could never be held: refused 529 with retry-after for ever, and retried.
        cx.err(
            "server.max_body_bytes",
            format!(
                "{} is more than server.max_buffered_bytes ({}), all the bodies legate holds at once: a body that size could never be read; lower it or raise max_buffered_bytes",
                s.max_body_bytes.get(),
                s.max_buffered_bytes.get()
            ),
        );
    }
    ServerConfig {
        listen: s.listen,
        admin_listen: s.admin_listen,
        max_body_bytes: s.max_body_bytes.get(),
        default_deadline: s.default_deadline,
        shutdown_grace: s.shutdown_grace,
        worker_threads: worker_threads(s.worker_threads, cx),
        limits: ServerLimits {
            header_read_timeout: s.header_read_timeout,
            body_read_timeout: s.body_read_timeout,
            connection_idle_timeout: s.connection_idle_timeout,
            max_connections: s.max_connections.get(),
            admin_max_connections: s.admin_max_connections.get(),
            max_event_bytes: s.max_event_bytes.get(),
            max_buffered_bytes: s.max_buffered_bytes.get(),
        },
    }
}

/// `server.worker_threads`, or `TOKIO_WORKER_THREADS` when set; either must be 1..=256.
fn worker_threads(configured: usize, cx: &mut Cx) -> usize {
    let in_range = |n: usize| (1..=WORKER_THREADS_MAX).contains(&n);
    if let Some(raw) = cx.env.get(WORKER_THREADS_ENV) {
        return match raw.trim().parse::<usize>() {
            Ok(n) if in_range(n) => n,
            _ => {
                cx.err(
                    "server.worker_threads",
                    format!(
                        "{WORKER_THREADS_ENV}=`{raw}` must be a whole number from 1 to {WORKER_THREADS_MAX}"
                    ),
                );
                1
            }
        };
    }
    if !in_range(configured) {
        cx.err(
            "server.worker_threads",
            format!("must be from 1 to {WORKER_THREADS_MAX}, not {configured}"),
        );
        return 1;
    }
    configured
}
