//! The one error type of the request path and the one function that renders it as a response
//! in the caller's API shape. Every refusal or failure legate itself produces passes through
//! here, so statuses, error types and retry headers are decided in exactly one place.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::api::{ApiKind, ErrorClass, LocalError};

/// How a call failed before any answer came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// No connection: TCP connect, or the HTTP/2 handshake, failed or timed out.
    Connecting,
    /// The provider's TLS certificate was refused: a configuration fault another try within
    /// milliseconds would meet again. The text is rustls's, never a secret.
    Tls(String),
    /// On an open connection, before the request was known to be written (HTTP/2: hyper
    /// does not say).
    OnOpenConnection,
    /// After legate began writing the request: the provider may have read it.
    AfterSending,
}

impl Failed {
    /// Nothing left for the provider: no connection was made.
    pub fn never_connected(&self) -> bool {
        matches!(self, Failed::Connecting | Failed::Tls(_))
    }
}

/// Where a failure came from: decides whether the SDK may retry it and how it is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The caller sent something legate refuses.
    Client,
    /// legate itself (configuration, internal).
    Proxy,
    /// The upstream provider failed or could not be reached.
    Upstream,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyError {
    /// Body not JSON, or lacking a required field (message says which).
    InvalidRequest { message: String },
    /// No such endpoint.
    NotFound { method: String, path: String },
    /// `GET /v1/models/{id}` for a model legate has not configured.
    ModelNotFound { model: String },
    /// A stored response the caller's tenant may not see: another tenant's.
    ResponseNotFound { id: String },
    /// A `previous_response_id` legate does not hold for the caller and may not forward: 400
    /// in OpenAI's own shape for it (`code` `previous_response_not_found`, `param` naming the
    /// field), so an SDK or agent that handles the provider's answer handles legate's too.
    PreviousResponseNotFound { id: String },
    /// Body larger than `server.max_body_bytes`.
    TooLarge { limit: usize },
    /// `[[clients]]` is configured and the caller's key matches none (or is missing).
    Unauthorized,
    /// Absolute-form target, CONNECT, or a Host that is not this proxy.
    ForbiddenTarget,
    /// A browser request from a web page (an `Origin` that is not loopback).
    ForbiddenOrigin,
    /// The request body did not arrive within `server.body_read_timeout`.
    BodyTimeout,
    /// Request bodies being read, or answers held whole, already fill
    /// `server.max_buffered_bytes` (each bounded on its own).
    BuffersFull { retry_after: std::time::Duration },
    /// The provider has no key (env var unset or key file unreadable).
    NoProviderKey { provider: String, hint: String },
    /// The conversation store (Redis) could not be reached to look up `previous_response_id`
    /// or a stored response: nothing was sent upstream.
    StoreUnavailable { retry_after: std::time::Duration },
    /// A cloud provider's credential could not be obtained (`what` says which step failed;
    /// never a secret).
    CredentialUnavailable { provider: String, what: String },
    /// Connecting to the upstream failed, or (`sent`) the connection failed after the request
    /// went out and before its answer's head.
    UpstreamUnreachable { provider: String, failed: Failed },
    /// The upstream did not send response headers within `first_byte_timeout`.
    UpstreamTimeout { provider: String },
    /// The request's deadline passed before an answer.
    DeadlineExceeded,
    /// An upstream stream broke (cut, stalled) before its first content event, on every try.
    UpstreamStreamBroken { provider: String },
    /// The upstream answered, but with something that cannot be passed on (no choices, tool
    /// arguments that are not a JSON object), on every try. `reason` holds no upstream content.
    UpstreamAnswerUnusable { provider: String, reason: String },
    /// Every chain step's breaker is open: nothing was sent upstream.
    AllBreakersOpen { retry_after: std::time::Duration },
    /// A tenant limit refused the request for now.
    RateLimited {
        limit: &'static str,
        retry_after: std::time::Duration,
    },
    /// The request reserves more tokens than the tenant's whole per-minute limit.
    NeverFits { tokens: u64, tokens_per_minute: u64 },
    /// The admission queue shed this lower-priority request, or (`counting`) no local token
    /// count was free in time.
    Shed {
        retry_after: std::time::Duration,
        counting: bool,
    },
    /// A request head HTTP/1.1 does not allow (400), over the head limits (431), or of
    /// another HTTP version (505), refused by the connection before any route is known.
    BadHead {
        status: StatusCode,
        message: &'static str,
    },
    /// legate is shutting down and the request had no answer when `shutdown_grace` ran out.
    ShuttingDown,
    /// Anything unexpected; details go to the log only.
    Internal,
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::InvalidRequest { .. }
            | ProxyError::PreviousResponseNotFound { .. }
            | ProxyError::NeverFits { .. } => StatusCode::BAD_REQUEST,
            ProxyError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Shed { .. } => overloaded(),
            ProxyError::NotFound { .. }
            | ProxyError::ModelNotFound { .. }
            | ProxyError::ResponseNotFound { .. } => StatusCode::NOT_FOUND,
            ProxyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::Unauthorized => StatusCode::UNAUTHORIZED,
            ProxyError::ForbiddenTarget | ProxyError::ForbiddenOrigin => StatusCode::FORBIDDEN,
            ProxyError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::BuffersFull { .. } => overloaded(),
            ProxyError::NoProviderKey { .. } | ProxyError::Internal => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ProxyError::StoreUnavailable { .. } | ProxyError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::UpstreamUnreachable { .. }
            | ProxyError::UpstreamStreamBroken { .. }
            | ProxyError::UpstreamAnswerUnusable { .. }
            | ProxyError::CredentialUnavailable { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::AllBreakersOpen { .. } => overloaded(),
            ProxyError::UpstreamTimeout { .. } | ProxyError::DeadlineExceeded => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::BadHead { status, .. } => *status,
        }
    }

    pub fn source(&self) -> Source {
        match self {
            ProxyError::InvalidRequest { .. }
            | ProxyError::PreviousResponseNotFound { .. }
            | ProxyError::NotFound { .. }
            | ProxyError::ModelNotFound { .. }
            | ProxyError::ResponseNotFound { .. }
            | ProxyError::TooLarge { .. }
            | ProxyError::Unauthorized
            | ProxyError::ForbiddenTarget
            | ProxyError::ForbiddenOrigin
            | ProxyError::BodyTimeout
            | ProxyError::RateLimited { .. }
            | ProxyError::NeverFits { .. }
            | ProxyError::BadHead { .. } => Source::Client,
            ProxyError::Shed { .. } | ProxyError::BuffersFull { .. } => Source::Proxy,
            ProxyError::NoProviderKey { .. }
            | ProxyError::CredentialUnavailable { .. }
            | ProxyError::StoreUnavailable { .. }
            | ProxyError::ShuttingDown
            | ProxyError::Internal => Source::Proxy,
            ProxyError::UpstreamUnreachable { .. }
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::UpstreamStreamBroken { .. }
            | ProxyError::UpstreamAnswerUnusable { .. }
            | ProxyError::DeadlineExceeded
            | ProxyError::AllBreakersOpen { .. } => Source::Upstream,
        }
    }

    /// True when the rest of the caller's body is not worth waiting for: it did not come
    /// within `body_read_timeout`. Over HTTP/1 the connection then closes after the answer;
    /// after any other refusal it reads the rest and drops it, and goes on (`server::h1`).
    pub fn ends_connection(&self) -> bool {
        matches!(self, ProxyError::BodyTimeout)
    }

    /// Short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::InvalidRequest { .. } => "invalid_request",
            ProxyError::PreviousResponseNotFound { .. } => "previous_response_not_found",
            ProxyError::NotFound { .. } => "not_found",
            ProxyError::ModelNotFound { .. } => "model_not_found",
            ProxyError::ResponseNotFound { .. } => "response_not_found",
            ProxyError::TooLarge { .. } => "too_large",
            ProxyError::Unauthorized => "unauthorized",
            ProxyError::ForbiddenTarget => "forbidden_target",
            ProxyError::ForbiddenOrigin => "forbidden_origin",
            ProxyError::BodyTimeout => "body_timeout",
            ProxyError::BuffersFull { .. } => "buffers_full",
            ProxyError::NoProviderKey { .. } => "no_provider_key",
            ProxyError::CredentialUnavailable { .. } => "credential_unavailable",
            ProxyError::StoreUnavailable { .. } => "conversation_store_unavailable",
            ProxyError::UpstreamUnreachable { .. } => "upstream_unreachable",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
            ProxyError::DeadlineExceeded => "deadline_exceeded",
            ProxyError::UpstreamStreamBroken { .. } => "upstream_stream_broken",
            ProxyError::UpstreamAnswerUnusable { .. } => "upstream_answer_unusable",
            ProxyError::AllBreakersOpen { .. } => "breaker_open",
            ProxyError::RateLimited { .. } => "rate_limited",
            ProxyError::NeverFits { .. } => "never_fits",
            ProxyError::Shed { .. } => "shed",
            ProxyError::BadHead { .. } => "bad_head",
            ProxyError::ShuttingDown => "shutting_down",
            ProxyError::Internal => "internal",
        }
    }

    /// What the error means, in the vocabulary every dialect has a type for. Deadlines and
    /// upstream timeouts are server errors (SPEC §5: 504 `api_error`), not the API's
    /// `timeout_error`, which names a timeout inside the provider.
    pub fn class(&self) -> ErrorClass {
        match self {
            ProxyError::InvalidRequest { .. }
            | ProxyError::PreviousResponseNotFound { .. }
            | ProxyError::ForbiddenTarget
            | ProxyError::BodyTimeout
            | ProxyError::NeverFits { .. } => ErrorClass::InvalidRequest,
            ProxyError::BadHead { status, .. }
                if *status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE =>
            {
                ErrorClass::TooLarge
            }
            ProxyError::BadHead { .. } => ErrorClass::InvalidRequest,
            ProxyError::ForbiddenOrigin => ErrorClass::Permission,
            ProxyError::NotFound { .. }
            | ProxyError::ModelNotFound { .. }
            | ProxyError::ResponseNotFound { .. } => ErrorClass::NotFound,
            ProxyError::TooLarge { .. } => ErrorClass::TooLarge,
            ProxyError::Unauthorized => ErrorClass::Authentication,
            ProxyError::AllBreakersOpen { .. }
            | ProxyError::Shed { .. }
            | ProxyError::BuffersFull { .. } => ErrorClass::Overloaded,
            ProxyError::RateLimited { .. } => ErrorClass::RateLimited,
            ProxyError::NoProviderKey { .. }
            | ProxyError::CredentialUnavailable { .. }
            | ProxyError::StoreUnavailable { .. }
            | ProxyError::UpstreamUnreachable { .. }
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::UpstreamStreamBroken { .. }
            | ProxyError::UpstreamAnswerUnusable { .. }
            | ProxyError::DeadlineExceeded
            | ProxyError::ShuttingDown
            | ProxyError::Internal => ErrorClass::Server,
        }
    }

    /// The machine-readable code of the error (OpenAI's `error.code`): the kind, except where
    /// OpenAI has a code of its own for the same condition.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::NotFound { .. } => "unknown_url",
            ProxyError::TooLarge { .. } => "request_too_large",
            ProxyError::Unauthorized => "invalid_api_key",
            ProxyError::BodyTimeout => "request_timeout",
            ProxyError::AllBreakersOpen { .. }
            | ProxyError::Shed { .. }
            | ProxyError::BuffersFull { .. } => "overloaded",
            ProxyError::RateLimited { .. } => "rate_limit_exceeded",
            ProxyError::NeverFits { .. } => "request_too_large_for_limit",
            ProxyError::PreviousResponseNotFound { .. } => "previous_response_not_found",
            ProxyError::Internal => "internal_error",
            _ => self.kind(),
        }
    }

    /// The request field the error is about, where OpenAI names one (`error.param`).
    pub fn param(&self) -> Option<&'static str> {
        match self {
            ProxyError::PreviousResponseNotFound { .. } => Some("previous_response_id"),
            _ => None,
        }
    }

    /// What happened and what to do; never a secret, never internal error text.
    pub fn message(&self) -> String {
        match self {
            ProxyError::InvalidRequest { message } => message.clone(),
            ProxyError::NotFound { method, path } => format!(
                "legate does not serve {} {}; it serves POST /v1/messages, POST /v1/messages/count_tokens, GET /v1/models, POST /v1/chat/completions, POST /v1/responses and GET/DELETE /v1/responses/{{id}}",
                shown(method),
                shown(path)
            ),
            ProxyError::ResponseNotFound { id } => format!(
                "no response with id `{}` is kept for this caller",
                shown(id)
            ),
            ProxyError::PreviousResponseNotFound { id } => format!(
                "Previous response with id '{}' not found: legate never relayed it for this caller, or it expired; resend the whole conversation as input",
                shown(id)
            ),
            ProxyError::ModelNotFound { model } => format!(
                "model `{model}` is not configured in legate; GET /v1/models lists the names it serves"
            ),
            ProxyError::TooLarge { limit } => format!(
                "the request body is larger than {limit} bytes (server.max_body_bytes); nothing was sent upstream"
            ),
            ProxyError::Unauthorized => {
                "the API key sent to legate matches no configured client ([[clients]]); send the key legate issued to your tenant".to_string()
            }
            ProxyError::ForbiddenTarget => {
                "legate only proxies to its configured providers: absolute-form targets, CONNECT and foreign Host headers are refused".to_string()
            }
            ProxyError::ForbiddenOrigin => {
                "requests from web pages (an Origin header that is not a loopback origin) are refused: a page in a browser must not spend the provider keys".to_string()
            }
            ProxyError::BodyTimeout => {
                "the request body did not arrive within server.body_read_timeout; nothing was sent upstream".to_string()
            }
            ProxyError::BuffersFull { retry_after } => format!(
                "legate holds as many bodies as server.max_buffered_bytes allows; retry in {}s",
                retry_after.as_secs_f64().ceil()
            ),
            ProxyError::NoProviderKey { provider, hint } => format!(
                "legate has no API key for provider `{provider}`: {hint}"
            ),
            ProxyError::StoreUnavailable { retry_after } => format!(
                "the conversation store (Redis) cannot be reached; nothing was sent upstream. Retry in {}s (or, for a previous_response_id, resend the whole conversation without it)",
                retry_after.as_secs_f64().ceil()
            ),
            ProxyError::CredentialUnavailable { provider, what } => format!(
                "legate could not obtain a credential for provider `{provider}`: {what}"
            ),
            ProxyError::UpstreamUnreachable {
                provider,
                failed: Failed::Connecting,
            } => format!(
                "could not connect to provider `{provider}`; legate will keep trying on later requests"
            ),
            ProxyError::UpstreamUnreachable {
                provider,
                failed: Failed::Tls(why),
            } => format!(
                "the TLS certificate of provider `{provider}` was refused ({why}); nothing was sent"
            ),
            ProxyError::UpstreamUnreachable {
                provider,
                failed: Failed::OnOpenConnection,
            } => format!(
                "the request to provider `{provider}` failed on an open connection (the provider reset it, or the connection broke) before any answer came"
            ),
            ProxyError::UpstreamUnreachable {
                provider,
                failed: Failed::AfterSending,
            } => format!(
                "the connection to provider `{provider}` closed or failed after legate began sending the request, before any answer came"
            ),
            ProxyError::UpstreamTimeout { provider } => format!(
                "provider `{provider}` sent no response headers within its first_byte_timeout"
            ),
            ProxyError::DeadlineExceeded => {
                "no answer within the request deadline (server.default_deadline or x-legate-deadline-ms)".to_string()
            }
            ProxyError::UpstreamStreamBroken { provider } => format!(
                "provider `{provider}` broke off its answer (a cut, a stall, or a stream without content) before any of it reached you, on every try"
            ),
            ProxyError::UpstreamAnswerUnusable { provider, reason } => format!(
                "provider `{provider}` answered, but legate cannot pass the answer on: {reason}"
            ),
            ProxyError::RateLimited {
                limit: "budget_held",
                retry_after,
            } => format!(
                "what is left of this tenant's daily budget is held by its requests in flight; retry in {}s",
                retry_after.as_secs_f64().ceil()
            ),
            ProxyError::RateLimited { limit, retry_after } => format!(
                "this tenant's {} limit is reached; retry in {}s",
                match *limit {
                    "budget" => "daily budget",
                    "tokens" => "tokens-per-minute",
                    _ => "requests-per-minute",
                },
                retry_after.as_secs_f64().ceil()
            ),
            ProxyError::NeverFits { tokens, tokens_per_minute } => format!(
                "this request reserves {tokens} tokens (estimated input + max_tokens), more than the tenant's whole limit of {tokens_per_minute} tokens per minute; lower max_tokens or shorten the prompt"
            ),
            ProxyError::Shed {
                retry_after,
                counting: false,
            } => format!(
                "legate is at capacity and shed this lower-priority request; retry in {}s",
                retry_after.as_secs_f64().ceil()
            ),
            ProxyError::Shed {
                retry_after,
                counting: true,
            } => format!(
                "every local token count is busy (a few run at once, fewer for one tenant when there are several); retry in {}s",
                retry_after.as_secs_f64().ceil()
            ),
            ProxyError::AllBreakersOpen { retry_after } => format!(
                "every upstream for this model is failing and resting (circuit breakers open); retry in {}s",
                retry_after.as_secs_f64().ceil()
            ),
            ProxyError::BadHead { message, .. } => (*message).to_string(),
            ProxyError::ShuttingDown => {
                "legate is shutting down and this request had no answer within server.shutdown_grace; send it again (to the replica taking over)".to_string()
            }
            ProxyError::Internal => "legate hit an internal error; see its log for the request id".to_string(),
        }
    }

    /// Renders the error in the caller's API shape with the headers the SDKs act on.
    pub fn render(&self, api: ApiKind, request_id: &str) -> Response<Bytes> {
        let message = self.message();
        let local = LocalError {
            param: self.param(),
            class: self.class(),
            code: self.code(),
            message: &message,
        };
        let body = api.dialect().error_body(local, request_id);
        let mut resp = Response::new(body);
        *resp.status_mut() = self.status();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let ProxyError::AllBreakersOpen { retry_after }
        | ProxyError::RateLimited { retry_after, .. }
        | ProxyError::Shed { retry_after, .. }
        | ProxyError::BuffersFull { retry_after }
        | ProxyError::StoreUnavailable { retry_after } = self
        {
            // Refused before any upstream attempt: the caller may come back when it would fit
            // (and the SDK may retry it then: nothing is multiplied upstream).
            set_retry_after(headers, *retry_after);
        } else if *self == ProxyError::ShuttingDown {
            // Nothing is multiplied when no attempt was under way; when one was, the answer
            // also says `x-should-retry: false` (the caller's choice, not the SDK's).
            set_retry_after(headers, std::time::Duration::from_secs(1));
        } else if self.source() != Source::Client {
            // legate owns retries: an error that follows upstream attempts (or that a retry
            // cannot fix) must not be multiplied by the SDK's own retry loop.
            headers.insert("x-should-retry", HeaderValue::from_static("false"));
        }
        resp
    }
}

/// 529, the status Anthropic uses for "overloaded".
fn overloaded() -> StatusCode {
    StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

/// What the caller sent (an id, a method, a path), as an error message repeats it: whole up to
/// [`SHOWN_ID`] characters (every id a provider or legate makes is far shorter), else its
/// start and `…`, so that a caller's megabyte-long "id" is not sent back whole.
pub(crate) fn shown(id: &str) -> std::borrow::Cow<'_, str> {
    match id.char_indices().nth(SHOWN_ID) {
        None => std::borrow::Cow::Borrowed(id),
        Some((at, _)) => std::borrow::Cow::Owned(format!("{}…", &id[..at])),
    }
}

/// The most characters of a caller's id an error message repeats.
const SHOWN_ID: usize = 128;

/// `retry-after` in whole seconds (rounded up) and `retry-after-ms`, as the SDKs read them.
pub fn set_retry_after(headers: &mut http::HeaderMap, wait: std::time::Duration) {
    let ms = wait.as_millis().max(1);
    let secs = ms.div_ceil(1000);
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        headers.insert(header::RETRY_AFTER, v);
    }
    if let Ok(v) = HeaderValue::from_str(&ms.to_string()) {
        headers.insert("retry-after-ms", v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(resp: &Response<Bytes>) -> serde_json::Value {
        serde_json::from_slice(resp.body()).unwrap_or(serde_json::Value::Null)
    }

    #[test]
    fn anthropic_shape_has_type_error_and_request_id() {
        let resp = ProxyError::TooLarge { limit: 10 }.render(ApiKind::Anthropic, "lgt_1");
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let v = json(&resp);
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "request_too_large");
        assert_eq!(v["request_id"], "lgt_1");
        assert!(resp.headers().get("x-should-retry").is_none());
    }

    #[test]
    fn openai_shape_has_code_and_null_param() {
        let resp = ProxyError::Unauthorized.render(ApiKind::OpenAi, "lgt_2");
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let v = json(&resp);
        assert_eq!(v["error"]["type"], "authentication_error");
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert!(v["error"]["param"].is_null());
    }

    #[test]
    fn a_long_id_is_repeated_in_part_on_a_character_boundary() {
        assert_eq!(shown("resp_1"), "resp_1");
        let exact = "é".repeat(SHOWN_ID);
        assert_eq!(shown(&exact), exact);
        let long = "é".repeat(SHOWN_ID + 1);
        assert_eq!(shown(&long), format!("{}…", "é".repeat(SHOWN_ID)));
    }

    #[test]
    fn upstream_failures_forbid_sdk_retries() {
        let resp = ProxyError::UpstreamUnreachable {
            provider: "anthropic".into(),
            failed: Failed::Connecting,
        }
        .render(ApiKind::Anthropic, "x");
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            resp.headers().get("x-should-retry").map(|v| v.as_bytes()),
            Some(&b"false"[..])
        );
    }
}
