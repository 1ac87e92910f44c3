//! `[[clients]]`: the local callers' keys (as SHA-256 digests) and the tenant each belongs to.

use std::collections::BTreeMap;

use config::Value;

use super::reader::{self, Cx, Table};
use crate::config::ClientEntry;

pub(crate) fn parse(items: &[Value], path: &str, cx: &mut Cx) -> Vec<ClientEntry> {
    let mut out = Vec::new();
    let mut first_seen: BTreeMap<[u8; 32], usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let Some(mut t) = Table::of(item, &item_path, cx) else {
            continue;
        };
        let tenant = t.req(cx, "tenant", reader::ident);
        let key = t.req(cx, "key_sha256", sha256_hex);
        if let Some(key) = key {
            // Two tenants behind one key would make the caller's tenant ambiguous.
            if let Some(j) = first_seen.get(&key) {
                cx.err(
                    &t.child("key_sha256"),
                    format!("the same key is already given to {path}[{j}]"),
                );
            } else {
                first_seen.insert(key, i);
            }
        }
        t.finish(cx);
        if let (Some(tenant), Some(key_sha256)) = (tenant, key) {
            out.push(ClientEntry { tenant, key_sha256 });
        }
    }
    out
}

fn sha256_hex(v: &Value, path: &str, cx: &mut Cx) -> Option<[u8; 32]> {
    let s = reader::string(v, path, cx)?;
    let mut digest = [0u8; 32];
    match hex::decode_to_slice(s.trim(), &mut digest) {
        Ok(()) => Some(digest),
        Err(_) => {
            cx.err(
                path,
                "expected 64 hex digits (the SHA-256 of the client key, e.g. from \
                 `printf %s KEY | sha256sum`)",
            );
            None
        }
    }
}
