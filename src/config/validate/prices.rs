//! `[[prices]]`: USD per million tokens for each `provider:model`, as exact decimals.

use std::collections::BTreeMap;

use config::{Value, ValueKind};

use super::reader::{self, Cx, Table};
use crate::meter::{Price, parse_usd_per_mtok};

pub(crate) fn parse(items: &[Value], path: &str, cx: &mut Cx) -> BTreeMap<String, Price> {
    let mut out = BTreeMap::new();
    let mut first_seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let Some(mut t) = Table::of(item, &item_path, cx) else {
            continue;
        };
        let model = t.req(cx, "model", target);
        let input = t.req(cx, "input", usd_per_mtok);
        let output = t.req(cx, "output", usd_per_mtok);
        let cache_write = t.opt(cx, "cache_write", usd_per_mtok).unwrap_or(0);
        let cache_read = t.opt(cx, "cache_read", usd_per_mtok).unwrap_or(0);
        if let Some(model) = &model {
            if let Some(j) = first_seen.get(model) {
                cx.err(
                    &t.child("model"),
                    format!("`{model}` already has a price at {path}[{j}]"),
                );
            } else {
                first_seen.insert(model.clone(), i);
            }
        }
        t.finish(cx);
        if let (Some(model), Some(input), Some(output)) = (model, input, output) {
            let price = Price {
                input,
                output,
                cache_write,
                cache_read,
            };
            out.insert(model, price);
        }
    }
    out
}

/// `provider:model`, with a well-formed provider name. The provider need not be configured:
/// a price table may be shared between deployments.
fn target(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    let s = reader::string(v, path, cx)?;
    let (provider, _) = reader::split_target(&s).map_err(|m| cx.err(path, m)).ok()?;
    if !reader::is_ident(provider) {
        cx.err(
            path,
            format!("provider name `{provider}` is not a lowercase identifier ([a-z0-9_-]+)"),
        );
        return None;
    }
    Some(s)
}

/// A decimal string (or a whole number); floats are refused because `0.3` in TOML is already
/// inexact before legate sees it.
fn usd_per_mtok(v: &Value, path: &str, cx: &mut Cx) -> Option<u64> {
    let text = match &v.kind {
        ValueKind::String(s) => s.clone(),
        ValueKind::I64(n) if *n >= 0 => n.to_string(),
        ValueKind::Float(_) => {
            cx.err(
                path,
                "write prices as decimal strings (like \"0.30\") so they stay exact",
            );
            return None;
        }
        _ => {
            cx.err(path, "expected a decimal string of USD per million tokens");
            return None;
        }
    };
    parse_usd_per_mtok(&text).map_err(|m| cx.err(path, m)).ok()
}
