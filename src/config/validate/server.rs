//! `[server]`: the listeners and the limits of the data plane.

use super::Cx;
use crate::config::file::ServerFile;
use crate::config::{ServerConfig, ServerLimits};

pub(crate) fn build(s: &ServerFile, cx: &mut Cx) -> ServerConfig {
    // Port 0 asks the OS for a free port, so two such listeners never collide.
    if s.listen == s.admin_listen && s.listen.port() != 0 {
        cx.err(
            "server.admin_listen",
            format!(
                "`{}` is also the data plane's listen address",
                s.admin_listen
            ),
        );
    }
    ServerConfig {
        listen: s.listen,
        admin_listen: s.admin_listen,
        max_body_bytes: s.max_body_bytes.get(),
        default_deadline: s.default_deadline,
        shutdown_grace: s.shutdown_grace,
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
