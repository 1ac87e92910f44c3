//! The fake platforms: Bedrock (SigV4, event-stream frames, its error shape), Vertex AI
//! (bearer token, `rawPredict`/`streamRawPredict`, Google's error shape for quota) and Azure
//! OpenAI deployments (`api-key` or an Entra token). Replies come from the mock's script.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, Response, StatusCode};

use super::Cloud;
use crate::cloud::eventstream;
use crate::mock::anthropic;
use crate::mock::body::MockBody;
use crate::mock::render::Render;
use crate::mock::reply::{Answer, Asked, wait};
use crate::mock::script::Reply;
use crate::mock::state::{MatchKey, Shared};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Platform {
    Bedrock,
    Vertex,
    Azure,
}

/// A platform call: which platform, the model (or deployment) its URL names, streaming or not.
pub(crate) struct Call {
    pub platform: Platform,
    pub model: String,
    pub stream: bool,
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// The platform call `parts` is, if any.
pub(crate) fn route(parts: &Parts) -> Option<Call> {
    if parts.method != Method::POST {
        return None;
    }
    let path = parts.uri.path();
    if let Some(rest) = path.strip_prefix("/model/") {
        let (model, action) = rest.rsplit_once('/')?;
        let actions = ["invoke", "invoke-with-response-stream"];
        return model_call(Platform::Bedrock, model, action, actions);
    }
    if path.starts_with("/v1/projects/") && path.contains("/publishers/anthropic/models/") {
        let last = path.rsplit('/').next()?;
        let (model, action) = last.rsplit_once(':')?;
        let actions = ["rawPredict", "streamRawPredict"];
        return model_call(Platform::Vertex, model, action, actions);
    }
    let rest = path.strip_prefix("/openai/deployments/")?;
    let (deployment, tail) = rest.split_once('/')?;
    (tail == "chat/completions").then(|| Call {
        platform: Platform::Azure,
        model: decode(deployment),
        stream: false,
    })
}

/// A call on `model` if `action` is one of the platform's two: `[whole answer, stream]`.
fn model_call(platform: Platform, model: &str, action: &str, actions: [&str; 2]) -> Option<Call> {
    let stream = actions.iter().position(|a| *a == action)? == 1;
    Some(Call {
        platform,
        model: decode(model),
        stream,
    })
}

fn bedrock_error(
    answer: Answer,
    status: u16,
    exception: &str,
    message: &str,
) -> Response<MockBody> {
    let body = serde_json::json!({"message": message}).to_string();
    let extra = [(
        HeaderName::from_static("x-amzn-errortype"),
        HeaderValue::from_str(exception)
            .unwrap_or(HeaderValue::from_static("InternalServerException")),
    )];
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answer.send(
        status,
        HeaderValue::from_static("application/json"),
        MockBody::full(Bytes::from(body)),
        &extra,
    )
}

fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Answers a platform call after checking its credential and body.
pub(crate) async fn handle(
    shared: &Shared,
    cloud: &Cloud,
    call: Call,
    parts: &Parts,
    body: &Bytes,
    answer: Answer,
) -> Response<MockBody> {
    let doc: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let answer = match checked(cloud, call.platform, parts, body, &doc, answer) {
        Ok(answer) => answer,
        Err(refused) => return *refused,
    };
    let stream = match call.platform {
        Platform::Azure => doc["stream"].as_bool().unwrap_or(false),
        _ => call.stream,
    };
    let key = MatchKey {
        model: Some(&call.model),
        path: parts.uri.path(),
        stream,
    };
    let reply = shared
        .take_reply(&key, false)
        .unwrap_or_else(|| std::sync::Arc::clone(&shared.script().default));
    wait(&reply).await;
    let asked = Asked {
        model: &call.model,
        stream,
        include_usage: doc["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
    };
    match call.platform {
        Platform::Bedrock => bedrock_answer(answer, &reply, &asked),
        Platform::Vertex if reply.status.as_u16() == 429 && reply.body.is_none() => {
            let body = serde_json::json!({"error": {"code": 429, "message": "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model", "status": "RESOURCE_EXHAUSTED"}});
            answer.send(
                reply.status,
                HeaderValue::from_static("application/json"),
                MockBody::full(Bytes::from(body.to_string())),
                &reply.headers,
            )
        }
        Platform::Vertex | Platform::Azure => answer.generated(&reply, &asked),
    }
}

/// The answer back when a call passes the platform's checks, or the platform's refusal
/// (boxed: a response is large beside the answer).
type Checked = Result<Answer, Box<Response<MockBody>>>;

/// The platform's own checks before any reply is taken: its credential, then its body or
/// query.
fn checked(
    cloud: &Cloud,
    platform: Platform,
    parts: &Parts,
    body: &Bytes,
    doc: &serde_json::Value,
    answer: Answer,
) -> Checked {
    match platform {
        Platform::Bedrock => bedrock_checked(cloud, parts, body, doc, answer),
        Platform::Vertex => vertex_checked(cloud, parts, doc, answer),
        Platform::Azure => azure_checked(cloud, parts, answer),
    }
}

/// SigV4, then a body without `model` and `stream` but with `anthropic_version`.
fn bedrock_checked(
    cloud: &Cloud,
    parts: &Parts,
    body: &Bytes,
    doc: &serde_json::Value,
    answer: Answer,
) -> Checked {
    if let Err((st, exc, msg)) = super::sigv4::verify(cloud, parts, body) {
        cloud.count("refused");
        return Err(Box::new(bedrock_error(answer, st, exc, &msg)));
    }
    if !doc.is_object() || doc.get("model").is_some() || doc.get("stream").is_some() {
        return Err(Box::new(bedrock_error(
            answer,
            400,
            "ValidationException",
            "extraneous key [model] or [stream] is not permitted",
        )));
    }
    if !doc["anthropic_version"].is_string() {
        return Err(Box::new(bedrock_error(
            answer,
            400,
            "ValidationException",
            "required key [anthropic_version] not found",
        )));
    }
    Ok(answer)
}

/// A bearer token the mock issued, then `anthropic_version` and no `model`.
fn vertex_checked(
    cloud: &Cloud,
    parts: &Parts,
    doc: &serde_json::Value,
    answer: Answer,
) -> Checked {
    if let Err(why) = bearer(parts).map_or(Err("missing bearer token"), |t| cloud.check_token(t)) {
        cloud.count("refused");
        let body = serde_json::json!({"error": {"code": 401, "message": why, "status": "UNAUTHENTICATED"}});
        return Err(Box::new(answer.send(
            StatusCode::UNAUTHORIZED,
            HeaderValue::from_static("application/json"),
            MockBody::full(Bytes::from(body.to_string())),
            &[],
        )));
    }
    if !doc["anthropic_version"].is_string() || doc.get("model").is_some() {
        return Err(Box::new(answer.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "anthropic_version is required and model must not be set",
        )));
    }
    Ok(answer)
}

/// Whether a call carries the configured api-key or an Entra token the mock issued; a refusal
/// is counted.
fn azure_authorized(cloud: &Cloud, parts: &Parts) -> bool {
    let key_ok = match (&cloud.opts.azure_api_key, parts.headers.get("api-key")) {
        (Some(k), Some(v)) => v.as_bytes() == k.as_bytes(),
        _ => false,
    };
    let token_ok = bearer(parts).is_some_and(|t| cloud.check_token(t).is_ok());
    if !key_ok && !token_ok {
        cloud.count("refused");
    }
    key_ok || token_ok
}

/// Azure's refusal of a call without a valid credential.
pub(crate) fn azure_refused(answer: Answer) -> Response<MockBody> {
    answer.error(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        "Access denied due to invalid subscription key or wrong API endpoint.",
    )
}

/// A call on Azure's v1 surface (`/openai/v1/…`, the Responses API): the OpenAI path it
/// stands for, and whether its credential passed; `None` for any other path.
pub(crate) fn azure_v1<'a>(cloud: &Cloud, parts: &'a Parts) -> Option<(&'a str, bool)> {
    let path = parts.uri.path().strip_prefix("/openai")?;
    path.starts_with("/v1/")
        .then(|| (path, azure_authorized(cloud, parts)))
}

/// The api-key or an Entra token, then `api-version` in the query.
fn azure_checked(cloud: &Cloud, parts: &Parts, answer: Answer) -> Checked {
    if !azure_authorized(cloud, parts) {
        return Err(Box::new(azure_refused(answer)));
    }
    if !parts
        .uri
        .query()
        .is_some_and(|q| q.contains("api-version="))
    {
        return Err(Box::new(answer.error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "api-version is required",
        )));
    }
    Ok(answer)
}

/// The exception a scripted status or stream error stands for on Bedrock.
fn exception_for(error_type: &str, status: u16) -> (u16, &'static str) {
    match (error_type, status) {
        ("overloaded_error", _) | (_, 503 | 529) => (503, "ServiceUnavailableException"),
        ("rate_limit_error", _) | (_, 429) => (429, "ThrottlingException"),
        ("invalid_request_error", _) | (_, 400) => (400, "ValidationException"),
        ("permission_error", _) | (_, 403) => (403, "AccessDeniedException"),
        ("not_found_error", _) | (_, 404) => (404, "ResourceNotFoundException"),
        _ => (500, "InternalServerException"),
    }
}

fn bedrock_answer(answer: Answer, reply: &Reply, asked: &Asked<'_>) -> Response<MockBody> {
    if !reply.status.is_success() || reply.body.is_some() {
        let (st, exc) = exception_for(reply.error_type(), reply.status.as_u16());
        return bedrock_error(answer, st, exc, reply.error_message());
    }
    if !asked.stream {
        return answer.generated(reply, asked);
    }
    let render = Render {
        id: answer.id,
        model: reply.model.as_deref().unwrap_or(asked.model),
        reply,
    };
    let frames: Vec<Bytes> = anthropic::events(&render)
        .iter()
        .filter_map(|ev| {
            let text = std::str::from_utf8(ev).ok()?;
            let data = text.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some(eventstream::chunk_frame(data))
        })
        .collect();
    let (error_type, message) = reply.stream_error();
    let (_, exc) = exception_for(error_type, 500);
    let mut exc = exc.to_owned();
    // Exceptions in the stream are named in lower camel case.
    if let Some(first) = exc.get(..1) {
        exc = first.to_ascii_lowercase() + &exc[1..];
    }
    let body = MockBody::events(frames)
        .with_gap(reply.event_gap)
        .with_fault(reply.fault, eventstream::exception_frame(&exc, message));
    answer.send(
        StatusCode::OK,
        HeaderValue::from_static(eventstream::CONTENT_TYPE),
        body,
        &[],
    )
}
