//! `GET /v1/models` and `GET /v1/models/{id}`: the configured model names and aliases,
//! answered locally (no upstream call). The list carries the fields of both SDKs' model
//! objects so either can read it; one model is answered in the caller's own shape.

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use serde_json::{Value, json};

use crate::api::ApiKind;
use crate::config::Config;
use crate::error::ProxyError;
use crate::names;
use crate::proxy::ProxyBody;

/// Every configured name, first seen first. A pattern is listed by its prefix when that reads
/// as a model name (`claude-haiku-4-5*` → `claude-haiku-4-5`, not `claude-*` → `claude-`).
fn names(cfg: &Config) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for m in &cfg.models {
        names.push(&m.name);
        for s in &m.chain {
            names.push(s.model());
        }
    }
    for key in cfg.prices.keys() {
        if let Some((_, model)) = key.split_once(':') {
            names.push(model);
        }
    }
    let mut seen = std::collections::HashSet::new();
    names
        .into_iter()
        .filter_map(|n| match n.strip_suffix('*') {
            None => Some(n),
            Some(prefix) => (!prefix.is_empty()
                && !prefix.ends_with(['-', '.', '_', '/', ':', '*']))
            .then_some(prefix),
        })
        .filter(|n| *n != crate::route::SAME_MODEL && seen.insert(*n))
        .collect()
}

pub fn list(cfg: &Config) -> Response<ProxyBody> {
    let names = names(cfg);
    let data: Vec<Value> = names
        .iter()
        .map(|n| {
            json!({
                "type": "model",
                "id": n,
                "display_name": n,
                "created_at": "1970-01-01T00:00:00Z",
                "object": "model",
                "created": 0,
                "owned_by": "legate",
            })
        })
        .collect();
    let body = json!({
        "object": "list",
        "data": data,
        "has_more": false,
        "first_id": names.first(),
        "last_id": names.last(),
    });
    json_response(&body)
}

/// One model: a configured name, or a name a `[[models]]` pattern routes.
pub fn retrieve(cfg: &Config, id: &str, api: ApiKind) -> Result<Response<ProxyBody>, ProxyError> {
    let known = names(cfg).contains(&id)
        || cfg
            .models
            .iter()
            .any(|m| names::specificity(&m.name, id).is_some());
    if !known {
        return Err(ProxyError::ModelNotFound {
            model: id.to_owned(),
        });
    }
    let body = match api {
        ApiKind::Anthropic => json!({
            "type": "model",
            "id": id,
            "display_name": id,
            "created_at": "1970-01-01T00:00:00Z",
        }),
        ApiKind::OpenAi | ApiKind::Responses => json!({
            "id": id,
            "object": "model",
            "created": 0,
            "owned_by": "legate",
        }),
    };
    Ok(json_response(&body))
}

fn json_response(body: &Value) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
