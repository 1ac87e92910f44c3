//! Anthropic errors: the status ↔ `error.type` table of the API's error page (wire-protocol
//! A6), the `{"type":"error","error":{…}}` body, and the `event: error` stream event.

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;

use crate::api::errors::{ErrorClass as C, ErrorFields, ErrorRow, ErrorTable, LocalError};

const fn row(class: C, error_type: &'static str, status: u16, also: &'static [u16]) -> ErrorRow {
    ErrorRow {
        class,
        error_type,
        code: None,
        status,
        also,
    }
}

/// 408 is not on Anthropic's page; it is a timeout, so it carries `timeout_error` (whose own
/// status is 504). 503 carries `overloaded_error`, as Anthropic's edge answers it.
pub(crate) static TABLE: ErrorTable = ErrorTable {
    rows: &[
        row(C::InvalidRequest, "invalid_request_error", 400, &[]),
        row(C::Authentication, "authentication_error", 401, &[]),
        row(C::Billing, "billing_error", 402, &[]),
        row(C::Permission, "permission_error", 403, &[]),
        row(C::NotFound, "not_found_error", 404, &[]),
        row(C::Conflict, "conflict_error", 409, &[]),
        row(C::TooLarge, "request_too_large", 413, &[]),
        row(C::RateLimited, "rate_limit_error", 429, &[]),
        row(C::Server, "api_error", 500, &[]),
        row(C::Timeout, "timeout_error", 504, &[408]),
        row(C::Overloaded, "overloaded_error", 529, &[503]),
    ],
    type_aliases: &[],
    // A 429 for a spend cap (`error.details.error_code`) is a billing matter, not a rate.
    code_aliases: &[("enforced_spend_limit_reached", C::Billing)],
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
    message: Option<String>,
    details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    error_code: Option<String>,
}

/// `error.type`, `error.message` and `error.details.error_code` (as the code).
pub(crate) fn read(body: &[u8]) -> Option<ErrorFields> {
    let e = serde_json::from_slice::<Envelope>(body).ok()?.error?;
    Some(ErrorFields {
        error_type: e.kind,
        code: e.details.and_then(|d| d.error_code),
        message: e.message,
    })
}

fn detail(e: LocalError<'_>) -> serde_json::Value {
    serde_json::json!({"type": TABLE.row(e.class).error_type, "message": e.message})
}

pub(crate) fn body(e: LocalError<'_>, request_id: &str) -> Bytes {
    // A refusal made before any request existed (a head legate could not read) has no id.
    let v = if request_id.is_empty() {
        serde_json::json!({"type": "error", "error": detail(e)})
    } else {
        serde_json::json!({"type": "error", "error": detail(e), "request_id": request_id})
    };
    Bytes::from(v.to_string())
}

pub(crate) fn stream_event(e: LocalError<'_>) -> Bytes {
    let data = serde_json::json!({"type": "error", "error": detail(e)});
    Bytes::from(format!("event: error\ndata: {data}\n\n"))
}

/// The event's data is already an error body (`{"type":"error","error":{…}}`); one without
/// the outer `type` gets it.
pub(crate) fn event_response(data: &str) -> (StatusCode, Bytes) {
    let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
    let status = TABLE.status_of(v["error"]["type"].as_str(), None);
    let body = if v.get("type").is_some() {
        data.to_string()
    } else {
        serde_json::json!({"type": "error", "error": v["error"]}).to_string()
    };
    (status, Bytes::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::errors::ALL_CLASSES;

    /// wire-protocol A6, row by row: status → type, and type → status.
    #[test]
    fn table_agrees_with_the_documented_rows() {
        let rows: [(u16, &str, u16); 14] = [
            (400, "invalid_request_error", 400),
            (401, "authentication_error", 401),
            (402, "billing_error", 402),
            (403, "permission_error", 403),
            (404, "not_found_error", 404),
            (408, "timeout_error", 504),
            (409, "conflict_error", 409),
            (413, "request_too_large", 413),
            (422, "invalid_request_error", 400),
            (429, "rate_limit_error", 429),
            (500, "api_error", 500),
            (503, "overloaded_error", 529),
            (504, "timeout_error", 504),
            (529, "overloaded_error", 529),
        ];
        for (status, ty, back) in rows {
            assert_eq!(TABLE.type_for_status(status), ty, "{status}");
            assert_eq!(TABLE.status_of(Some(ty), None).as_u16(), back, "{ty}");
        }
        assert_eq!(TABLE.type_for_status(502), "api_error");
        assert_eq!(TABLE.status_of(Some("future_error"), None).as_u16(), 500);
        assert_eq!(TABLE.status_of(None, None).as_u16(), 500);
    }

    #[test]
    fn every_class_has_its_own_row() {
        for class in ALL_CLASSES {
            assert_eq!(TABLE.row(class).class, class);
        }
    }

    #[test]
    fn spend_cap_reads_as_billing() {
        let body = br#"{"type":"error","error":{"type":"rate_limit_error","message":"m","details":{"error_code":"enforced_spend_limit_reached"}}}"#;
        let f = read(body).unwrap_or_default();
        assert_eq!(
            TABLE.class_of(f.error_type.as_deref(), f.code.as_deref()),
            Some(C::Billing)
        );
    }

    #[test]
    fn error_events_become_responses_with_their_status() {
        let (st, b) = event_response(
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert_eq!(st.as_u16(), 529);
        assert_eq!(
            b,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
        );
        let (st, b) = event_response(r#"{"error":{"type":"billing_error","message":"m"}}"#);
        assert_eq!(st.as_u16(), 402);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({"type":"error","error":{"type":"billing_error","message":"m"}})
        );
        assert_eq!(event_response("not json").0.as_u16(), 500);
    }

    #[test]
    fn local_errors_render_by_class() {
        let e = LocalError {
            param: None,
            class: C::Overloaded,
            code: "overloaded",
            message: "busy",
        };
        let v: serde_json::Value = serde_json::from_slice(&body(e, "lgt_1")).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({"type":"error","error":{"type":"overloaded_error","message":"busy"},"request_id":"lgt_1"})
        );
        let ev = stream_event(LocalError {
            param: None,
            class: C::Server,
            ..e
        });
        let text = std::str::from_utf8(&ev).unwrap_or_default();
        let data = text
            .strip_prefix("event: error\ndata: ")
            .and_then(|d| d.strip_suffix("\n\n"))
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({"type":"error","error":{"type":"api_error","message":"busy"}})
        );
    }
}
