//! `[tenants.*]`, `[ratelimit]`, `[shedding]` and `[responses]`: who may send how much, where the buckets
//! live, and when lower-priority work waits or is shed.

use std::collections::BTreeMap;

use config::Value;

use super::reader::{self, Cx, Table};
use crate::config::{
    Priority, RateLimitConfig, ResponsesConfig, SheddingConfig, StoreKind, TenantConfig,
};

pub(crate) fn parse_tenants(t: Table, cx: &mut Cx) -> BTreeMap<String, TenantConfig> {
    let mut out = BTreeMap::new();
    let mut t = t;
    for name in t.keys() {
        let Some((value, path)) = t.get(name) else {
            continue;
        };
        if !reader::is_ident(name) {
            cx.err(
                &path,
                format!("tenant name `{name}` is not a lowercase identifier ([a-z0-9_-]+)"),
            );
            continue;
        }
        let Some(table) = Table::of(value, &path, cx) else {
            continue;
        };
        out.insert(name.to_owned(), tenant(table, cx));
    }
    t.finish(cx);
    out.entry("default".to_string()).or_default();
    out
}

fn tenant(mut t: Table, cx: &mut Cx) -> TenantConfig {
    let d = TenantConfig::default();
    let priority = t.opt(cx, "priority", priority).unwrap_or(d.priority);
    let requests_per_minute = t.opt(cx, "requests_per_minute", reader::uint).unwrap_or(0);
    let tokens_per_minute = t.opt(cx, "tokens_per_minute", reader::uint).unwrap_or(0);
    let daily_budget_pico = t
        .opt(cx, "daily_budget_usd", usd)
        .unwrap_or(d.daily_budget_pico);
    t.finish(cx);
    TenantConfig {
        priority,
        requests_per_minute,
        tokens_per_minute,
        daily_budget_pico,
    }
}

pub(crate) fn priority(v: &Value, path: &str, cx: &mut Cx) -> Option<Priority> {
    let s = reader::string(v, path, cx)?;
    Priority::parse(&s).or_else(|| {
        cx.err(
            path,
            format!("`{s}` is not a priority (interactive, background or batch)"),
        );
        None
    })
}

fn usd(v: &Value, path: &str, cx: &mut Cx) -> Option<u128> {
    let s = reader::string(v, path, cx)?;
    crate::meter::parse_usd(&s)
        .map_err(|e| {
            cx.err(
                path,
                format!("{e}; write an exact decimal string like \"25.50\""),
            )
        })
        .ok()
}

pub(crate) fn parse_ratelimit(mut t: Table, cx: &mut Cx) -> RateLimitConfig {
    let d = RateLimitConfig::default();
    let store_path = t.child("store");
    let store = t
        .opt(cx, "store", reader::string)
        .map(|s| match s.trim() {
            "memory" => Some(StoreKind::Memory),
            "redis" => Some(StoreKind::Redis),
            other => {
                cx.err(
                    &store_path,
                    format!("`{other}` is not a store (memory or redis)"),
                );
                None
            }
        })
        .unwrap_or(Some(d.store));
    let redis_url = t.opt(cx, "redis_url", reader::non_empty_string);
    if let Some(url) = &redis_url {
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            cx.err(
                &t.child("redis_url"),
                "expected a redis:// or rediss:// URL",
            );
        }
    }
    if store == Some(StoreKind::Redis) && redis_url.is_none() {
        cx.err(
            &t.child("redis_url"),
            "store = \"redis\" needs redis_url (e.g. \"redis://127.0.0.1:6379/0\")",
        );
    }
    let default_output_reservation = t
        .opt(cx, "default_output_reservation", reader::positive_uint)
        .unwrap_or(d.default_output_reservation);
    t.finish(cx);
    RateLimitConfig {
        store: store.unwrap_or(d.store),
        redis_url,
        default_output_reservation,
    }
}

pub(crate) fn parse_shedding(mut t: Table, cx: &mut Cx) -> SheddingConfig {
    let d = SheddingConfig::default();
    let queue_limit = t
        .opt(cx, "queue_limit", reader::positive_usize)
        .unwrap_or(d.queue_limit);
    let pace_below = t
        .opt(cx, "pace_below", reader::ratio)
        .unwrap_or(d.pace_below);
    t.finish(cx);
    SheddingConfig {
        queue_limit,
        pace_below,
    }
}

/// `[responses]`: the conversation store. `redis` uses `ratelimit.redis_url` (checked by the
/// caller, which sees both sections).
pub(crate) fn parse_responses(mut t: Table, cx: &mut Cx) -> ResponsesConfig {
    let d = ResponsesConfig::default();
    let store_path = t.child("store");
    let store = t
        .opt(cx, "store", reader::string)
        .and_then(|s| match s.trim() {
            "memory" => Some(StoreKind::Memory),
            "redis" => Some(StoreKind::Redis),
            other => {
                cx.err(
                    &store_path,
                    format!("`{other}` is not a store (memory or redis)"),
                );
                None
            }
        })
        .unwrap_or(d.store);
    let max_bytes = t
        .opt(cx, "max_bytes", reader::positive_usize)
        .unwrap_or(d.max_bytes);
    let ttl = t.opt(cx, "ttl", reader::positive_duration).unwrap_or(d.ttl);
    t.finish(cx);
    ResponsesConfig {
        store,
        max_bytes,
        ttl,
    }
}
