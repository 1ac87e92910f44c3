//! One request from arrival to response: control-plane calls go to `control`; API calls are
//! recorded, checked against the expected key, routed, matched to a scripted reply and
//! answered.

use std::sync::Arc;

use bytes::Bytes;
use http::header::AUTHORIZATION;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::Deserialize;

use super::body::MockBody;
use super::render::Render;
use super::reply::{Answer, Api, Asked, wait};
use super::script::{Reply, Script};
use super::state::{MatchKey, RecordedRequest, Shared};
use super::{anthropic, cloud, control, responses};

/// Models always listed, besides those the script names.
const LISTED_MODELS: [&str; 2] = ["claude-sonnet-4-5", "claude-haiku-4-5"];

/// Model named when the request names none.
const FALLBACK_MODEL: &str = "mock-model";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Messages,
    CountTokens,
    Models,
    Chat,
    Responses,
    InputTokens,
    /// `GET`/`DELETE /v1/responses/{id}`, `POST …/{id}/cancel`, `GET …/{id}/input_items`.
    StoredResponse,
    Unknown(Api),
}

impl Route {
    fn of(method: &Method, path: &str, headers: &HeaderMap) -> Route {
        match (method, path) {
            (&Method::POST, "/v1/messages") => Route::Messages,
            (&Method::POST, "/v1/messages/count_tokens") => Route::CountTokens,
            (&Method::GET, "/v1/models") => Route::Models,
            (&Method::POST, "/v1/chat/completions") => Route::Chat,
            (&Method::POST, "/v1/responses") => Route::Responses,
            (&Method::POST, "/v1/responses/input_tokens") => Route::InputTokens,
            (m, p) if stored_response_path(m, p).is_some() => Route::StoredResponse,
            _ => Route::Unknown(guess_api(path, headers)),
        }
    }

    fn api(self) -> Api {
        match self {
            Route::Messages | Route::CountTokens | Route::Models => Api::Anthropic,
            Route::Chat => Api::OpenAi,
            Route::Responses | Route::InputTokens | Route::StoredResponse => Api::Responses,
            Route::Unknown(api) => api,
        }
    }
}

/// The error shape for a path the mock does not serve: by path family, else by whether the
/// caller speaks Anthropic (`anthropic-version`).
fn guess_api(path: &str, headers: &HeaderMap) -> Api {
    const OPENAI: [&str; 4] = [
        "/v1/chat/",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
    ];
    const ANTHROPIC: [&str; 2] = ["/v1/messages", "/v1/models"];
    if OPENAI.iter().any(|p| path.starts_with(p)) {
        Api::OpenAi
    } else if ANTHROPIC.iter().any(|p| path.starts_with(p))
        || headers.contains_key("anthropic-version")
    {
        Api::Anthropic
    } else {
        Api::OpenAi
    }
}

/// The request fields that shape the reply; everything else in the body is ignored.
#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Entry point for every request on the listener.
pub(crate) async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Response<MockBody> {
    if let Some(cloud) = shared.cloud()
        && request.uri().path() == "/_mock/cloud"
    {
        return cloud.report();
    }
    if request.uri().path().starts_with("/_mock/") {
        return control::handle(&shared, request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(collected) = body.collect().await else {
        // The request body broke off: nothing to record, and nobody left to answer.
        let mut response = Response::new(MockBody::full(Bytes::new()));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    let body = collected.to_bytes();
    if let Some(cloud) = shared.cloud() {
        if let Some(resp) = cloud.credential_endpoint(&parts, &body) {
            return resp;
        }
        if let Some(call) = cloud::route(&parts) {
            let recorded = RecordedRequest::new(
                parts.method.to_string(),
                parts
                    .uri
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str())
                    .to_owned(),
                header_list(&parts.headers),
                body.clone(),
            );
            let (id, guard) = shared.record(recorded);
            let api = match call.platform {
                cloud::Platform::Azure => Api::OpenAi,
                _ => Api::Anthropic,
            };
            let answer = Answer { api, id, guard };
            return cloud::platforms::handle(&shared, cloud, call, &parts, &body, answer).await;
        }
    }
    // Azure's v1 surface serves the Responses API under `/openai`, with Azure's credential.
    let azure = shared
        .cloud()
        .and_then(|cloud| cloud::platforms::azure_v1(cloud, &parts));
    let path = azure.map_or(parts.uri.path(), |(path, _)| path);
    let route = Route::of(&parts.method, path, &parts.headers);
    let recorded = RecordedRequest::new(
        parts.method.to_string(),
        parts
            .uri
            .path_and_query()
            .map_or(path, |pq| pq.as_str())
            .to_owned(),
        header_list(&parts.headers),
        body.clone(),
    );
    let (id, guard) = shared.record(recorded);
    let answer = Answer {
        api: route.api(),
        id,
        guard,
    };
    let script = shared.script();
    if let Some((_, authorized)) = azure {
        if !authorized {
            return cloud::platforms::azure_refused(answer);
        }
    } else if let Some(key) = &script.expect_key
        && !authorized(&parts.headers, key)
    {
        let message = match answer.api {
            Api::Anthropic => "invalid x-api-key",
            Api::OpenAi | Api::Responses => "Incorrect API key provided.",
        };
        return answer.error(StatusCode::UNAUTHORIZED, "authentication_error", message);
    }
    match route {
        Route::Unknown(_) => {
            let message = format!("Not found: {} {path}", parts.method);
            answer.error(StatusCode::NOT_FOUND, "not_found_error", &message)
        }
        Route::Models => models(&shared, &script, answer, path).await,
        Route::StoredResponse => {
            stored_response(&shared, &script, answer, &parts.method, path).await
        }
        Route::CountTokens
        | Route::Messages
        | Route::Chat
        | Route::Responses
        | Route::InputTokens => with_body(&shared, &script, answer, route, path, &body).await,
    }
}

/// `GET /v1/models`: the fixed names plus those the script mentions.
async fn models(
    shared: &Shared,
    script: &Script,
    answer: Answer,
    path: &str,
) -> Response<MockBody> {
    let reply = document_reply(shared, &path_key(path)).await;
    let mut names: Vec<String> = LISTED_MODELS.iter().map(|m| (*m).to_owned()).collect();
    for name in script.model_names() {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    answer.document(reply.as_deref(), anthropic::models(&names))
}

/// The key of a route told apart by its path alone (no model, no stream).
fn path_key(path: &str) -> MatchKey<'_> {
    MatchKey {
        model: None,
        path,
        stream: false,
    }
}

/// A queued reply for a route that answers a document (models, token counts, stored
/// responses): only one queued for its path is taken, and its delay waited out.
async fn document_reply(shared: &Shared, key: &MatchKey<'_>) -> Option<Arc<Reply>> {
    let reply = shared.take_reply(key, true);
    if let Some(reply) = &reply {
        wait(reply).await;
    }
    reply
}

/// The routes that read a JSON request body: count_tokens and the two generation endpoints.
async fn with_body(
    shared: &Shared,
    script: &Script,
    answer: Answer,
    route: Route,
    path: &str,
    body: &Bytes,
) -> Response<MockBody> {
    let Ok(meta) = serde_json::from_slice::<Meta>(body) else {
        let message = "The request body is not a valid JSON object.";
        return answer.error(StatusCode::BAD_REQUEST, "invalid_request_error", message);
    };
    let key = MatchKey {
        model: meta.model.as_deref(),
        path,
        stream: meta.stream.unwrap_or(false),
    };
    if matches!(route, Route::CountTokens | Route::InputTokens) {
        let reply = document_reply(shared, &key).await;
        let tokens = body.len() as u64 / 4;
        let natural = if route == Route::InputTokens {
            responses::input_tokens(tokens)
        } else {
            anthropic::count_tokens(tokens)
        };
        return answer.document(reply.as_deref(), natural);
    }
    let reply = shared
        .take_reply(&key, false)
        .unwrap_or_else(|| Arc::clone(&script.default));
    wait(&reply).await;
    let asked = Asked {
        model: meta.model.as_deref().unwrap_or(FALLBACK_MODEL),
        stream: key.stream,
        include_usage: meta
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    };
    answer.generated(&reply, &asked)
}

/// The id and the action of a stored-response path: `GET`/`DELETE /v1/responses/{id}`,
/// `POST …/{id}/cancel`, `GET …/{id}/input_items`.
fn stored_response_path<'a>(method: &Method, path: &'a str) -> Option<(&'a str, &'a str)> {
    let path = path.strip_prefix("/v1")?;
    let op = crate::api::ApiKind::Responses
        .dialect()
        .operation(method, path);
    let rest = path.strip_prefix("/responses/")?;
    let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
    let stored = op == Some(crate::api::Operation::StoredResponse);
    (stored && id != "input_tokens").then_some((id, action))
}

/// The mock keeps no conversations: a stored response is the default reply under the asked
/// id, unless a queued reply names the path.
async fn stored_response(
    shared: &Shared,
    script: &Script,
    answer: Answer,
    method: &Method,
    path: &str,
) -> Response<MockBody> {
    let Some((id, action)) = stored_response_path(method, path) else {
        return answer.error(StatusCode::NOT_FOUND, "not_found_error", "Not found");
    };
    let reply = document_reply(shared, &path_key(path)).await;
    let render = Render {
        id: answer.id,
        model: script.default.model.as_deref().unwrap_or(FALLBACK_MODEL),
        reply: &script.default,
    };
    let natural = match (method, action) {
        (&Method::DELETE, _) => responses::deleted(id),
        (_, "input_items") => responses::input_items(),
        (_, "cancel") => responses::stored(&render, id, Some("cancelled")),
        _ => responses::stored(&render, id, None),
    };
    answer.document(reply.as_deref(), natural)
}

fn header_list(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect()
}

/// True when at least one credential is presented and every presented one is the key.
fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let api_keys = headers.get_all("x-api-key").iter().map(|v| v.as_bytes());
    let bearers = headers.get_all(AUTHORIZATION).iter().map(|v| {
        let raw = v.as_bytes();
        raw.strip_prefix(b"Bearer ").unwrap_or(raw)
    });
    let mut presented = api_keys.chain(bearers).peekable();
    presented.peek().is_some() && presented.all(|k| k == key.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn key_check_accepts_either_credential_form() {
        assert!(authorized(&headers(&[("x-api-key", "k")]), "k"));
        assert!(authorized(&headers(&[("authorization", "Bearer k")]), "k"));
        assert!(authorized(
            &headers(&[("x-api-key", "k"), ("authorization", "Bearer k")]),
            "k"
        ));
        assert!(!authorized(&headers(&[]), "k"));
        assert!(!authorized(
            &headers(&[("x-api-key", "k"), ("authorization", "Bearer x")]),
            "k"
        ));
        assert!(!authorized(&headers(&[("authorization", "k")]), "Bearer k"));
        assert!(!authorized(&headers(&[("x-api-key", "K")]), "k"));
    }

    #[test]
    fn routes_and_error_shapes() {
        let none = headers(&[]);
        let anthropic = headers(&[("anthropic-version", "2023-06-01")]);
        let cases = [
            (Method::POST, "/v1/messages", &none, Route::Messages),
            (
                Method::POST,
                "/v1/messages/count_tokens",
                &none,
                Route::CountTokens,
            ),
            (Method::GET, "/v1/models", &none, Route::Models),
            (Method::POST, "/v1/chat/completions", &none, Route::Chat),
            (
                Method::GET,
                "/v1/messages",
                &none,
                Route::Unknown(Api::Anthropic),
            ),
            (Method::POST, "/v1/responses", &anthropic, Route::Responses),
            (
                Method::GET,
                "/v1/responses/resp_1",
                &none,
                Route::StoredResponse,
            ),
            (
                Method::POST,
                "/v1/responses/resp_1/cancel",
                &none,
                Route::StoredResponse,
            ),
            (
                Method::GET,
                "/v1/responses/resp_1/input_items",
                &none,
                Route::StoredResponse,
            ),
            (
                Method::POST,
                "/v1/responses/input_tokens",
                &none,
                Route::InputTokens,
            ),
            (
                Method::PUT,
                "/v1/responses/resp_1",
                &none,
                Route::Unknown(Api::OpenAi),
            ),
            (
                Method::POST,
                "/v2/x",
                &anthropic,
                Route::Unknown(Api::Anthropic),
            ),
            (Method::POST, "/v2/x", &none, Route::Unknown(Api::OpenAi)),
        ];
        for (method, path, headers, want) in cases {
            assert_eq!(Route::of(&method, path, headers), want, "{method} {path}");
        }
    }
}
