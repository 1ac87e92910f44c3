//! The Responses API's own endpoints around `POST /v1/responses` (SPEC §11): stored
//! responses (answered from the conversation store, or forwarded to the provider that keeps
//! them), `input_tokens`, the WebSocket 426, and the choice of the conversation store. The
//! conversation of a generation call is `proxy::conversation`'s.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header};
use serde_json::{Value, json};

use crate::api::ApiKind;
use crate::config::{Config, StoreKind};
use crate::error::ProxyError;
use crate::observe::RequestObs;
use crate::proxy::buffers::{self, AnswerShare, BufferBudget};
use crate::proxy::response::ProxyBody;
use crate::proxy::upbody::{Raw, UpstreamBody};
use crate::proxy::upread::{self, Whole};
use crate::proxy::{Inbound, Snapshot};
use crate::responses::{self, ConversationStore};
use crate::translate::Xlate;
use crate::upstream::Upstream;

/// The conversation store of `[responses]`: Redis when configured (at `ratelimit.redis_url`),
/// else memory; a Redis URL that cannot be used falls back to memory, said in the log.
pub(crate) fn conversation_store(cfg: &Config) -> ConversationStore {
    use crate::responses::store::{MemoryStore, RedisConversations};
    let rs = &cfg.responses;
    if let (StoreKind::Redis, Some(url)) = (&rs.store, &cfg.ratelimit.redis_url) {
        match RedisConversations::new(url, rs.ttl, rs.max_bytes) {
            Ok(r) => return ConversationStore::in_redis(r),
            Err(e) => {
                tracing::error!(error = %e.0, "the Redis conversation store cannot be used; keeping conversations in memory");
            }
        }
    }
    ConversationStore::in_memory(MemoryStore::new(rs.max_bytes, rs.ttl))
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

/// Refuses a WebSocket upgrade before the key or the body is read, so that a WebSocket-first
/// client falls back at once; the caller stamps, counts (api="responses", status 426) and
/// logs it, so the fallback can be seen.
pub(crate) fn refuse_websocket(obs: &RequestObs) -> Response<ProxyBody> {
    obs.update(|f| f.error_type = Some("websocket_not_supported"));
    upgrade_required()
}

fn upgrade_required() -> Response<ProxyBody> {
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
        .filter(|u| u.speaks(ApiKind::Responses) == ApiKind::Responses)
}

fn local_json(status: StatusCode, body: &Value) -> Response<ProxyBody> {
    json_response(status, Bytes::from(body.to_string()))
}

fn json_response(status: StatusCode, body: Bytes) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// A stored response (or its input items) as the caller's answer, counted with the upstream
/// answers held whole (`answers`, bound `max`) until its last byte is written: a caller that
/// asks for a large one again and again without reading holds one copy per request, so past
/// the bound it is refused (529, as a translated answer is) rather than copied once more.
fn held_json(
    body: &Value,
    answers: &Arc<BufferBudget>,
    (max, part): (usize, &Option<Arc<crate::proxy::buffers::TenantPart>>),
) -> Result<Response<ProxyBody>, ProxyError> {
    let bytes = Bytes::from(body.to_string());
    let mut share = AnswerShare::new(answers, max).within(part.clone());
    if !share.grow(bytes.len()) {
        tracing::warn!(
            bytes = bytes.len(),
            "stored response refused: server.max_buffered_bytes is reached by answers not yet taken"
        );
        return Err(ProxyError::BuffersFull {
            retry_after: std::time::Duration::from_secs(1),
        });
    }
    Ok(json_response(
        StatusCode::OK,
        buffers::hold(bytes, share.into_share()),
    ))
}

/// `GET`/`DELETE /v1/responses/{id}`, `POST …/cancel`, `GET …/input_items`: answered from the
/// store for responses legate translated, else forwarded to the Responses provider. What is
/// answered whole is counted in `answers` (bound `max`, `server.max_buffered_bytes`).
pub async fn stored_response(
    snap: &Snapshot,
    (store, unsettled): (&ConversationStore, &super::background::Unsettled),
    answers: &Arc<BufferBudget>,
    req: &http::Request<crate::server::CallerBody>,
    (tenant, obs): (&str, &RequestObs),
) -> Result<Response<ProxyBody>, ProxyError> {
    let (method, path, query, headers) = (
        req.method(),
        req.uri().path(),
        req.uri().query(),
        req.headers(),
    );
    let rest = path
        .trim_end_matches('/')
        .rsplit_once("/responses/")
        .map_or("", |(_, r)| r);
    let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
    // A store that cannot be reached is said so: forwarding would ask the provider about a
    // response it may never have seen (one legate translated), and answer for it wrongly.
    let unavailable = |e: crate::responses::store::StoreError| {
        tracing::warn!(error = %e.0, "the conversation store failed");
        ProxyError::StoreUnavailable {
            retry_after: crate::redis_conn::PAUSE,
        }
    };
    let kept = store.get(id).await.map_err(unavailable)?;
    // Another tenant's response is neither shown nor deleted, nor asked of its provider with
    // the provider key both tenants' requests carry.
    let open = snap.cfg.clients.is_empty();
    if kept.as_ref().is_some_and(|k| !k.belongs_to(tenant, open)) {
        return Err(ProxyError::ResponseNotFound { id: id.to_owned() });
    }
    // One no longer kept (evicted, expired, from before a restart) may be another tenant's,
    // unless this process knows it is the caller's (`responses/owners.rs`).
    if kept.is_none() && snap.several_tenants() && !store.owners.is(id, tenant) {
        return Err(ProxyError::ResponseNotFound { id: id.to_owned() });
    }
    let max = snap.cfg.server.limits.max_buffered_bytes;
    let bound = (max, &snap.answer_part(tenant));
    let held = kept.is_some();
    let deleting = method == Method::DELETE && action.is_empty();
    // A relayed response is asked of the provider that made it, where it is kept (with
    // several OpenAI providers in a chain, a turn may have been served by any of them);
    // one legate does not hold, of the default provider of the OpenAI APIs.
    let maker = kept
        .as_ref()
        .filter(|k| k.passthrough)
        .and_then(|k| snap.upstreams.get(&k.provider))
        .filter(|u| u.speaks(ApiKind::Responses) == ApiKind::Responses)
        .cloned();
    if let Some(kept) = kept.filter(|k| !k.passthrough) {
        return Ok(match (method, action) {
            // Its events were never kept: answering the response whole to a request for its
            // stream would end the SDK's stream with no event and no error.
            (&Method::GET, "") if asks_stream(query) => {
                return Err(ProxyError::InvalidRequest {
                    message: format!(
                        "response `{id}` was made by legate from another API's answer, and its \
                         stream is not kept: retrieve it without stream=true"
                    ),
                });
            }
            (&Method::GET, "") => held_json(&kept.response, answers, bound)?,
            (&Method::DELETE, "") => {
                store.delete(id).await.map_err(unavailable)?;
                local_json(
                    StatusCode::OK,
                    &json!({"id": id, "object": "response.deleted", "deleted": true}),
                )
            }
            (_, "input_items") => held_json(
                &super::input_items::page(id, &kept.input, query)?,
                answers,
                bound,
            )?,
            _ => {
                return Err(ProxyError::InvalidRequest {
                    message: "only background responses can be cancelled; this one has finished"
                        .to_owned(),
                });
            }
        });
    }
    // No provider to ask (a reload took it away): legate holds no such response, which is
    // what the caller is told (not that the endpoint is unknown: it serves the responses it
    // translated); a relayed one's copy, all legate has of it, can still be deleted.
    let Some(up) = maker.or_else(|| responses_provider(snap, &snap.cfg).cloned()) else {
        if deleting && held {
            store.delete(id).await.map_err(unavailable)?;
            return Ok(local_json(
                StatusCode::OK,
                &json!({"id": id, "object": "response.deleted", "deleted": true}),
            ));
        }
        return Err(ProxyError::ResponseNotFound { id: id.to_owned() });
    };
    let upstream_path = format!("/v1/responses/{rest}");
    // A background response's final state, polled or cancelled, carries the usage its request
    // was answered without: metered once, to that request (`background.rs`), and shown in this
    // request's record, so that the access log and journal add up to what was metered.
    let polled = matches!(
        (method, action),
        (&Method::GET, "") | (&Method::POST, "cancel")
    );
    let settle = |status: StatusCode, events: bool, body: &Bytes| {
        if polled
            && status == StatusCode::OK
            && let Some((usage, cost)) = unsettled.settle(id, body, events)
        {
            obs.update(|f| {
                f.usage = Some(usage);
                f.cost_pico = Some(cost);
            });
        }
    };
    let answer = forward(
        &up,
        &up.name,
        (answers, max),
        (method.clone(), &upstream_path, query),
        headers,
        Bytes::new(),
        settle,
    )
    .await;
    // legate's copy goes once the provider's has: a DELETE the provider failed leaves the
    // response there, and a later turn continuing it on another step is still rebuilt from
    // the copy (and, with several tenants, still known as the caller's).
    // A response still streaming is kept when its stream ends: its id is remembered so that
    // it is not.
    let gone = |r: &Response<ProxyBody>| r.status().is_success() || r.status() == 404;
    if deleting && answer.as_ref().is_ok_and(gone) {
        store.deleted.bury(id);
        if let Err(e) = store.delete(id).await {
            tracing::warn!(error = %e.0, "a deleted response's copy was not deleted from the store");
        }
    }
    answer
}

/// One plain upstream call for the small endpoints: credential injected, answer passed back,
/// held whole as the chain's answers are (counted in `answers` with bound `max`, at most
/// 16 MiB), and shown to `seen` as the caller gets it (its status, whether it is an event
/// stream, its body). `served_by` is what `x-legate-served-by` names: the step's
/// `provider:model`, or the provider alone where no model is asked for (a stored response's
/// id).
#[allow(clippy::too_many_arguments)]
pub async fn forward(
    up: &Upstream,
    served_by: &str,
    (answers, max): (&Arc<BufferBudget>, usize),
    (method, path, query): (Method, &str, Option<&str>),
    headers: &HeaderMap,
    body: Bytes,
    seen: impl FnOnce(StatusCode, bool, &Bytes),
) -> Result<Response<ProxyBody>, ProxyError> {
    let target = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    // A platform's credential is waited for no longer than the answer would be.
    let wait = tokio::time::Instant::now() + up.first_byte_timeout;
    let mut renewed = false;
    let resp = loop {
        let req =
            up.build_plain_request(method.clone(), &target, headers, body.clone(), wait.into());
        let req = Box::pin(req).await?;
        let on = crate::upstream::Sent::default();
        let sent = tokio::time::Instant::now();
        let call = up.client().request_on(req, None, sent, &on);
        let resp = match tokio::time::timeout(up.first_byte_timeout, call).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return Err(ProxyError::UpstreamUnreachable {
                    provider: up.name.clone(),
                    failed: e.failed(),
                });
            }
            Err(_) => {
                // Later requests go on another connection (`upstream::Sent`).
                on.retire();
                return Err(ProxyError::UpstreamTimeout {
                    provider: up.name.clone(),
                });
            }
        };
        // A platform that refuses the credential it was sent may have revoked it before its
        // expiry: fetched again and the call made once more, as a generation call's is
        // (`exchange::error`), so that polling a stored response does not fail until some
        // generation call happens to renew it.
        let refused = matches!(resp.status().as_u16(), 401 | 403)
            && !renewed
            && up
                .cloud
                .as_ref()
                .is_some_and(|c| c.credential_refused(sent));
        if !refused {
            break resp;
        }
        renewed = true;
    };
    let (parts, incoming) = resp.into_parts();
    if crate::proxy::response::opaque_coding(&parts.headers) {
        return Err(crate::proxy::response::opaque_answer(&up.name));
    }
    // legate follows no redirection, and one passed on would be followed by the SDK, past
    // legate and its credential.
    if parts.status.is_redirection() {
        tracing::warn!(provider = %up.name, status = %parts.status, "upstream answered with a redirection");
        return Err(ProxyError::UpstreamAnswerUnusable {
            provider: up.name.clone(),
            reason: format!(
                "it answered {}, a redirection legate does not follow",
                parts.status
            ),
        });
    }
    let mut incoming = UpstreamBody::Plain(Raw::Http(incoming));
    let mut share = AnswerShare::new(answers, max);
    let deadline = tokio::time::Instant::now() + up.idle_timeout;
    let body = match upread::read_whole(&mut incoming, up.idle_timeout, deadline, &mut share).await
    {
        // A success answer of the Responses API is JSON: a gateway's page passed on with 200
        // would reach the caller as a success its SDK cannot parse. A stored response's
        // events asked for again (`GET …?stream=true`) are an event stream, passed on whole
        // once the provider has replayed them.
        Whole::Complete(b) if asks_stream(query) && is_event_stream(&parts.headers) => b,
        // A deletion answered without content is a deletion.
        Whole::Complete(b) if parts.status == http::StatusCode::NO_CONTENT && b.is_empty() => b,
        Whole::Complete(b) if !crate::proxy::answer::json_shaped(parts.status, &b) => {
            if parts.status.is_success() {
                let kind = crate::proxy::answer::media_type(&parts.headers);
                tracing::warn!(provider = %up.name, content_type = kind, "upstream success answer is not JSON");
                return Err(ProxyError::UpstreamAnswerUnusable {
                    provider: up.name.clone(),
                    reason: format!("the success answer is not JSON (content-type {kind})"),
                });
            }
            b
        }
        Whole::Complete(b) => b,
        Whole::Full(_) => {
            return Err(ProxyError::BuffersFull {
                retry_after: std::time::Duration::from_secs(1),
            });
        }
        Whole::TooLarge(_) => {
            return Err(ProxyError::UpstreamAnswerUnusable {
                provider: up.name.clone(),
                reason: "it is larger than the 16 MiB legate holds whole".to_owned(),
            });
        }
        // Not a sign the connection stalled: the whole read is bounded by `idle_timeout`, and
        // a large answer still flowing runs past it too.
        Whole::Broken(_) | Whole::Unusable(_) => {
            return Err(ProxyError::UpstreamStreamBroken {
                provider: up.name.clone(),
            });
        }
    };
    // An upstream that echoes the key it was sent must not hand it to the caller.
    let redact = up.redactor();
    let body = match &redact {
        Some(r) => r.bytes(body),
        None => body,
    };
    // Read as what it is: a replay asked for may still come back as the response's JSON.
    seen(parts.status, is_event_stream(&parts.headers), &body);
    let body = buffers::hold(body, share.into_share());
    let mut out = Response::new(ProxyBody::full(body));
    *out.status_mut() = parts.status;
    crate::proxy::response::copy_upstream_headers(&parts.headers, out.headers_mut(), true);
    if let Some(r) = redact {
        r.headers(out.headers_mut());
    }
    crate::proxy::response::set_served_by(&mut out, served_by);
    Ok(out)
}

/// Whether a query asks for a stored response's events (`stream=true`).
fn asks_stream(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "stream=true"))
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    crate::proxy::answer::media_type(headers).eq_ignore_ascii_case("text/event-stream")
}

/// `POST /v1/responses/input_tokens`: forwarded when the route's first step serves the
/// Responses API, else estimated locally as the request would be sent to that step.
pub async fn input_tokens(
    snap: &Snapshot,
    (answers, estimates): (&Arc<BufferBudget>, &Arc<tokio::sync::Semaphore>),
    inb: &Inbound,
) -> Result<Response<ProxyBody>, ProxyError> {
    let resolved = crate::route::resolve(&snap.cfg, ApiKind::Responses, &inb.meta.model)?;
    let step = resolved.steps().first().ok_or(ProxyError::Internal)?;
    let up = snap
        .upstreams
        .get(step.provider())
        .ok_or(ProxyError::Internal)?;
    let target = match Xlate::between(ApiKind::Responses, up.speaks(ApiKind::Responses)) {
        Xlate::Responses(target) => target,
        Xlate::None | Xlate::Classic(_) => {
            // Continuing a response legate made (a translated step's), the provider never
            // saw its id: it counts the conversation, as `POST /v1/responses` sends it.
            let body = super::conversation::relay_body(inb, step, ApiKind::Responses, None)
                .await?
                .map_err(|message| ProxyError::InvalidRequest { message })?;
            // Azure's v1 surface serves no count endpoint: the body as it would be sent is
            // estimated, as a translated step's is, with the earlier turns the provider holds
            // under `previous_response_id` (those the store keeps a copy of) counted too.
            if up.cloud.is_some() {
                // A rebuilt body (a prior turn another step made) holds those turns already.
                let rebuilt = super::conversation::rebuilding(inb, step.provider()).is_some();
                let conv = inb.conversation.clone().filter(|_| !rebuilt);
                let sent = body.len();
                let count = move || sent + conv.as_ref().map_or(0, |c| c.prior_bytes());
                let sent = crate::proxy::estimate::counted(estimates, inb, count)
                    .await?
                    .map_err(|_| ProxyError::Internal)?;
                return Ok(estimated_count(sent));
            }
            return forward(
                up,
                step.target(),
                (answers, snap.cfg.server.limits.max_buffered_bytes),
                (Method::POST, "/v1/responses/input_tokens", None),
                &inb.headers,
                body,
                |_, _, _| {},
            )
            .await;
        }
    };
    // The count is of the conversation as the step would get it: rebuilt from the store
    // when it continues an earlier response, and refused, as the request would be, when
    // legate does not hold that response.
    let conv = inb.conversation.clone();
    if let Some(c) = &conv
        && let (Some(id), None) = (&c.prior_id, &c.prior)
    {
        return Err(ProxyError::PreviousResponseNotFound { id: id.clone() });
    }
    // The translation walks the whole body (up to `max_body_bytes`): a count's turn, on a
    // blocking thread, as every local estimate is (`estimate.rs`).
    let (body, model) = (inb.body.clone(), step.model().to_owned());
    let sent = crate::proxy::estimate::counted(estimates, inb, move || {
        let translated = match &conv {
            Some(c) => c.request_for(target, &body, &model),
            None => responses::request_for(target, &body, &model).map_err(|e| e.0),
        };
        translated.map(|(b, _)| b.len()).unwrap_or(body.len())
    })
    .await?
    .map_err(|_| ProxyError::Internal)?;
    Ok(estimated_count(sent))
}

/// The local estimate of a count: a token per four bytes of the body the step would get,
/// marked `x-legate-estimate: true`.
fn estimated_count(sent: usize) -> Response<ProxyBody> {
    let tokens = (sent as u64).div_ceil(4);
    let mut resp = local_json(
        StatusCode::OK,
        &json!({"object": "response.input_tokens", "input_tokens": tokens}),
    );
    crate::proxy::response::set_header(&mut resp, "x-legate-estimate", "true");
    resp
}
