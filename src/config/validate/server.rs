//! `[server]`: the listeners and the per-request limits of the data plane.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::reader::{self, Cx, Table};
use crate::config::{ServerConfig, ServerLimits};

pub(crate) const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8787);
pub(crate) const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9787);
pub(crate) const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

pub(crate) fn parse(mut t: Table, cx: &mut Cx) -> ServerConfig {
    let listen = t
        .opt(cx, "listen", reader::socket_addr)
        .unwrap_or(DEFAULT_LISTEN);
    let admin_listen = t
        .opt(cx, "admin_listen", reader::socket_addr)
        .unwrap_or(DEFAULT_ADMIN_LISTEN);
    // Port 0 asks the OS for a free port, so two such listeners never collide.
    if listen == admin_listen && listen.port() != 0 {
        cx.err(
            &t.child("admin_listen"),
            format!("`{admin_listen}` is also the data plane's listen address"),
        );
    }
    let max_body_bytes = t
        .opt(cx, "max_body_bytes", reader::positive_usize)
        .unwrap_or(DEFAULT_MAX_BODY_BYTES);
    let default_deadline = t
        .opt(cx, "default_deadline", reader::positive_duration)
        .unwrap_or(DEFAULT_DEADLINE);
    // Zero is meaningful here: stop at once without waiting for in-flight requests.
    let shutdown_grace = t
        .opt(cx, "shutdown_grace", reader::duration)
        .unwrap_or(DEFAULT_SHUTDOWN_GRACE);
    let limits = parse_limits(&mut t, cx);
    t.finish(cx);
    ServerConfig {
        listen,
        admin_listen,
        max_body_bytes,
        default_deadline,
        shutdown_grace,
        limits,
    }
}

/// The keys of SPEC §14 that bound connections.
fn parse_limits(t: &mut Table, cx: &mut Cx) -> ServerLimits {
    let d = ServerLimits::default();
    let dur = |t: &mut Table, cx: &mut Cx, key: &str, default: Duration| {
        t.opt(cx, key, reader::positive_duration).unwrap_or(default)
    };
    ServerLimits {
        header_read_timeout: dur(t, cx, "header_read_timeout", d.header_read_timeout),
        body_read_timeout: dur(t, cx, "body_read_timeout", d.body_read_timeout),
        connection_idle_timeout: dur(t, cx, "connection_idle_timeout", d.connection_idle_timeout),
        max_connections: t
            .opt(cx, "max_connections", reader::positive_usize)
            .unwrap_or(d.max_connections),
        admin_max_connections: t
            .opt(cx, "admin_max_connections", reader::positive_usize)
            .unwrap_or(d.admin_max_connections),
        max_event_bytes: t
            .opt(cx, "max_event_bytes", reader::positive_usize)
            .unwrap_or(d.max_event_bytes),
        max_buffered_bytes: t
            .opt(cx, "max_buffered_bytes", reader::positive_usize)
            .unwrap_or(d.max_buffered_bytes),
    }
}
