//! The fake credential endpoints: STS, the container endpoint, the EC2 instance metadata
//! service (IMDSv2), the GCE metadata server, Google's token endpoint and Entra ID. Each checks what the real one requires of the caller
//! and issues fresh, expiring credentials.

use std::collections::HashMap;
use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::request::Parts;
use http::{Method, Response, StatusCode};

use super::{Cloud, simple};
use crate::mock::body::MockBody;

/// Where the instance metadata service lists the instance's role, and that role.
const IMDS_ROLES: &str = "/latest/meta-data/iam/security-credentials/";
const IMDS_ROLE: &str = "legate-instance-role";

fn form(body: &Bytes) -> HashMap<String, String> {
    form_urlencoded::parse(body).into_owned().collect()
}

fn iso8601(t: SystemTime) -> String {
    aws_smithy_types::DateTime::from(t)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .unwrap_or_default()
}

fn oauth(cloud: &Cloud, prefix: &str) -> Response<MockBody> {
    let (token, _) = cloud.issue_token(prefix);
    let body = serde_json::json!({
        "access_token": token,
        "expires_in": cloud.opts.credential_ttl.as_secs(),
        "token_type": "Bearer",
    });
    simple(StatusCode::OK, "application/json", body.to_string())
}

fn refused(cloud: &Cloud, status: StatusCode, error: &str) -> Response<MockBody> {
    cloud.count("refused");
    let body = serde_json::json!({"error": error});
    simple(status, "application/json", body.to_string())
}

pub(super) fn answer(cloud: &Cloud, parts: &Parts, body: &Bytes) -> Option<Response<MockBody>> {
    let path = parts.uri.path();
    let header = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let resp = match (&parts.method, path) {
        (&Method::POST, "/sts" | "/sts/") => {
            let f = form(body);
            let ok = f.get("Action").map(String::as_str) == Some("AssumeRoleWithWebIdentity")
                && f.get("RoleArn").is_some_and(|r| r.starts_with("arn:"))
                && f.get("WebIdentityToken").is_some_and(|t| !t.is_empty());
            if !ok {
                cloud.count("refused");
                let xml = "<ErrorResponse><Error><Code>InvalidIdentityToken</Code></Error></ErrorResponse>";
                return Some(simple(StatusCode::BAD_REQUEST, "text/xml", xml));
            }
            cloud.count("sts");
            let (id, secret, token, exp) = cloud.issue_aws();
            let xml = format!(
                "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
                 <AssumeRoleWithWebIdentityResult><Credentials>\
                 <AccessKeyId>{id}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey>\
                 <SessionToken>{token}</SessionToken><Expiration>{}</Expiration>\
                 </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>",
                iso8601(exp)
            );
            simple(StatusCode::OK, "text/xml", xml)
        }
        (&Method::GET, "/aws/credentials") => {
            if header("authorization").is_empty() {
                return Some(refused(
                    cloud,
                    StatusCode::UNAUTHORIZED,
                    "missing authorization",
                ));
            }
            cloud.count("container");
            let (id, secret, token, exp) = cloud.issue_aws();
            let body = serde_json::json!({
                "AccessKeyId": id, "SecretAccessKey": secret, "Token": token,
                "Expiration": iso8601(exp), "AccountId": "123456789012",
            });
            simple(StatusCode::OK, "application/json", body.to_string())
        }
        (&Method::PUT, "/latest/api/token") => {
            let ttl = header("x-aws-ec2-metadata-token-ttl-seconds").parse::<u32>();
            if !ttl.is_ok_and(|t| (1..=21600).contains(&t)) {
                return Some(refused(cloud, StatusCode::BAD_REQUEST, "bad token TTL"));
            }
            cloud.count("imds_token");
            let (token, _) = cloud.issue_token("imds-");
            simple(StatusCode::OK, "text/plain", token)
        }
        (&Method::GET, p) if p.starts_with(IMDS_ROLES) => {
            // IMDSv2 only, as hardened instances answer: a read without a session token is
            // refused.
            if cloud
                .check_token(header("x-aws-ec2-metadata-token"))
                .is_err()
            {
                return Some(refused(cloud, StatusCode::UNAUTHORIZED, "no session token"));
            }
            match &p[IMDS_ROLES.len()..] {
                "" => simple(StatusCode::OK, "text/plain", IMDS_ROLE),
                IMDS_ROLE => {
                    cloud.count("imds");
                    let (id, secret, token, exp) = cloud.issue_aws();
                    let body = serde_json::json!({
                        "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": id,
                        "SecretAccessKey": secret, "Token": token, "Expiration": iso8601(exp),
                    });
                    simple(StatusCode::OK, "application/json", body.to_string())
                }
                _ => simple(StatusCode::NOT_FOUND, "text/plain", "not found"),
            }
        }
        (&Method::GET, "/computeMetadata/v1/instance/service-accounts/default/token") => {
            if header("metadata-flavor") != "Google" {
                return Some(refused(
                    cloud,
                    StatusCode::FORBIDDEN,
                    "missing Metadata-Flavor: Google",
                ));
            }
            cloud.count("metadata");
            oauth(cloud, "ya29.metadata-")
        }
        (&Method::POST, "/google/token") => {
            let f = form(body);
            let ok = match f.get("grant_type").map(String::as_str) {
                Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => {
                    f.get("assertion").is_some_and(|a| jwt_claims_ok(a))
                }
                Some("urn:ietf:params:oauth:grant-type:token-exchange") => {
                    f.get("subject_token").is_some_and(|t| !t.is_empty())
                        && f.get("scope").is_some_and(|s| s.contains("cloud-platform"))
                }
                _ => false,
            };
            if !ok {
                return Some(refused(cloud, StatusCode::BAD_REQUEST, "invalid_grant"));
            }
            cloud.count("google_token");
            oauth(cloud, "ya29.sa-")
        }
        (&Method::POST, p) if p.ends_with("/oauth2/v2.0/token") => {
            let f = form(body);
            let ok = f.get("grant_type").map(String::as_str) == Some("client_credentials")
                && f.get("client_id").is_some_and(|c| !c.is_empty())
                && f.get("client_assertion").is_some_and(|a| !a.is_empty())
                && f.get("scope").map(String::as_str)
                    == Some("https://cognitiveservices.azure.com/.default");
            if !ok {
                return Some(refused(cloud, StatusCode::BAD_REQUEST, "invalid_client"));
            }
            cloud.count("entra");
            oauth(cloud, "entra-")
        }
        _ => return None,
    };
    Some(resp)
}

/// A service-account JWT as Google checks it: three parts, RS256, the cloud-platform scope, an
/// issuer, an audience and an expiry in the future.
fn jwt_claims_ok(jwt: &str) -> bool {
    let parts: Vec<&str> = jwt.split('.').collect();
    let [head, claims, sig] = parts[..] else {
        return false;
    };
    let decode = |s: &str| -> serde_json::Value {
        URL_SAFE_NO_PAD
            .decode(s)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    let (head, claims) = (decode(head), decode(claims));
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    head["alg"] == "RS256"
        && claims["scope"] == "https://www.googleapis.com/auth/cloud-platform"
        && claims["iss"].as_str().is_some_and(|s| s.contains('@'))
        && claims["aud"].as_str().is_some_and(|s| !s.is_empty())
        && claims["exp"].as_u64().is_some_and(|e| e > now)
        && URL_SAFE_NO_PAD.decode(sig).is_ok_and(|s| s.len() >= 256)
}
