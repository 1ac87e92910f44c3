//! Platform error answers in the caller's shape. Bedrock names its error in
//! `x-amzn-ErrorType` over a bare `{"message"}`; Vertex may answer in Google's
//! `{"error":{"code","message","status"}}`. Both become an Anthropic error with the status whose
//! retry and fallback meaning matches (Bedrock's 503 and Google's `UNAVAILABLE` are an
//! overloaded model: 529). Azure OpenAI already answers in OpenAI's shape.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::eventstream::exception_meaning;

fn anthropic(status: u16, kind: &str, message: &str) -> (StatusCode, Bytes) {
    let body = serde_json::json!({"type": "error", "error": {"type": kind, "message": message}});
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        Bytes::from(body.to_string()),
    )
}

/// The Anthropic error type a bare status stands for.
fn by_status(status: u16) -> (u16, &'static str) {
    match status {
        400 | 422 => (400, "invalid_request_error"),
        401 => (401, "authentication_error"),
        403 => (403, "permission_error"),
        404 => (404, "not_found_error"),
        408 | 504 => (504, "timeout_error"),
        413 => (413, "request_too_large"),
        429 => (429, "rate_limit_error"),
        503 | 529 => (529, "overloaded_error"),
        _ => (status.max(500), "api_error"),
    }
}

/// A Bedrock error answer as an Anthropic error.
pub fn bedrock(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> (StatusCode, Bytes) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let message = v["message"]
        .as_str()
        .or_else(|| v["Message"].as_str())
        .unwrap_or("");
    let error_type = headers
        .get("x-amzn-errortype")
        .and_then(|h| h.to_str().ok())
        .map(|t| t.split(':').next().unwrap_or(t).to_owned())
        .or_else(|| {
            v["__type"]
                .as_str()
                .map(|t| t.rsplit('#').next().unwrap_or(t).to_owned())
        });
    let (st, kind) = match error_type.as_deref() {
        // The status says more than a generic exception name.
        Some(t) if !matches!(exception_meaning(t).0, "api_error") => {
            let (kind, st) = exception_meaning(t);
            (st, kind)
        }
        // A model error (424) is the provider failing.
        _ if status.as_u16() == 424 => (500, "api_error"),
        _ => {
            let (st, kind) = by_status(status.as_u16());
            (st, kind)
        }
    };
    let label = error_type.unwrap_or_else(|| status.as_u16().to_string());
    let text = if message.is_empty() {
        format!("Bedrock {label}")
    } else {
        format!("Bedrock {label}: {message}")
    };
    anthropic(st, kind, &text)
}

/// A Vertex error answer as an Anthropic error: passed as it is when already Anthropic's.
pub fn vertex(status: StatusCode, body: &[u8]) -> (StatusCode, Bytes) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if v["type"] == "error" {
        return (status, Bytes::copy_from_slice(body));
    }
    // Google sometimes wraps the error in a one-element array.
    let e = if v.is_array() {
        &v[0]["error"]
    } else {
        &v["error"]
    };
    let google_status = e["status"].as_str().unwrap_or("");
    let message = e["message"].as_str().unwrap_or("");
    let (st, kind) = match google_status {
        "RESOURCE_EXHAUSTED" => (429, "rate_limit_error"),
        "UNAVAILABLE" => (529, "overloaded_error"),
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => {
            (400, "invalid_request_error")
        }
        "UNAUTHENTICATED" => (401, "authentication_error"),
        "PERMISSION_DENIED" => (403, "permission_error"),
        "NOT_FOUND" => (404, "not_found_error"),
        "DEADLINE_EXCEEDED" => (504, "timeout_error"),
        _ => by_status(status.as_u16()),
    };
    let label = if google_status.is_empty() {
        status.as_u16().to_string()
    } else {
        google_status.to_owned()
    };
    let text = if message.is_empty() {
        format!("Vertex AI {label}")
    } else {
        format!("Vertex AI {label}: {message}")
    };
    anthropic(st, kind, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(b: &Bytes) -> serde_json::Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn bedrock_errors_keep_their_retry_meaning() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-amzn-errortype",
            "ThrottlingException:http://internal.amazon.com/"
                .parse()
                .unwrap(),
        );
        let (st, b) = bedrock(
            StatusCode::TOO_MANY_REQUESTS,
            &h,
            br#"{"message":"Too many requests"}"#,
        );
        assert_eq!(st, 429);
        assert_eq!(json(&b)["error"]["type"], "rate_limit_error");
        assert_eq!(
            json(&b)["error"]["message"],
            "Bedrock ThrottlingException: Too many requests"
        );

        h.insert(
            "x-amzn-errortype",
            "ServiceUnavailableException".parse().unwrap(),
        );
        assert_eq!(bedrock(StatusCode::SERVICE_UNAVAILABLE, &h, b"{}").0, 529);
        h.insert("x-amzn-errortype", "ValidationException".parse().unwrap());
        assert_eq!(bedrock(StatusCode::BAD_REQUEST, &h, b"{}").0, 400);
        let (st, b) = bedrock(StatusCode::from_u16(424).unwrap(), &HeaderMap::new(), b"{}");
        assert_eq!(
            (st.as_u16(), json(&b)["error"]["type"].as_str()),
            (500, Some("api_error"))
        );
    }

    #[test]
    fn vertex_google_shape_becomes_anthropic() {
        let (st, b) = vertex(
            StatusCode::TOO_MANY_REQUESTS,
            br#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED"}}"#,
        );
        assert_eq!(st, 429);
        assert_eq!(json(&b)["error"]["type"], "rate_limit_error");
        let native =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let (st, b) = vertex(StatusCode::from_u16(529).unwrap(), native);
        assert_eq!((st.as_u16(), &b[..]), (529, &native[..]));
    }
}
