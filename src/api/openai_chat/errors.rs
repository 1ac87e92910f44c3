//! OpenAI errors: `{"error":{"message","type","param","code"}}` (wire-protocol B4). The API
//! tells failures apart mostly by `code` under a few `type`s, so each row has both; the
//! status of a row is what the API (or, for 529, legate itself) answers with.

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;

use crate::api::errors::{ErrorClass as C, ErrorFields, ErrorRow, ErrorTable, LocalError};

const fn row(
    class: C,
    error_type: &'static str,
    code: Option<&'static str>,
    status: u16,
    also: &'static [u16],
) -> ErrorRow {
    ErrorRow {
        class,
        error_type,
        code,
        status,
        also,
    }
}

/// Rate limits come before quota: both are 429, and a 429 without a body is a rate limit.
/// The Responses API's table too: its errors are OpenAI's, with the same statuses.
#[rustfmt::skip]
const ROWS: &[ErrorRow] = &[
    row(C::InvalidRequest, "invalid_request_error", None, 400, &[]),
    row(C::Authentication, "authentication_error", Some("invalid_api_key"), 401, &[]),
    row(C::RateLimited, "rate_limit_error", Some("rate_limit_exceeded"), 429, &[]),
    row(C::Billing, "insufficient_quota", Some("insufficient_quota"), 429, &[402]),
    row(C::Permission, "permission_error", Some("permission_denied"), 403, &[]),
    row(C::NotFound, "invalid_request_error", Some("not_found"), 404, &[]),
    row(C::Conflict, "invalid_request_error", Some("conflict"), 409, &[]),
    row(C::TooLarge, "invalid_request_error", Some("request_too_large"), 413, &[]),
    row(C::Server, "server_error", None, 500, &[]),
    row(C::Timeout, "server_error", Some("timeout"), 504, &[408]),
    row(C::Overloaded, "server_error", Some("overloaded"), 529, &[503]),
];

/// OpenAI's own rate-limit types, and the Anthropic names that OpenAI-compatible servers in
/// front of Anthropic models (and `legate mock`) put in an OpenAI-shaped error.
const TYPE_ALIASES: &[(&str, C)] = &[
    ("requests", C::RateLimited),
    ("tokens", C::RateLimited),
    ("rate_limit_exceeded", C::RateLimited),
    ("billing_error", C::Billing),
    ("request_forbidden", C::Permission),
    ("not_found_error", C::NotFound),
    ("conflict_error", C::Conflict),
    ("api_error", C::Server),
    ("timeout_error", C::Timeout),
    ("overloaded_error", C::Overloaded),
];

pub(crate) static TABLE: ErrorTable = ErrorTable {
    rows: ROWS,
    type_aliases: TYPE_ALIASES,
    code_aliases: &[
        ("invalid_authentication", C::Authentication),
        ("unsupported_country_region_territory", C::Permission),
        ("model_not_found", C::NotFound),
        // The codes of failed Responses API responses (its stream events carry no type).
        ("invalid_prompt", C::InvalidRequest),
        ("context_length_exceeded", C::InvalidRequest),
        ("vector_store_timeout", C::Timeout),
    ],
    other_4xx: C::InvalidRequest,
    other: C::Server,
};

#[derive(Deserialize)]
struct Envelope {
    error: Option<Detail>,
}

#[derive(Deserialize)]
struct Detail {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
    message: Option<String>,
}

impl Detail {
    fn fields(self) -> ErrorFields {
        ErrorFields {
            error_type: self.kind,
            // Some compatible servers put the HTTP status in `code` as a number.
            code: self.code.and_then(|c| c.as_str().map(str::to_owned)),
            message: self.message,
        }
    }
}

/// `{"error":{…}}`, or the error object at the top level as some compatible servers send it.
pub(crate) fn read(body: &[u8]) -> Option<ErrorFields> {
    if let Ok(Envelope { error: Some(e) }) = serde_json::from_slice(body) {
        return Some(e.fields());
    }
    serde_json::from_slice::<Detail>(body)
        .ok()
        .filter(|d| d.message.as_deref().is_some_and(|m| !m.is_empty()))
        .map(Detail::fields)
}

/// legate's own error in the OpenAI envelope.
pub(crate) fn value(e: LocalError<'_>) -> serde_json::Value {
    serde_json::json!({"error": {
        "message": e.message,
        "type": TABLE.row(e.class).error_type,
        "param": e.param,
        "code": e.code,
    }})
}

pub(crate) fn body(e: LocalError<'_>) -> Bytes {
    Bytes::from(value(e).to_string())
}

/// The SDKs raise a `data:` object with a truthy `error` as an API error.
pub(crate) fn stream_event(e: LocalError<'_>) -> Bytes {
    Bytes::from(format!("data: {}\n\n", value(e)))
}

pub(crate) fn event_response(data: &str) -> (StatusCode, Bytes) {
    let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
    // The error object, or the event itself as some compatible servers send it (vLLM).
    let error = if v["error"].is_null() && v["object"] == "error" {
        &v
    } else {
        &v["error"]
    };
    let class = TABLE
        .class_of(error["type"].as_str(), error["code"].as_str())
        .or_else(|| numeric_status(&error["code"]).map(|s| TABLE.class_for_status(s)))
        .unwrap_or(C::Server);
    let status =
        StatusCode::from_u16(TABLE.row(class).status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({"error": error}).to_string();
    (status, Bytes::from(body))
}

/// An error `code` that is an HTTP status, as compatible servers (vLLM) send it with a type of
/// their own (`BadRequestError`): the status it names, when it is an error status.
pub(crate) fn numeric_status(code: &serde_json::Value) -> Option<u16> {
    code.as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::errors::ALL_CLASSES;

    /// Every row both ways: (type, code) → status, status → type.
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
            (401, "authentication_error"),
            (402, "insufficient_quota"),
            (403, "permission_error"),
            (404, "invalid_request_error"),
            (408, "server_error"),
            (409, "invalid_request_error"),
            (413, "invalid_request_error"),
            (429, "rate_limit_error"),
            (500, "server_error"),
            (503, "server_error"),
            (529, "server_error"),
        ] {
            assert_eq!(TABLE.type_for_status(status), ty, "{status}");
        }
        assert_eq!(TABLE.class_for_status(402), C::Billing);
        assert_eq!(TABLE.class_for_status(408), C::Timeout);
        assert_eq!(TABLE.class_for_status(503), C::Overloaded);
    }

    #[test]
    fn codes_win_over_types_and_aliases_are_read() {
        assert_eq!(
            TABLE.class_of(Some("requests"), Some("rate_limit_exceeded")),
            Some(C::RateLimited)
        );
        assert_eq!(TABLE.class_of(Some("tokens"), None), Some(C::RateLimited));
        assert_eq!(
            TABLE.class_of(Some("invalid_request_error"), Some("model_not_found")),
            Some(C::NotFound)
        );
        assert_eq!(
            TABLE.class_of(Some("overloaded_error"), None),
            Some(C::Overloaded)
        );
        assert_eq!(TABLE.class_of(Some("BadRequestError"), None), None);
    }

    #[test]
    fn every_class_has_its_own_row() {
        for class in ALL_CLASSES {
            assert_eq!(TABLE.row(class).class, class);
        }
    }

    #[test]
    fn error_bodies_are_read_enveloped_or_bare() {
        let f = read(br#"{"error":{"message":"m","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#);
        assert_eq!(
            f.and_then(|f| f.code).as_deref(),
            Some("insufficient_quota")
        );
        let vllm = read(br#"{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}"#);
        assert_eq!(
            vllm,
            Some(ErrorFields {
                error_type: Some("BadRequestError".into()),
                code: None,
                message: Some("bad".into()),
            })
        );
        assert_eq!(read(b"<html>"), None);
    }

    #[test]
    fn error_events_become_responses_with_their_status() {
        let (st, b) = event_response(
            r#"{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(st.as_u16(), 429);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
        assert_eq!(v["error"]["message"], "slow down");
        let (st, _) =
            event_response(r#"{"error":{"message":"x","type":"server_error","code":null}}"#);
        assert_eq!(st.as_u16(), 500);
        // vLLM's: a type of its own, the status as a numeric code.
        for vllm in [
            r#"{"error":{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}}"#,
            r#"{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}"#,
        ] {
            let (st, b) = event_response(vllm);
            assert_eq!(st.as_u16(), 400, "{vllm}");
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
            assert_eq!(v["error"]["message"], "bad");
        }
    }

    #[test]
    fn local_errors_keep_their_code() {
        let e = LocalError {
            param: None,
            class: C::RateLimited,
            code: "rate_limit_exceeded",
            message: "wait",
        };
        let v: serde_json::Value = serde_json::from_slice(&body(e)).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({"error":{"message":"wait","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}})
        );
        let ev = stream_event(e);
        assert!(ev.starts_with(b"data: {") && ev.ends_with(b"}\n\n"));
    }
}
