//! `[[models]]` (a model name's fallback chain) and `[routing]` (the provider for model names
//! without an entry): everything that names providers by reference.

use std::collections::BTreeMap;

use super::providers::Providers;
use super::{Cx, repeat_of};
use crate::config::file::{ModelFile, RoutingFile, StepFile};
use crate::config::{ApiKind, ChainStep, ModelEntry, RoutingConfig};

pub(crate) fn build_models(
    items: &[ModelFile],
    providers: &Providers,
    cx: &mut Cx,
) -> Vec<ModelEntry> {
    let mut out = Vec::new();
    let mut first_seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, m) in items.iter().enumerate() {
        let at = format!("models[{i}]");
        let name = cx.required(m.name.as_deref(), &format!("{at}.name"));
        match name {
            Some(n) if n.trim().is_empty() => cx.err(&format!("{at}.name"), "must not be empty"),
            Some(n) => {
                if let Some(j) = repeat_of(&mut first_seen, n, i) {
                    let message = format!("model `{n}` is already defined at models[{j}]");
                    cx.err(&format!("{at}.name"), message);
                }
            }
            None => {}
        }
        let chain = chain(m.chain.as_deref(), &format!("{at}.chain"), providers, cx);
        if let (Some(name), Some(chain)) = (name, chain) {
            out.push(ModelEntry {
                name: name.to_owned(),
                chain,
            });
        }
    }
    out
}

fn chain(
    items: Option<&[StepFile]>,
    at: &str,
    providers: &Providers,
    cx: &mut Cx,
) -> Option<Vec<ChainStep>> {
    let items = cx.required(items, at)?;
    if items.is_empty() {
        cx.err(at, "a chain needs at least one step");
        return None;
    }
    let mut steps = Vec::new();
    // Steps may speak either API: a step of the other kind is served through translation.
    for (j, item) in items.iter().enumerate() {
        let step_at = format!("{at}[{j}]");
        let (target, target_at, max_tokens, drop_thinking) = match item {
            StepFile::Target(t) => (Some(t), step_at, None, false),
            StepFile::Fitted(t) => (
                t.target.as_ref(),
                format!("{step_at}.target"),
                t.max_tokens.map(|n| n.get()),
                t.drop_thinking,
            ),
        };
        let Some(target) = cx.required(target, &target_at) else {
            continue;
        };
        let Ok((provider, model)) = super::split_target(target).map_err(|m| cx.err(&target_at, m))
        else {
            continue;
        };
        if !providers.kinds.contains_key(provider) {
            cx.err(
                &target_at,
                format!(
                    "unknown provider `{}` ({})",
                    crate::config::shown::shown(provider),
                    providers.names()
                ),
            );
        }
        steps.push(ChainStep::new(provider, model, max_tokens, drop_thinking));
    }
    (steps.len() == items.len()).then_some(steps)
}

pub(crate) fn build_routing(r: &RoutingFile, providers: &Providers, cx: &mut Cx) -> RoutingConfig {
    RoutingConfig {
        anthropic: route(r.anthropic.as_ref(), ApiKind::Anthropic, providers, cx),
        openai: route(r.openai.as_ref(), ApiKind::OpenAi, providers, cx),
    }
}

/// The default provider of one inbound API. When `[routing]` leaves it out: the provider named
/// after the API, else the only provider of that kind.
fn route(named: Option<&String>, api: ApiKind, providers: &Providers, cx: &mut Cx) -> String {
    let key = api.as_str();
    let path = format!("routing.{key}");
    let Some(name) = named.cloned().or_else(|| default_route(api, providers)) else {
        // No provider speaks this API (an Ollama-only or Anthropic-only deployment): it has no
        // default, and only the names [[models]] routes are served on it (`render::warnings`
        // says so). Several of its kind and none named is a choice left to the operator.
        if providers.kinds.values().any(|k| *k == Some(api)) {
            cx.err(
                &path,
                format!(
                    "several providers of kind {key} and none named after it: name the one \
                     that serves this API's models not in [[models]]"
                ),
            );
        }
        return String::new();
    };
    match providers.kinds.get(&name) {
        None => cx.err(
            &path,
            format!(
                "unknown provider `{}` ({})",
                crate::config::shown::shown(&name),
                providers.names()
            ),
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
