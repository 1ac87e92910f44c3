//! Responses API errors. Whole error bodies are OpenAI's envelope with OpenAI's statuses
//! (wire-protocol F), so the rows are Chat Completions' rows; what is the Responses API's own
//! is its stream: an `error` event `{type:"error", code, message, param, sequence_number}`, or
//! a `response.failed` whose `response.error` is `{code, message}`. Those events carry a code
//! and no error type, so the codes only they use are read here too.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use crate::api::errors::{ErrorClass as C, ErrorFields, ErrorTable, LocalError};
use crate::api::openai_chat::errors as chat;

pub(crate) static TABLE: ErrorTable = ErrorTable {
    rows: chat::ROWS,
    type_aliases: chat::TYPE_ALIASES,
    code_aliases: &[
        ("invalid_authentication", C::Authentication),
        ("unsupported_country_region_territory", C::Permission),
        ("model_not_found", C::NotFound),
        // The codes of failed responses.
        ("invalid_prompt", C::InvalidRequest),
        ("context_length_exceeded", C::InvalidRequest),
        ("vector_store_timeout", C::Timeout),
    ],
    other_4xx: C::InvalidRequest,
    other: C::Server,
};

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

/// An `error` event, then the terminal `response.failed` the SDKs' stream helpers end on (the
/// upstream's sequence is not tracked here: both are numbered past it).
pub(super) fn stream_event(e: LocalError<'_>) -> Bytes {
    let error = json!({
        "type": "error", "code": e.code, "message": e.message, "param": null,
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
    let class = TABLE
        .class_of(f.error_type.as_deref(), f.code.as_deref())
        .unwrap_or(C::Server);
    let row = TABLE.row(class);
    let code = f
        .code
        .or(f.error_type)
        .unwrap_or_else(|| "server_error".into());
    let message = f.message.unwrap_or_else(|| "the upstream failed".into());
    let body = json!({"error": {
        "message": message, "type": row.error_type, "param": null, "code": code,
    }});
    (
        StatusCode::from_u16(row.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Bytes::from(body.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::errors::ALL_CLASSES;

    /// Every row both ways, the rows issue 10 names included: (type, code) → status, and
    /// status → type.
    #[test]
    fn table_rows_both_ways() {
        let rows: [(&str, Option<&str>, u16); 11] = [
            ("invalid_request_error", None, 400),
            ("authentication_error", Some("invalid_api_key"), 401),
            ("insufficient_quota", Some("insufficient_quota"), 429),
            ("permission_error", Some("permission_denied"), 403),
            ("invalid_request_error", Some("not_found"), 404),
            ("invalid_request_error", Some("conflict"), 409),
            ("invalid_request_error", Some("request_too_large"), 413),
            ("rate_limit_error", Some("rate_limit_exceeded"), 429),
            ("server_error", None, 500),
            ("server_error", Some("timeout"), 504),
            ("server_error", Some("overloaded"), 529),
        ];
        for (ty, code, status) in rows {
            assert_eq!(
                TABLE.status_of(Some(ty), code).as_u16(),
                status,
                "{ty} {code:?}"
            );
        }
        for (status, ty) in [
            (400, "invalid_request_error"),
            (402, "insufficient_quota"),
            (408, "server_error"),
            (409, "invalid_request_error"),
            (413, "invalid_request_error"),
            (429, "rate_limit_error"),
            (529, "server_error"),
        ] {
            assert_eq!(TABLE.type_for_status(status), ty, "{status}");
        }
        for class in ALL_CLASSES {
            assert_eq!(TABLE.row(class).class, class);
        }
    }

    /// Stream failures carry only a code: each becomes the status it stands for, the code kept.
    #[test]
    fn error_events_become_responses_by_their_code() {
        let cases = [
            (
                r#"{"type":"error","code":"rate_limit_exceeded","message":"slow"}"#,
                429,
                "rate_limit_exceeded",
            ),
            (
                r#"{"type":"error","code":"insufficient_quota","message":"pay"}"#,
                429,
                "insufficient_quota",
            ),
            (
                r#"{"type":"error","code":"context_length_exceeded","message":"long"}"#,
                400,
                "context_length_exceeded",
            ),
            (
                r#"{"type":"error","code":"vector_store_timeout","message":"t"}"#,
                504,
                "vector_store_timeout",
            ),
            (
                r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}}"#,
                500,
                "server_error",
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
                400,
                "invalid_request_error",
            ),
            (r#"{"type":"error","message":"?"}"#, 500, "server_error"),
        ];
        for (data, status, code) in cases {
            let (st, body) = event_response(data);
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
