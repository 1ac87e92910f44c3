//! Responses API errors. Whole error bodies are OpenAI's envelope with OpenAI's statuses
//! (wire-protocol F), so its table is Chat Completions' table (which reads the codes of failed
//! responses too); what is the Responses API's own is its stream: an `error` event
//! `{type:"error", code, message, param, sequence_number}`, or a `response.failed` whose
//! `response.error` is `{code, message}`. Those events carry a code and no error type.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use crate::api::errors::{ErrorClass as C, ErrorFields, LocalError};
use crate::api::openai_chat::errors as chat;

/// The Responses API's table is OpenAI's.
pub(super) use chat::TABLE;

/// An error body (the OpenAI envelope), an `error` event, or a `response.failed` event.
pub(super) fn read(data: &[u8]) -> Option<ErrorFields> {
    let v: Value = serde_json::from_slice(data).ok()?;
    let e = match v["type"].as_str() {
        Some("response.failed") => &v["response"]["error"],
        // The event itself is the error; its `type` is the event's, not an error type.
        Some("error") if !v["error"].is_object() => &v,
        _ => return chat::read(data),
    };
    let text = |k: &str| e[k].as_str().map(str::to_owned);
    Some(ErrorFields {
        error_type: None,
        code: text("code"),
        message: text("message"),
    })
}

pub(super) fn body(e: LocalError<'_>) -> Bytes {
    chat::body(e)
}

/// An `error` event, then the terminal `response.failed` the SDKs' stream helpers end on, for a
/// stream nothing was watched of (numbered past any upstream's). A watched stream's ending
/// follows what was relayed: [`super::Lifecycle`].
pub(super) fn stream_event(e: LocalError<'_>) -> Bytes {
    let error = json!({
        "type": "error", "code": e.code, "message": e.message, "param": e.param,
        "sequence_number": 1_000_000_000u64,
    });
    let failed = json!({
        "type": "response.failed", "sequence_number": 1_000_000_001u64,
        "response": {"object": "response", "status": "failed", "output": [],
                     "error": {"code": e.code, "message": e.message}},
    });
    Bytes::from(format!(
        "event: error\ndata: {error}\n\nevent: response.failed\ndata: {failed}\n\n"
    ))
}

/// An `error` / `response.failed` event before the commit point, as the status its code stands
/// for and an OpenAI error body keeping that code.
pub(super) fn event_response(data: &str) -> (StatusCode, Bytes) {
    let f = read(data.as_bytes()).unwrap_or_default();
    // A translated stream's event carries the other API's error type where the code belongs
    // (`invalid_request_error`, `rate_limit_error`), or a compatible server's numeric status:
    // read as what they mean, they were a retried 500, and a refusal was routed around.
    let class = TABLE
        .class_of(
            f.error_type.as_deref().or(f.code.as_deref()),
            f.code.as_deref(),
        )
        .or_else(|| numeric_code(data).map(|s| TABLE.class_for_status(s)))
        .unwrap_or(C::Server);
    let row = TABLE.row(class);
    let code = f
        .code
        .or(f.error_type)
        .unwrap_or_else(|| row.code.unwrap_or(row.error_type).into());
    let message = f.message.unwrap_or_else(|| "the upstream failed".into());
    let body = json!({"error": {
        "message": message, "type": row.error_type, "param": null, "code": code,
    }});
    (
        StatusCode::from_u16(row.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Bytes::from(body.to_string()),
    )
}

/// The numeric `code` of an `error` event or a `response.failed`'s error (an HTTP status).
fn numeric_code(data: &str) -> Option<u16> {
    let v: Value = serde_json::from_str(data).ok()?;
    let code = match v["type"].as_str() {
        Some("response.failed") => &v["response"]["error"]["code"],
        _ if v["error"].is_object() => &v["error"]["code"],
        _ => &v["code"],
    };
    chat::numeric_status(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stream failures carry only a code: each becomes the status it stands for, the code kept.
    #[test]
    fn error_events_become_responses_by_their_code() {
        let event = |code: &str| format!(r#"{{"type":"error","code":"{code}","message":"m"}}"#);
        let mut cases: Vec<(String, u16, &str)> = [
            ("rate_limit_exceeded", 429),
            ("insufficient_quota", 429),
            ("context_length_exceeded", 400),
            ("invalid_prompt", 400),
            ("vector_store_timeout", 504),
            ("overloaded", 529),
        ]
        .into_iter()
        .map(|(code, status)| (event(code), status, code))
        .collect();
        cases.extend([
            (
                r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}}"#.to_owned(),
                500,
                "server_error",
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#.to_owned(),
                400,
                "invalid_request_error",
            ),
            (r#"{"type":"error","message":"?"}"#.to_owned(), 500, "server_error"),
            // Another API's error type where the code belongs (a translated stream).
            (event("invalid_request_error"), 400, "invalid_request_error"),
            (event("rate_limit_error"), 429, "rate_limit_error"),
            (event("overloaded_error"), 529, "overloaded_error"),
            // A compatible server's numeric status.
            (r#"{"type":"error","code":400,"message":"bad"}"#.to_owned(), 400, "invalid_request_error"),
            (r#"{"type":"response.failed","response":{"error":{"code":429,"message":"x"}}}"#.to_owned(), 429, "rate_limit_exceeded"),
        ]);
        for (data, status, code) in cases {
            let (st, body) = event_response(&data);
            assert_eq!(st.as_u16(), status, "{data}");
            let v: Value = serde_json::from_slice(&body).unwrap_or_default();
            assert_eq!(v["error"]["code"], code, "{data}");
            assert!(v["error"]["message"].is_string(), "{data}");
        }
    }

    #[test]
    fn quota_is_read_from_failed_responses_and_bodies() {
        let failed = br#"{"type":"response.failed","response":{"error":{"code":"insufficient_quota","message":"m"}}}"#;
        let class = |b: &[u8]| {
            read(b).and_then(|f| TABLE.class_of(f.error_type.as_deref(), f.code.as_deref()))
        };
        assert_eq!(class(failed), Some(C::Billing));
        let body = br#"{"error":{"message":"m","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        assert_eq!(class(body), Some(C::Billing));
    }

    #[test]
    fn local_stream_errors_end_with_response_failed() {
        let e = LocalError {
            param: None,
            class: C::Server,
            code: "upstream_stream_error",
            message: "cut",
        };
        let text = String::from_utf8_lossy(&stream_event(e)).into_owned();
        assert!(text.starts_with("event: error\ndata: {"), "{text}");
        assert!(text.contains("event: response.failed\ndata: {"), "{text}");
        assert!(text.ends_with("}\n\n"));
        let v: Value = serde_json::from_slice(&body(e)).unwrap_or_default();
        assert_eq!(v["error"]["code"], "upstream_stream_error");
        assert_eq!(v["error"]["type"], "server_error");
    }
}
