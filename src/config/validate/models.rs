//! `[[models]]` (a model name's fallback chain) and `[routing]` (the provider for model names
//! without an entry): everything that names providers by reference.

use std::collections::BTreeMap;

use config::{Value, ValueKind};

use super::providers::Providers;
use super::reader::{self, Cx, Table};
use crate::config::{ApiKind, ChainStep, ModelEntry, RoutingConfig};

pub(crate) fn parse_models(
    items: &[Value],
    path: &str,
    providers: &Providers,
    cx: &mut Cx,
) -> Vec<ModelEntry> {
    let mut out = Vec::new();
    let mut first_seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let Some(mut t) = Table::of(item, &item_path, cx) else {
            continue;
        };
        let name = t.req(cx, "name", reader::non_empty_string);
        if let Some(name) = &name {
            if let Some(j) = first_seen.get(name) {
                cx.err(
                    &t.child("name"),
                    format!("model `{name}` is already defined at {path}[{j}]"),
                );
            } else {
                first_seen.insert(name.clone(), i);
            }
        }
        let chain = chain(&mut t, providers, cx);
        t.finish(cx);
        if let (Some(name), Some(chain)) = (name, chain) {
            out.push(ModelEntry { name, chain });
        }
    }
    out
}

fn chain(t: &mut Table, providers: &Providers, cx: &mut Cx) -> Option<Vec<ChainStep>> {
    let Some((value, path)) = t.get("chain") else {
        cx.err(&t.child("chain"), "missing required key");
        return None;
    };
    let ValueKind::Array(items) = &value.kind else {
        cx.err(&path, "expected an array of \"provider:model\" steps");
        return None;
    };
    if items.is_empty() {
        cx.err(&path, "a chain needs at least one step");
        return None;
    }
    let mut steps = Vec::new();
    // Steps may speak either API: a step of the other kind is served through translation.
    for (j, item) in items.iter().enumerate() {
        let step_path = format!("{path}[{j}]");
        let Some((step, target_path)) = step(item, &step_path, cx) else {
            continue;
        };
        if !providers.kinds.contains_key(&step.provider) {
            cx.err(
                &target_path,
                format!(
                    "unknown provider `{}` ({})",
                    step.provider,
                    providers.names()
                ),
            );
        }
        steps.push(step);
    }
    (steps.len() == items.len()).then_some(steps)
}

/// One step, either `"provider:model"` or `{ target, max_tokens, drop_thinking }`. Returns the
/// step and the path at which its target is reported.
fn step(item: &Value, path: &str, cx: &mut Cx) -> Option<(ChainStep, String)> {
    let (target, target_path, max_tokens, drop_thinking) = match &item.kind {
        ValueKind::String(s) => (Some(s.clone()), path.to_owned(), None, false),
        ValueKind::Table(_) => {
            let mut t = Table::of(item, path, cx)?;
            let target = t.req(cx, "target", reader::string);
            let max_tokens = t.opt(cx, "max_tokens", reader::positive_uint);
            let drop_thinking = t.opt(cx, "drop_thinking", reader::boolean);
            let target_path = t.child("target");
            t.finish(cx);
            (
                target,
                target_path,
                max_tokens,
                drop_thinking.unwrap_or(false),
            )
        }
        _ => {
            cx.err(
                path,
                "expected \"provider:model\" or { target = \"provider:model\", … }",
            );
            return None;
        }
    };
    let target = target?;
    let (provider, model) = reader::split_target(&target)
        .map_err(|m| cx.err(&target_path, m))
        .ok()?;
    let step = ChainStep {
        provider: provider.to_owned(),
        model: model.to_owned(),
        max_tokens,
        drop_thinking,
    };
    Some((step, target_path))
}

pub(crate) fn parse_routing(mut t: Table, providers: &Providers, cx: &mut Cx) -> RoutingConfig {
    let anthropic = route(&mut t, ApiKind::Anthropic, providers, cx);
    let openai = route(&mut t, ApiKind::OpenAi, providers, cx);
    t.finish(cx);
    RoutingConfig { anthropic, openai }
}

/// The default provider of one inbound API. When `[routing]` leaves it out: the provider named
/// after the API, else the only provider of that kind.
fn route(t: &mut Table, api: ApiKind, providers: &Providers, cx: &mut Cx) -> String {
    let key = api.as_str();
    let path = t.child(key);
    let named = t.opt(cx, key, reader::string);
    let Some(name) = named.or_else(|| default_route(api, providers)) else {
        cx.err(
            &path,
            format!(
                "no provider of kind {key} to serve this API; declare one under [providers] \
                 and name it here"
            ),
        );
        return String::new();
    };
    match providers.kinds.get(&name) {
        None => cx.err(
            &path,
            format!("unknown provider `{name}` ({})", providers.names()),
        ),
        Some(Some(kind)) if *kind != api => cx.err(
            &path,
            format!(
                "provider `{name}` is of kind {}, but this route needs kind {key}",
                kind.as_str()
            ),
        ),
        Some(_) => {}
    }
    name
}

fn default_route(api: ApiKind, providers: &Providers) -> Option<String> {
    if providers.kinds.contains_key(api.as_str()) {
        return Some(api.as_str().to_owned());
    }
    let mut of_kind = providers
        .kinds
        .iter()
        .filter(|(_, k)| **k == Some(api))
        .map(|(name, _)| name);
    match (of_kind.next(), of_kind.next()) {
        (Some(only), None) => Some(only.clone()),
        _ => None,
    }
}
