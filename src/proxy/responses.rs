//! The Responses API on the request path (SPEC §11): which steps are passed through and which
//! translated, the conversation of a request (its `previous_response_id` looked up once), the
//! stream translators that also keep each finished response in the store, and the small
//! endpoints around `POST /v1/responses` (stored responses, `input_tokens`, the WebSocket 426).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use serde_json::{Value, json};

use crate::api::ApiShape;
use crate::config::{ApiKind, Config};
use crate::error::ProxyError;
use crate::proxy::inbound::Endpoint;
use crate::proxy::response::ProxyBody;
use crate::proxy::upbody::EventTranslator;
use crate::proxy::{Inbound, Snapshot};
use crate::responses::{self, ConversationStore, ResponseCtx, ResponsesStream, Stored, Target};
use crate::sse::SseParser;
use crate::translate::{self, Dir};
use crate::upstream::Upstream;

/// How one step is reached from the caller's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xlate {
    /// The step speaks the caller's API: bytes pass through.
    None,
    /// Anthropic Messages ↔ Chat Completions (SPEC §10).
    Classic(Dir),
    /// A Responses caller served by a step without the Responses API.
    Responses(Target),
}

impl Xlate {
    pub fn for_step(caller: ApiShape, up: &Upstream) -> Xlate {
        match (caller, up.kind) {
            // Cloud platforms are reached through their chat endpoints.
            (ApiShape::Responses, ApiKind::OpenAi) if up.responses && up.cloud.is_none() => {
                Xlate::None
            }
            (ApiShape::Responses, ApiKind::OpenAi) => Xlate::Responses(Target::Chat),
            (ApiShape::Responses, ApiKind::Anthropic) => Xlate::Responses(Target::Anthropic),
            (ApiShape::Anthropic, ApiKind::OpenAi) => Xlate::Classic(Dir::AnthropicToOpenAi),
            (ApiShape::OpenAi, ApiKind::Anthropic) => Xlate::Classic(Dir::OpenAiToAnthropic),
            _ => Xlate::None,
        }
    }

    pub fn translating(self) -> bool {
        self != Xlate::None
    }

    /// The upstream path of a generation call.
    pub fn path(self, endpoint: Endpoint, up: ApiKind) -> &'static str {
        match (self, up) {
            (Xlate::None, _) => endpoint.upstream_path(),
            (_, ApiKind::Anthropic) => Endpoint::Messages.upstream_path(),
            (_, ApiKind::OpenAi) => Endpoint::ChatCompletions.upstream_path(),
        }
    }
}

/// A Responses request's conversation: the id a translated answer gets, what came before
/// (from the store), and whether this turn is kept.
pub struct Conversation {
    pub id: String,
    pub created_at: u64,
    /// The caller's `previous_response_id`, and what the store holds for it.
    pub prior_id: Option<String>,
    pub prior: Option<Stored>,
    /// The whole input of this turn: the earlier turns' items, then this request's.
    pub input: Vec<Value>,
    /// `store: false` turns are kept only as long as their own stream.
    pub keep: bool,
    pub store: Arc<ConversationStore>,
}

impl Conversation {
    /// Looks `previous_response_id` up once. A store that cannot be reached is an error (a
    /// silent miss would answer without the conversation).
    pub async fn load(
        store: Arc<ConversationStore>,
        body: &[u8],
        request_id: &str,
    ) -> Result<Self, ProxyError> {
        let prior_id = responses::previous_response_id(body);
        let prior = match &prior_id {
            Some(id) => store.get(id).await.map_err(|e| {
                tracing::warn!(error = %e.0, "the conversation store failed");
                ProxyError::InvalidRequest {
                    message: "the conversation store is unavailable; retry, or resend the \
                              whole conversation without previous_response_id"
                        .to_owned(),
                }
            })?,
            None => None,
        };
        let mut input = prior.as_ref().map_or_else(Vec::new, |p| {
            let mut items = p.input.clone();
            items.extend(p.output().iter().cloned());
            items
        });
        input.extend(responses::input_items(body));
        let keep = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("store").and_then(Value::as_bool))
            .unwrap_or(true);
        Ok(Conversation {
            id: format!("resp_{}", request_id.trim_start_matches("lgt_")),
            created_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            prior_id,
            prior,
            input,
            keep,
            store,
        })
    }

    fn ctx(&self, body: &[u8]) -> ResponseCtx {
        ResponseCtx::new(self.id.clone(), self.created_at, body)
    }

    /// Keeps a finished response (in the background: the caller does not wait for the store).
    pub fn save(&self, response: Value, passthrough: bool) {
        if !self.keep {
            return;
        }
        let Some(id) = response["id"].as_str().map(str::to_owned) else {
            return;
        };
        let stored = Stored {
            input: self.input.clone(),
            response,
            passthrough,
        };
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.put(&id, &stored).await {
                tracing::warn!(error = %e.0, "a response could not be kept in the conversation store");
            }
        });
    }

    /// The body for a translated step: rebuilt from the store when it names an earlier
    /// response, then translated. An id legate never saw cannot be served here.
    pub fn request_for(
        &self,
        target: Target,
        body: &[u8],
        model: &str,
    ) -> Result<(Vec<u8>, Vec<&'static str>), String> {
        let rebuilt;
        let body = match (&self.prior_id, &self.prior) {
            (Some(id), None) => {
                return Err(format!(
                    "previous_response_id `{id}` is unknown (legate never relayed it, or it \
                     expired); resend the whole conversation as input"
                ));
            }
            (Some(_), Some(prior)) => {
                rebuilt = responses::rebuild(body, prior).map_err(|e| e.0)?;
                rebuilt.as_slice()
            }
            _ => body,
        };
        responses::request_for(target, body, model).map_err(|e| e.0)
    }
}

/// The stream translator of a translated step: keeps the finished response in the store.
struct Keeping {
    inner: ResponsesStream,
    conv: Arc<Conversation>,
    saved: bool,
}

impl Keeping {
    fn after(&mut self, out: Vec<u8>) -> Vec<u8> {
        if !self.saved
            && let Some(done) = self.inner.final_response()
        {
            self.saved = true;
            self.conv.save(done.clone(), false);
        }
        out
    }
}

impl EventTranslator for Keeping {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let out = self.inner.push(chunk);
        self.after(out)
    }
    fn finish(&mut self) -> Vec<u8> {
        let out = self.inner.finish();
        self.after(out)
    }
}

/// A passthrough Responses stream: bytes unchanged, the terminal response kept in the store.
struct Capturing {
    parser: SseParser,
    conv: Arc<Conversation>,
}

impl Capturing {
    fn scan(&mut self) {
        while let Some(ev) = self.parser.next_event() {
            let terminal = matches!(
                ev.event.as_deref(),
                Some("response.completed" | "response.incomplete")
            );
            if terminal && let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                self.conv.save(v["response"].clone(), true);
            }
        }
    }
}

impl EventTranslator for Capturing {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.parser.push(chunk);
        self.scan();
        chunk.to_vec()
    }
    fn finish(&mut self) -> Vec<u8> {
        self.parser.finish();
        self.scan();
        Vec::new()
    }
}

/// The stream translator for a step, if its stream is not passed through untouched.
pub fn stream_translator(
    xl: Xlate,
    inb: &Inbound,
    include_usage: bool,
) -> Option<Box<dyn EventTranslator>> {
    match (xl, &inb.conversation) {
        (Xlate::Classic(dir), _) => Some(Box::new(translate::StreamTranslator::new(
            dir,
            include_usage,
        ))),
        (Xlate::Responses(target), Some(conv)) => Some(Box::new(Keeping {
            inner: responses::stream_for(target, conv.ctx(&inb.body)),
            conv: conv.clone(),
            saved: false,
        })),
        (Xlate::None, Some(conv)) if conv.keep => Some(Box::new(Capturing {
            parser: SseParser::new(),
            conv: conv.clone(),
        })),
        _ => None,
    }
}

/// A whole translated answer in the caller's API (and kept, for a Responses caller).
pub fn translate_whole(xl: Xlate, inb: &Inbound, body: &[u8]) -> Result<Bytes, String> {
    match (xl, &inb.conversation) {
        (Xlate::Classic(dir), _) => translate::response(dir, body)
            .map(Bytes::from)
            .map_err(|e| e.0),
        (Xlate::Responses(target), Some(conv)) => {
            let obj =
                responses::response_for(target, body, &conv.ctx(&inb.body)).map_err(|e| e.0)?;
            conv.save(obj.clone(), false);
            Ok(Bytes::from(obj.to_string()))
        }
        (Xlate::None, Some(conv)) => {
            if let Ok(obj) = serde_json::from_slice::<Value>(body) {
                conv.save(obj, true);
            }
            Ok(Bytes::copy_from_slice(body))
        }
        _ => Ok(Bytes::copy_from_slice(body)),
    }
}

/// An upstream error of a translated step, in the caller's envelope.
pub fn translate_error(xl: Xlate, status: u16, body: &[u8]) -> (u16, Vec<u8>) {
    match xl {
        Xlate::Classic(dir) => translate::error(dir, status, body),
        Xlate::Responses(target) => responses::error_for(target, status, body),
        Xlate::None => (status, body.to_vec()),
    }
}

/// An `error` / `response.failed` event before the commit point, as the status it stands
/// for and an OpenAI error body.
pub fn error_event_response(data: &str) -> (StatusCode, Bytes) {
    let (code, message) = crate::api::responses::error_of(data);
    let status = match code.as_str() {
        "rate_limit_exceeded" => 429,
        "invalid_request_error" | "invalid_prompt" | "context_length_exceeded" => 400,
        "insufficient_quota" => 429,
        "vector_store_timeout" | "timeout" => 504,
        _ => 500,
    };
    let kind = if status == 400 {
        "invalid_request_error"
    } else {
        "server_error"
    };
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Bytes::from(body.to_string()),
    )
}

/// `GET /v1/responses` asking for a WebSocket: 426 at once, so a client that tries WebSocket
/// first (Codex) falls back to HTTP without retrying.
pub fn is_websocket_upgrade(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    method == Method::GET
        && path.trim_end_matches('/').ends_with("/responses")
        && headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

pub fn upgrade_required() -> Response<ProxyBody> {
    let body = json!({"error": {
        "message": "legate serves the Responses API over HTTP only; send POST /v1/responses",
        "type": "invalid_request_error", "param": null, "code": "websocket_not_supported",
    }});
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    *resp.status_mut() = StatusCode::UPGRADE_REQUIRED;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The provider that answers for stored responses legate did not translate: the default
/// provider of the OpenAI APIs, when it serves the Responses API.
fn responses_provider<'a>(snap: &'a Snapshot, cfg: &Config) -> Option<&'a Arc<Upstream>> {
    snap.upstreams
        .get(&cfg.routing.openai)
        .filter(|u| u.kind == ApiKind::OpenAi && u.responses)
}

fn local_json(status: StatusCode, body: &Value) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// `GET`/`DELETE /v1/responses/{id}`, `POST …/cancel`, `GET …/input_items`: answered from the
/// store for responses legate translated, else forwarded to the Responses provider.
pub async fn stored_response(
    snap: &Snapshot,
    store: &ConversationStore,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response<ProxyBody>, ProxyError> {
    let rest = path
        .trim_end_matches('/')
        .rsplit_once("/responses/")
        .map_or("", |(_, r)| r);
    let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
    let kept = store.get(id).await.ok().flatten();
    if let Some(kept) = kept.filter(|k| !k.passthrough) {
        return Ok(match (method, action) {
            (&Method::GET, "") => local_json(StatusCode::OK, &kept.response),
            (&Method::DELETE, "") => {
                let _ = store.delete(id).await;
                local_json(
                    StatusCode::OK,
                    &json!({"id": id, "object": "response.deleted", "deleted": true}),
                )
            }
            (_, "input_items") => local_json(
                StatusCode::OK,
                &json!({"object": "list", "data": kept.input,
                        "first_id": null, "last_id": null, "has_more": false}),
            ),
            _ => {
                return Err(ProxyError::InvalidRequest {
                    message: "only background responses can be cancelled; this one has finished"
                        .to_owned(),
                });
            }
        });
    }
    if method == Method::DELETE {
        let _ = store.delete(id).await;
    }
    let Some(up) = responses_provider(snap, &snap.cfg) else {
        return Err(ProxyError::NotFound {
            method: method.to_string(),
            path: path.to_owned(),
        });
    };
    let upstream_path = format!("/v1/responses/{rest}");
    forward(
        up,
        method.clone(),
        &upstream_path,
        query,
        headers,
        Bytes::new(),
    )
    .await
}

/// One plain upstream call for the small endpoints: credential injected, answer passed back.
pub async fn forward(
    up: &Upstream,
    method: Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<ProxyBody>, ProxyError> {
    let target = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let req = up.build_request(method, &target, headers, body, false, true)?;
    let call = up.client().request(req);
    let resp = match tokio::time::timeout(up.first_byte_timeout, call).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => {
            return Err(ProxyError::UpstreamUnreachable {
                provider: up.name.clone(),
            });
        }
        Err(_) => {
            return Err(ProxyError::UpstreamTimeout {
                provider: up.name.clone(),
            });
        }
    };
    let (parts, incoming) = resp.into_parts();
    let limited = Limited::new(incoming, 32 << 20).collect();
    let body = match tokio::time::timeout(up.idle_timeout, limited).await {
        Ok(Ok(c)) => c.to_bytes(),
        _ => {
            return Err(ProxyError::UpstreamStreamBroken {
                provider: up.name.clone(),
            });
        }
    };
    let mut out = Response::new(ProxyBody::full(body));
    *out.status_mut() = parts.status;
    crate::proxy::response::copy_upstream_headers(&parts.headers, out.headers_mut(), true);
    crate::proxy::response::set_header(&mut out, "x-legate-served-by", &up.name);
    Ok(out)
}

/// `POST /v1/responses/input_tokens`: forwarded when the route's first step serves the
/// Responses API, else estimated locally as the request would be sent to that step.
pub async fn input_tokens(
    snap: &Snapshot,
    inb: &Inbound,
) -> Result<Response<ProxyBody>, ProxyError> {
    let resolved = crate::route::resolve(&snap.cfg, ApiKind::OpenAi, &inb.meta.model)?;
    let step = resolved.steps.first().ok_or(ProxyError::Internal)?;
    let up = snap
        .upstreams
        .get(&step.provider)
        .ok_or(ProxyError::Internal)?;
    if Xlate::for_step(ApiShape::Responses, up) == Xlate::None {
        let body = crate::route::fit(&inb.body, &inb.meta, step, ApiKind::OpenAi, None)?;
        return forward(
            up,
            Method::POST,
            "/v1/responses/input_tokens",
            None,
            &inb.headers,
            body,
        )
        .await;
    }
    let target = match up.kind {
        ApiKind::Anthropic => Target::Anthropic,
        ApiKind::OpenAi => Target::Chat,
    };
    let sent = responses::request_for(target, &inb.body, &step.model)
        .map(|(b, _)| b.len())
        .unwrap_or(inb.body.len());
    let tokens = (sent as u64).div_ceil(4);
    let mut resp = local_json(
        StatusCode::OK,
        &json!({"object": "response.input_tokens", "input_tokens": tokens}),
    );
    crate::proxy::response::set_header(&mut resp, "x-legate-estimate", "true");
    Ok(resp)
}
