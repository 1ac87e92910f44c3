//! `count_tokens` on a route whose step speaks the other API: answered locally, without an
//! upstream call, with an estimate of the request as that step would receive it (SPEC §3), in
//! the caller's shape and marked `x-legate-estimate: true`. Never a 400 for being translated.

use bytes::Bytes;
use http::{HeaderValue, Response, header};

use crate::config::{ApiKind, ChainStep};
use crate::proxy::Inbound;
use crate::proxy::response::{self, ProxyBody};
use crate::{tokens, translate};

/// The estimate for `step` (of kind `upstream`), or why this step cannot take the request.
pub async fn answer(
    inb: &Inbound,
    step: &ChainStep,
    upstream: ApiKind,
) -> Result<Response<ProxyBody>, String> {
    let dir = translate::Dir::between(inb.endpoint.api, upstream)
        .ok_or_else(|| format!("no translation from {} to {upstream}", inb.endpoint.api))?;
    let (sent, _) = translate::request(dir, &inb.body, &step.model).map_err(|e| e.0)?;
    // Counting is CPU work (and the first count loads the encoding): off the async workers,
    // so other requests are never held up by it.
    let model = step.model.clone();
    let counted =
        tokio::task::spawn_blocking(move || tokens::input_tokens(upstream, &model, &sent))
            .await
            .map_err(|_| "the token count was interrupted".to_owned())?;
    let tokens = counted.ok_or_else(|| "the translated request is not JSON".to_owned())?;
    let body = serde_json::json!({ "input_tokens": tokens });
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response::set_header(&mut resp, "x-legate-estimate", "true");
    response::set_header(&mut resp, "x-legate-served-by", &step.target());
    Ok(resp)
}
