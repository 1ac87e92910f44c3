//! `[[clients]]`: the local callers' keys (as SHA-256 digests) and the tenant each belongs to.

use std::collections::BTreeMap;

use super::{Cx, repeat_of};
use crate::config::ClientEntry;
use crate::config::file::ClientFile;

/// SHA-256 of the empty string: with it, an empty `x-api-key:` header would authenticate.
const EMPTY_KEY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

pub(crate) fn build(items: &[ClientFile], cx: &mut Cx) -> Vec<ClientEntry> {
    let mut out = Vec::new();
    let mut first_seen: BTreeMap<[u8; 32], usize> = BTreeMap::new();
    for (i, c) in items.iter().enumerate() {
        let at = format!("clients[{i}]");
        let tenant = cx.required(c.tenant.as_ref(), &format!("{at}.tenant"));
        let tenant = tenant.filter(|t| {
            let ok = super::is_ident(t);
            if !ok {
                cx.err(
                    &format!("{at}.tenant"),
                    "not a lowercase identifier ([a-z0-9_-]+)",
                );
            }
            ok
        });
        let key_at = format!("{at}.key_sha256");
        let key = cx
            .required(c.key_sha256.as_deref(), &key_at)
            .and_then(|s| sha256_hex(s, &key_at, cx));
        if let Some(key) = key {
            // Two tenants behind one key would make the caller's tenant ambiguous.
            if let Some(j) = repeat_of(&mut first_seen, key, i) {
                cx.err(
                    &key_at,
                    format!("the same key is already given to clients[{j}]"),
                );
            }
        }
        if let (Some(tenant), Some(key_sha256)) = (tenant, key) {
            out.push(ClientEntry {
                tenant: tenant.clone(),
                key_sha256,
            });
        }
    }
    out
}

/// 64 hex digits. The message never quotes the value: a raw key pasted here instead of its
/// digest is the likely mistake.
fn sha256_hex(s: &str, path: &str, cx: &mut Cx) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    if hex::decode_to_slice(s.trim(), &mut digest).is_err() {
        cx.err(
            path,
            "expected 64 hex digits (the SHA-256 of the client key, e.g. from \
             `printf %s KEY | sha256sum`)",
        );
        return None;
    }
    if s.trim().eq_ignore_ascii_case(EMPTY_KEY_SHA256) {
        cx.err(
            path,
            "this is the SHA-256 of the empty string: an empty key would authenticate",
        );
        return None;
    }
    Some(digest)
}
