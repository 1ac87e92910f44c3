//! Upstream errors in the caller's shape. The HTTP status is kept (the SDKs pick their
//! exception and retry behaviour from it); the error type is mapped by type and code, never
//! by message text, with the status as the fallback.

use super::{anthropic as an, openai as oa};
use crate::api::{ApiKind, ErrorClass, ErrorTable};

/// Upstream OpenAI-shaped error → Anthropic error body.
pub(super) fn to_anthropic(status: u16, upstream_body: &[u8]) -> (u16, Vec<u8>) {
    let detail = parse_openai(upstream_body);
    let (kind, message) = match detail {
        Some(detail) => (anthropic_type(&detail, Some(status)), detail.message),
        None => (status_type(status), loose_message(upstream_body)),
    };
    (
        status,
        anthropic_body(kind, &fallback_message(message, status)),
    )
}

/// Upstream Anthropic-shaped error → OpenAI error body.
pub(super) fn to_openai(status: u16, upstream_body: &[u8]) -> (u16, Vec<u8>) {
    let (kind, message) = match serde_json::from_slice::<an::ErrorBody>(upstream_body) {
        Ok(body) => (body.error.kind, body.error.message),
        Err(_) => (status_type(status).to_owned(), loose_message(upstream_body)),
    };
    (
        status,
        openai_body(&kind, &fallback_message(message, status)),
    )
}

fn fallback_message(message: String, status: u16) -> String {
    if message.is_empty() {
        // Not the upstream body itself: it may be an HTML page from a load balancer.
        format!("the upstream provider answered HTTP {status} without a readable error")
    } else {
        message
    }
}

/// The longest message taken from an error body of no known shape.
const LOOSE_LIMIT: usize = 1024;

/// The message of an error body in neither API's shape, as compatible servers send them:
/// `{"error": "…"}` (Ollama), `{"detail": "…"}` or FastAPI's `{"detail": [{"msg": …}]}`
/// (vLLM and other Python servers), `{"message": "…"}`, or a short line of plain text — not
/// an HTML page, which a load balancer's error is. Empty when none is found; cut at
/// [`LOOSE_LIMIT`] bytes.
fn loose_message(body: &[u8]) -> String {
    use serde_json::Value;
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            let as_text = |v: &Value| v.as_str().map(str::to_owned);
            let details = || {
                let msgs: Vec<&str> = v
                    .get("detail")?
                    .as_array()?
                    .iter()
                    .filter_map(|d| d.get("msg").and_then(Value::as_str))
                    .collect();
                (!msgs.is_empty()).then(|| msgs.join("; "))
            };
            v.get("error")
                .and_then(as_text)
                .or_else(|| v.get("detail").and_then(as_text))
                .or_else(details)
                .or_else(|| v.get("message").and_then(as_text))
                .unwrap_or_default()
        }
        Err(_) => match std::str::from_utf8(body).map(str::trim) {
            Ok(t) if !t.starts_with('<') && !t.contains('\n') => t.to_owned(),
            _ => String::new(),
        },
    };
    let text = text.trim();
    if text.len() <= LOOSE_LIMIT {
        return text.to_owned();
    }
    let mut end = LOOSE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    // Cut between words: a key the upstream echoed is redacted whole later, and a cut through
    // one would leave a part the redactor cannot recognise. A first kilobyte without a space
    // is not a message to cut.
    match text[..end].rfind(char::is_whitespace) {
        Some(space) => format!("{}…", text[..space].trim_end()),
        None => String::new(),
    }
}

/// `{"error":{…}}`, or the error object at the top level as some compatible servers send it.
pub(super) fn parse_openai(body: &[u8]) -> Option<oa::ErrorDetail> {
    if let Ok(body) = serde_json::from_slice::<oa::ErrorBody>(body) {
        return Some(body.error);
    }
    serde_json::from_slice::<oa::ErrorDetail>(body)
        .ok()
        .filter(|d| !d.message.is_empty())
}

fn anthropic_table() -> &'static ErrorTable {
    ApiKind::Anthropic.dialect().errors()
}

fn openai_table() -> &'static ErrorTable {
    ApiKind::OpenAi.dialect().errors()
}

/// The Anthropic error type for an OpenAI error: what its code or type means (the OpenAI
/// table), else the HTTP status (or, in a stream, a numeric `code` holding one) by Anthropic's
/// table.
pub(super) fn anthropic_type(detail: &oa::ErrorDetail, status: Option<u16>) -> &'static str {
    let code = detail.code.as_ref().and_then(|c| c.as_str());
    let class = openai_table().class_of(detail.kind.as_deref(), code);
    let numeric_code = || {
        detail
            .code
            .as_ref()
            .and_then(serde_json::Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
    };
    let class = class.unwrap_or_else(|| {
        status
            .or_else(numeric_code)
            .map_or(ErrorClass::Server, |s| {
                anthropic_table().class_for_status(s)
            })
    });
    anthropic_table().row(class).error_type
}

/// Anthropic's error type for an HTTP status (its documented table).
pub(super) fn status_type(status: u16) -> &'static str {
    anthropic_table().type_for_status(status)
}

/// The OpenAI `(type, code)` for an Anthropic error type, through what it means. Codes make
/// every known type recoverable on the way back; an unknown type passes as the OpenAI type.
pub(super) fn openai_type(anthropic_type: &str) -> (String, Option<&'static str>) {
    match anthropic_table().class_of(Some(anthropic_type), None) {
        Some(class) => {
            let row = openai_table().row(class);
            (row.error_type.to_owned(), row.code)
        }
        None => (anthropic_type.to_owned(), None),
    }
}

pub(super) fn anthropic_detail(kind: &str, message: &str) -> an::ErrorDetail {
    an::ErrorDetail {
        kind: kind.to_owned(),
        message: message.to_owned(),
    }
}

pub(super) fn openai_detail(anthropic_kind: &str, message: &str) -> oa::ErrorDetail {
    let (kind, code) = openai_type(anthropic_kind);
    oa::ErrorDetail {
        message: message.to_owned(),
        kind: Some(kind),
        param: None,
        code: code.map(|c| serde_json::Value::String(c.to_owned())),
    }
}

fn anthropic_body(kind: &str, message: &str) -> Vec<u8> {
    let body = an::ErrorBody {
        kind: "error".to_owned(),
        error: anthropic_detail(kind, message),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

fn openai_body(anthropic_kind: &str, message: &str) -> Vec<u8> {
    let body = oa::ErrorBody {
        error: openai_detail(anthropic_kind, message),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap_or(Value::Null)
    }

    #[test]
    fn error_bodies_of_compatible_servers_keep_their_message() {
        let message = |out: &[u8]| parse(out)["error"]["message"].as_str().map(str::to_owned);
        for (body, want) in [
            (
                r#"{"error":"model 'llama9' not found"}"#,
                "model 'llama9' not found",
            ),
            (r#"{"detail":"Not Found"}"#, "Not Found"),
            (
                r#"{"detail":[{"loc":["body","messages"],"msg":"field required"},{"msg":"bad"}]}"#,
                "field required; bad",
            ),
            (
                r#"{"object":"error","message":"too long","code":400}"#,
                "too long",
            ),
            ("upstream connect error", "upstream connect error"),
        ] {
            let (status, out) = to_anthropic(400, body.as_bytes());
            assert_eq!(status, 400);
            assert_eq!(message(&out).as_deref(), Some(want), "{body}");
            let (_, out) = to_openai(400, body.as_bytes());
            assert_eq!(message(&out).as_deref(), Some(want), "{body}");
        }
        // An HTML page is not a message; a long one is cut.
        let (_, out) = to_anthropic(502, b"<html><body>Bad Gateway</body></html>");
        assert!(message(&out).is_some_and(|m| m.contains("without a readable error")));
        let long = format!(r#"{{"error":"{}"}}"#, "é ".repeat(1000));
        let (_, out) = to_anthropic(500, long.as_bytes());
        assert!(message(&out).is_some_and(|m| m.len() <= LOOSE_LIMIT + 3 && m.ends_with("é…")));
        // Never cut through a word (a key the upstream echoed is redacted whole, later).
        let key = "sk-".to_owned() + &"a".repeat(60);
        let long = format!(r#"{{"error":"{} {key} more"}}"#, "x".repeat(1000));
        let (_, out) = to_anthropic(500, long.as_bytes());
        assert!(message(&out).is_some_and(|m| !m.contains("sk-")), "{out:?}");
        let (_, out) = to_anthropic(
            500,
            format!(r#"{{"error":"{}"}}"#, "k".repeat(2000)).as_bytes(),
        );
        assert!(message(&out).is_some_and(|m| m.contains("without a readable error")));
    }

    #[test]
    fn openai_rate_limit_becomes_anthropic_rate_limit_error() {
        let body = json!({"error": {"message": "Rate limit reached", "type": "requests",
                                    "param": null, "code": "rate_limit_exceeded"}});
        let (status, out) = to_anthropic(429, body.to_string().as_bytes());
        assert_eq!(status, 429);
        assert_eq!(
            parse(&out),
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached"}})
        );
    }

    #[test]
    fn anthropic_overload_becomes_openai_server_error() {
        let body = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
                          "request_id": "req_1"});
        let (status, out) = to_openai(529, body.to_string().as_bytes());
        assert_eq!(status, 529);
        assert_eq!(
            parse(&out),
            json!({"error": {"message": "Overloaded", "type": "server_error", "param": null, "code": "overloaded"}})
        );
    }

    #[test]
    fn openai_codes_and_types_map_before_the_status() {
        let cases = [
            (
                json!({"type": "invalid_request_error", "code": "invalid_api_key"}),
                401,
                "authentication_error",
            ),
            (
                json!({"type": "insufficient_quota", "code": "insufficient_quota"}),
                429,
                "billing_error",
            ),
            (
                json!({"type": "invalid_request_error", "code": "model_not_found"}),
                404,
                "not_found_error",
            ),
            (
                json!({"type": "invalid_request_error", "code": null}),
                400,
                "invalid_request_error",
            ),
            (
                json!({"type": "server_error", "code": null}),
                500,
                "api_error",
            ),
            (
                json!({"type": "BadRequestError", "code": 400}),
                400,
                "invalid_request_error",
            ),
            (
                json!({"type": "ServiceUnavailableError", "code": 503}),
                503,
                "overloaded_error",
            ),
        ];
        for (detail, status, want) in cases {
            let detail: oa::ErrorDetail =
                serde_json::from_value(detail).unwrap_or(oa::ErrorDetail {
                    message: String::new(),
                    kind: None,
                    param: None,
                    code: None,
                });
            assert_eq!(anthropic_type(&detail, Some(status)), want, "{detail:?}");
        }
    }

    #[test]
    fn a_numeric_code_stands_in_for_the_status_in_a_stream() {
        let detail: Option<oa::ErrorDetail> = serde_json::from_value(
            json!({"message": "x", "type": "InternalServerError", "code": 529}),
        )
        .ok();
        assert_eq!(
            detail.map(|d| anthropic_type(&d, None)),
            Some("overloaded_error")
        );
    }

    #[test]
    fn every_anthropic_type_survives_the_way_to_openai_and_back() {
        for (kind, status) in [
            ("invalid_request_error", 400),
            ("authentication_error", 401),
            ("billing_error", 402),
            ("permission_error", 403),
            ("not_found_error", 404),
            ("conflict_error", 409),
            ("request_too_large", 413),
            ("rate_limit_error", 429),
            ("api_error", 500),
            ("timeout_error", 504),
            ("overloaded_error", 529),
        ] {
            for any_status in [status, 400, 500] {
                let detail = openai_detail(kind, "m");
                assert_eq!(anthropic_type(&detail, Some(any_status)), kind);
            }
        }
    }

    #[test]
    fn top_level_error_objects_and_html_are_understood() {
        let vllm = json!({"object": "error", "message": "bad", "type": "BadRequestError", "param": null, "code": 400});
        let (_, out) = to_anthropic(400, vllm.to_string().as_bytes());
        assert_eq!(parse(&out)["error"]["type"], "invalid_request_error");
        assert_eq!(parse(&out)["error"]["message"], "bad");
        let (status, out) = to_anthropic(502, b"<html>bad gateway</html>");
        assert_eq!(status, 502);
        assert_eq!(parse(&out)["error"]["type"], "api_error");
        let (status, out) = to_openai(503, b"");
        assert_eq!(status, 503);
        assert_eq!(parse(&out)["error"]["type"], "server_error");
        assert_eq!(parse(&out)["error"]["code"], "overloaded");
    }
}
