//! `[tenants.*]` and `[ratelimit]`: tenant names, and a bucket store that can be reached.

use std::collections::BTreeMap;

use super::Cx;
use crate::config::{RateLimitConfig, StoreKind, TenantConfig};

/// The tenants as read, with `default` always present.
pub(crate) fn tenants(
    mut tenants: BTreeMap<String, TenantConfig>,
    cx: &mut Cx,
) -> BTreeMap<String, TenantConfig> {
    tenants.retain(|name, _| {
        let ok = super::is_ident(name);
        if !ok {
            cx.err(
                &format!("tenants.{name}"),
                format!(
                    "tenant name `{}` is not a lowercase identifier ([a-z0-9_-]+)",
                    crate::config::shown::shown(name)
                ),
            );
        }
        ok
    });
    tenants.entry("default".to_owned()).or_default();
    tenants
}

/// The store needs a URL, and the URL must be one the Redis client accepts, checked now:
/// otherwise `serve` would fall back to per-process buckets without a word. The message never
/// shows the URL (it may carry a password).
pub(crate) fn check_ratelimit(r: &RateLimitConfig, cx: &mut Cx) {
    match &r.redis_url {
        Some(url) if !(url.starts_with("redis://") || url.starts_with("rediss://")) => {
            cx.err(
                "ratelimit.redis_url",
                "expected a redis:// or rediss:// URL",
            );
        }
        Some(url) => match redis::IntoConnectionInfo::into_connection_info(url.as_str()) {
            Err(_) => cx.err(
                "ratelimit.redis_url",
                "not a usable Redis URL; expected redis://[:password@]host[:port][/db]",
            ),
            Ok(info)
                if matches!(
                    info.addr(),
                    redis::ConnectionAddr::TcpTls { insecure: true, .. }
                ) =>
            {
                cx.err(
                    "ratelimit.redis_url",
                    "rediss:// without certificate verification (#insecure) is not supported",
                )
            }
            Ok(_) => {}
        },
        None if r.store == StoreKind::Redis => cx.err(
            "ratelimit.redis_url",
            "store = \"redis\" needs redis_url (e.g. \"redis://127.0.0.1:6379/0\")",
        ),
        None => {}
    }
}
