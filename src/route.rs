//! Routing: which provider and model serve a request, and fitting the request body to that step
//! by splicing changed values into the original bytes (never re-serialising the rest: prompt
//! caching keys on the exact bytes, and unknown future fields must survive).

use rustc_hash::FxHashSet as HashSet;
use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;

use crate::api::RequestMeta;
use crate::config::{ApiKind, ChainStep, Config};
use crate::error::ProxyError;
use crate::names;
use crate::splice;

/// The steps that may serve a request, in order: a configured chain is borrowed as it is (its
/// strings were written at config load), and only a chain with a `*` step or the default
/// route makes steps for the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved<'a> {
    Chain(Cow<'a, [ChainStep]>),
    Default(ChainStep),
}

impl Resolved<'_> {
    pub fn steps(&self) -> &[ChainStep] {
        match self {
            Resolved::Chain(steps) => steps,
            Resolved::Default(step) => std::slice::from_ref(step),
        }
    }
}

/// Resolves the model a caller sent on the `api` endpoint to its chain (the most specific
/// `[[models]]` entry, by name or `*` pattern) or to the API's default provider with the model
/// unchanged. A step whose model is `*` sends the caller's model name as it is.
pub fn resolve<'a>(cfg: &'a Config, api: ApiKind, model: &str) -> Result<Resolved<'a>, ProxyError> {
    let entries = cfg.models.iter().map(|m| (m.name.as_str(), m));
    if let Some((_, entry)) = names::best(entries, model) {
        // Steps may speak either API: one of the other kind is served through translation.
        if entry.chain.is_empty() {
            return Err(ProxyError::Internal);
        }
        if !entry.chain.iter().any(|s| s.model() == SAME_MODEL) {
            return Ok(Resolved::Chain(Cow::Borrowed(&entry.chain)));
        }
        let steps = entry
            .chain
            .iter()
            .map(|s| {
                if s.model() == SAME_MODEL {
                    s.with_model(model)
                } else {
                    s.clone()
                }
            })
            .collect();
        return Ok(Resolved::Chain(Cow::Owned(steps)));
    }
    let provider = match api {
        ApiKind::Anthropic => &cfg.routing.anthropic,
        // Responses callers are routed like the other OpenAI API.
        ApiKind::OpenAi | ApiKind::Responses => &cfg.routing.openai,
    };
    // No provider speaks this API: only the names [[models]] routes are served on it.
    if provider.is_empty() {
        return Err(ProxyError::ModelNotFound {
            model: model.to_owned(),
        });
    }
    Ok(Resolved::Default(default_step(provider, model)))
}

/// The longest model name [`default_step`] keeps between requests: a caller's choice, so one
/// far longer than any real name is not held for the thread's life.
const REMEMBERED_MODEL_MAX: usize = 256;

/// The default route's step for `provider` and `model`: the one this thread made last when it
/// names the same two, shared (one reference count) instead of written again into a string of
/// its own, since a caller sends the same model request after request. A step of the default
/// route is made of these two names alone, so a reload that renames or repoints a provider
/// can never be handed a stale one; one step per thread is the whole memory.
fn default_step(provider: &str, model: &str) -> ChainStep {
    thread_local! {
        static LAST: std::cell::RefCell<Option<ChainStep>> = const { std::cell::RefCell::new(None) };
    }
    let made = || ChainStep::new(provider, model, None, false);
    if model.len() > REMEMBERED_MODEL_MAX {
        return made();
    }
    LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return made();
        };
        match &*last {
            Some(step) if step.provider() == provider && step.model() == model => step.clone(),
            _ => {
                let step = made();
                *last = Some(step.clone());
                step
            }
        }
    })
}

/// A chain step's model written as `*`: the caller's own model name.
pub const SAME_MODEL: &str = "*";

/// Fits the original body to `step`: the model name spliced in when it differs, `max_tokens`
/// capped (at the step's `max_tokens` and, when legate chose the model, at the model's output
/// limit `model_limit`), `thinking` removed when the step says so. Returns the original bytes
/// untouched when nothing needs to change.
pub fn fit(
    body: &Bytes,
    meta: &RequestMeta,
    step: &ChainStep,
    api: ApiKind,
    model_limit: Option<u64>,
) -> Result<Bytes, ProxyError> {
    let mut out: Cow<'_, [u8]> = Cow::Borrowed(body.as_ref());
    if step.model() != &*meta.model {
        let v = splice::json_string(step.model());
        out = Cow::Owned(splice::replace_top_level(&out, "model", &v).ok_or(ProxyError::Internal)?);
    }
    let cap = match (step.max_tokens, model_limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if let (Some(cap), Some(asked)) = (cap, meta.max_tokens)
        && asked > cap
    {
        for key in api.dialect().max_tokens_keys() {
            if let Some(changed) = splice::replace_top_level(&out, key, &cap.to_string()) {
                out = Cow::Owned(changed);
            }
        }
    }
    if step.drop_thinking
        && let Some(changed) = splice::remove_top_level(&out, "thinking")
    {
        out = Cow::Owned(changed);
    }
    Ok(match out {
        Cow::Borrowed(_) => body.clone(),
        Cow::Owned(v) => Bytes::from(v),
    })
}

/// Bounded metric label values: names that appear in config pass, a name matching a configured
/// `*` pattern is labelled with the pattern, anything else is `other`. The sets are Fx-hashed
/// (a few instructions per lookup where SipHash took a hundred or more): they are built from
/// config, and a caller's name is only looked up in them, never inserted, so no crafted name
/// can crowd them.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    /// Shared: a request's record keeps its label without copying it.
    models: HashSet<Arc<str>>,
    patterns: Vec<Arc<str>>,
    tenants: HashSet<String>,
}

impl Labels {
    pub fn from_config(cfg: &Config) -> Self {
        let mut names: Vec<&str> = Vec::new();
        for m in &cfg.models {
            names.push(&m.name);
            names.extend(m.chain.iter().map(ChainStep::model));
        }
        names.extend(
            cfg.prices
                .keys()
                .filter_map(|k| k.split_once(':').map(|(_, m)| m)),
        );
        let mut models = HashSet::default();
        let mut patterns = Vec::new();
        for name in names.into_iter().filter(|n| *n != SAME_MODEL) {
            if names::is_pattern(name) {
                if !patterns.iter().any(|p: &Arc<str>| &**p == name) {
                    patterns.push(Arc::from(name));
                }
            } else {
                models.insert(Arc::from(name));
            }
        }
        let mut tenants: HashSet<String> = cfg.clients.iter().map(|c| c.tenant.clone()).collect();
        tenants.insert("default".to_string());
        Labels {
            models,
            patterns,
            tenants,
        }
    }

    pub fn model<'a>(&'a self, name: &'a str) -> &'a str {
        if self.models.contains(name) {
            return name;
        }
        let patterns = self.patterns.iter().map(|p| (&**p, ()));
        names::best(patterns, name).map_or("other", |(pattern, ())| pattern)
    }

    /// `model`'s label as the string it is kept in here (None for `other`).
    pub fn shared_model(&self, name: &str) -> Option<Arc<str>> {
        if let Some(m) = self.models.get(name) {
            return Some(m.clone());
        }
        let patterns = self.patterns.iter().map(|p| (&**p, p));
        names::best(patterns, name).map(|(_, pattern)| pattern.clone())
    }

    pub fn tenant<'a>(&self, name: &'a str) -> &'a str {
        if self.tenants.contains(name) {
            name
        } else {
            "other"
        }
    }
}

/// The tenant of every caller when no `[[clients]]` are configured.
pub const DEFAULT_TENANT: &str = "default";

/// A tenant name or label to keep: `default` (every request's, without `[[clients]]`) and the
/// `other` label are borrowed, so the many places a request keeps its tenant allocate nothing
/// for them; any other name is copied, as before.
pub fn tenant_name(name: &str) -> Cow<'static, str> {
    match name {
        DEFAULT_TENANT => Cow::Borrowed(DEFAULT_TENANT),
        "other" => Cow::Borrowed("other"),
        _ => Cow::Owned(name.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::{Labels, REMEMBERED_MODEL_MAX, default_step};

    #[test]
    fn the_default_route_shares_its_last_step_while_provider_and_model_stay_the_same() {
        let first = default_step("anthropic", "claude-x");
        let again = default_step("anthropic", "claude-x");
        assert_eq!(again, first);
        assert!(
            std::sync::Arc::ptr_eq(again.shared_target(), first.shared_target()),
            "the same step, shared"
        );
        // Another model, or the same model on another provider, is a step of its own.
        let other = default_step("anthropic", "claude-y");
        assert_eq!(other.target(), "anthropic:claude-y");
        let moved = default_step("openai", "claude-y");
        assert_eq!((moved.provider(), moved.model()), ("openai", "claude-y"));
        assert!(!std::sync::Arc::ptr_eq(
            moved.shared_target(),
            other.shared_target()
        ));
        // A name past the bound is made each time and never kept.
        let long = "m".repeat(REMEMBERED_MODEL_MAX + 1);
        let a = default_step("openai", &long);
        let b = default_step("openai", &long);
        assert_eq!(a, b);
        assert!(!std::sync::Arc::ptr_eq(
            a.shared_target(),
            b.shared_target()
        ));
        // What was kept before the long name is still the last step kept.
        let kept = default_step("openai", "claude-y");
        assert!(std::sync::Arc::ptr_eq(
            kept.shared_target(),
            moved.shared_target()
        ));
    }

    #[test]
    fn a_shared_model_label_is_the_label_itself_and_none_for_other() {
        let toml = r#"
[providers.anthropic]
kind = "anthropic"
base_url = "http://127.0.0.1:9"

[providers.openai]
kind = "openai"
base_url = "http://127.0.0.1:9"

[[models]]
name = "fast"
chain = ["anthropic:claude-haiku-4-5", "anthropic:claude-sonnet-*"]
"#;
        let cfg = crate::config::load_str(toml, &Default::default()).unwrap();
        let labels = Labels::from_config(&cfg);
        for name in ["fast", "claude-haiku-4-5", "claude-sonnet-4-5", "gpt-x"] {
            let shared = labels.shared_model(name);
            let want = labels.model(name);
            assert_eq!(shared.as_deref().unwrap_or("other"), want, "{name}");
        }
        assert_eq!(labels.shared_model("gpt-x"), None);
        assert_eq!(
            labels.shared_model("claude-sonnet-4-5").as_deref(),
            Some("claude-sonnet-*")
        );
    }
}
