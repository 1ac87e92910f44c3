//! Routing: which provider and model serve a request, and fitting the request body to that step
//! by splicing changed values into the original bytes (never re-serialising the rest: prompt
//! caching keys on the exact bytes, and unknown future fields must survive).

use std::borrow::Cow;
use std::collections::HashSet;

use bytes::Bytes;

use crate::api::RequestMeta;
use crate::config::{ApiKind, ChainStep, Config};
use crate::error::ProxyError;
use crate::splice;

/// The steps that may serve a request, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub steps: Vec<ChainStep>,
}

/// Resolves the model a caller sent on the `api` endpoint to its chain (a `[[models]]` entry)
/// or to the API's default provider with the model unchanged.
pub fn resolve(cfg: &Config, api: ApiKind, model: &str) -> Result<Resolved, ProxyError> {
    if let Some(entry) = cfg.models.iter().find(|m| m.name == model) {
        // Steps may speak either API: one of the other kind is served through translation.
        if entry.chain.is_empty() {
            return Err(ProxyError::Internal);
        }
        return Ok(Resolved {
            steps: entry.chain.clone(),
        });
    }
    let provider = match api {
        ApiKind::Anthropic => &cfg.routing.anthropic,
        ApiKind::OpenAi => &cfg.routing.openai,
    };
    Ok(Resolved {
        steps: vec![ChainStep {
            provider: provider.clone(),
            model: model.to_string(),
            max_tokens: None,
            drop_thinking: false,
        }],
    })
}

/// Fits the original body to `step`: the model name spliced in when it differs, `max_tokens`
/// capped, `thinking` removed when the step says so. Returns the original bytes untouched when
/// nothing needs to change.
pub fn fit(
    body: &Bytes,
    meta: &RequestMeta,
    step: &ChainStep,
    api: ApiKind,
) -> Result<Bytes, ProxyError> {
    let mut out: Cow<'_, [u8]> = Cow::Borrowed(body.as_ref());
    if step.model != meta.model {
        let v = splice::json_string(&step.model);
        out = Cow::Owned(splice::replace_top_level(&out, "model", &v).ok_or(ProxyError::Internal)?);
    }
    if let (Some(cap), Some(asked)) = (step.max_tokens, meta.max_tokens) {
        if asked > cap {
            for key in api.dialect().max_tokens_keys() {
                if let Some(changed) = splice::replace_top_level(&out, key, &cap.to_string()) {
                    out = Cow::Owned(changed);
                }
            }
        }
    }
    if step.drop_thinking {
        if let Some(changed) = splice::remove_top_level(&out, "thinking") {
            out = Cow::Owned(changed);
        }
    }
    Ok(match out {
        Cow::Borrowed(_) => body.clone(),
        Cow::Owned(v) => Bytes::from(v),
    })
}

/// Bounded metric label values: names that appear in config pass, anything else is `other`.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    models: HashSet<String>,
    tenants: HashSet<String>,
}

impl Labels {
    pub fn from_config(cfg: &Config) -> Self {
        let mut models = HashSet::new();
        for m in &cfg.models {
            models.insert(m.name.clone());
            for s in &m.chain {
                models.insert(s.model.clone());
            }
        }
        for key in cfg.prices.keys() {
            if let Some((_, model)) = key.split_once(':') {
                models.insert(model.to_string());
            }
        }
        let mut tenants: HashSet<String> = cfg.clients.iter().map(|c| c.tenant.clone()).collect();
        tenants.insert("default".to_string());
        Labels { models, tenants }
    }

    pub fn model<'a>(&self, name: &'a str) -> &'a str {
        if self.models.contains(name) {
            name
        } else {
            "other"
        }
    }

    pub fn tenant<'a>(&self, name: &'a str) -> &'a str {
        if self.tenants.contains(name) {
            name
        } else {
            "other"
        }
    }
}
