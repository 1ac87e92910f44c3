//! `GET /v1/models`: the configured model names and aliases, answered locally (no upstream
//! call). Each entry carries the fields of both SDKs' model objects so either can list them.

use bytes::Bytes;
use http::{HeaderValue, Response, header};

use crate::config::Config;
use crate::proxy::ProxyBody;

pub fn list(cfg: &Config) -> Response<ProxyBody> {
    let mut names: Vec<&str> = Vec::new();
    for m in &cfg.models {
        names.push(&m.name);
        for s in &m.chain {
            names.push(&s.model);
        }
    }
    for key in cfg.prices.keys() {
        if let Some((_, model)) = key.split_once(':') {
            names.push(model);
        }
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(*n));
    let data: Vec<serde_json::Value> = names
        .iter()
        .map(|n| {
            serde_json::json!({
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
    let body = serde_json::json!({
        "object": "list",
        "data": data,
        "has_more": false,
        "first_id": names.first(),
        "last_id": names.last(),
    });
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
