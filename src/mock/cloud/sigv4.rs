//! Checks a SigV4 signature the way AWS does: the signature is recomputed with the official
//! signer from the headers the request says it signed, the secret of its access key and the
//! time in `x-amz-date`, and must match exactly.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use http_body_util::Full;

use super::Cloud;
use crate::cloud::aws::{AwsCreds, sign};
use crate::config::Secret;

/// `20261201T153000Z` → the instant.
fn amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (hh, mm, ss) = (n(9..11)?, n(11..13)?, n(13..15)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// `Ok(())` when the request is signed by a valid key; `Err((status, exception, message))`.
pub(super) fn verify(
    cloud: &Cloud,
    parts: &Parts,
    body: &Bytes,
) -> Result<(), (u16, &'static str, String)> {
    let denied = |m: &str| (403, "InvalidSignatureException", m.to_owned());
    let header = |n: &str| parts.headers.get(n).and_then(|v| v.to_str().ok());
    let auth = header("authorization").ok_or_else(|| denied("missing Authorization"))?;
    let rest = auth
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(|| denied("not AWS4-HMAC-SHA256"))?;
    let field = |name: &str| {
        rest.split(',')
            .map(str::trim)
            .find_map(|p| p.strip_prefix(name))
            .map(str::to_owned)
    };
    let credential = field("Credential=").ok_or_else(|| denied("no Credential"))?;
    let signed = field("SignedHeaders=").ok_or_else(|| denied("no SignedHeaders"))?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [key_id, _date, region, service, "aws4_request"] = scope[..] else {
        return Err(denied("malformed credential scope"));
    };
    if service != "bedrock" {
        return Err(denied("credential scope is not for bedrock"));
    }
    let (secret, token) = cloud
        .aws_key(key_id)
        .map_err(|e| (403, e, format!("{e} for this access key")))?;
    if header("x-amz-security-token") != token.as_deref() {
        return Err((
            403,
            "UnrecognizedClientException",
            "session token mismatch".into(),
        ));
    }
    let time = header("x-amz-date")
        .and_then(amz_date)
        .ok_or_else(|| denied("missing or malformed x-amz-date"))?;
    let host = header("host").unwrap_or("");
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("http://{host}{path}"))
        .body(Full::new(body.clone()))
        .map_err(|_| denied("request URI not signable"))?;
    for name in signed.split(';') {
        if matches!(name, "x-amz-date" | "x-amz-security-token") {
            continue; // the signer adds them from its parameters
        }
        if let Some(v) = parts.headers.get(name) {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| denied("bad header"))?,
                v.clone(),
            );
        }
    }
    let creds = AwsCreds {
        access_key_id: Secret::new(key_id.to_owned()),
        secret_access_key: Secret::new(secret),
        session_token: token.map(|t| std::sync::Arc::new(Secret::new(t))),
    };
    sign(&mut req, body, &creds, region, service, time).map_err(|e| denied(&e))?;
    let expected = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if expected != Some(auth) {
        return Err(denied(
            "The request signature we calculated does not match the signature you provided.",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates_parse() {
        let t = amz_date("20300101T000000Z").unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            1_893_456_000
        );
        assert_eq!(
            amz_date("19700101T000001Z"),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
        );
        assert!(amz_date("2030-01-01T00:00:00Z").is_none());
    }
}
