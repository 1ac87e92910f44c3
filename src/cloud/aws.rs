//! AWS credentials for Bedrock: the default chain's sources (environment keys, a profile of
//! the shared credentials file, web identity through STS, the container credentials endpoint,
//! the instance metadata service) and SigV4 signing with the official `aws-sigv4` signer.
//!
//! The chain itself is small HTTP against documented endpoints, written here rather than taken
//! from `aws-config`: that crate brings its own HTTP stack, TLS backend and the generated STS
//! and SSO clients, a build cost out of proportion to a few requests. What it has and this
//! has not: SSO, role-assuming and process profiles of `~/.aws/config`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;

use super::cache::Fetched;
use super::fetch::{self, FetchClient};
use crate::config::Secret;
use crate::config::cloud::AwsSource;

/// One set of SigV4 credentials.
#[derive(Clone)]
pub struct AwsCreds {
    pub access_key_id: Secret,
    pub secret_access_key: Secret,
    /// Shared: it is also what the provider's answers are searched for (`redact`).
    pub session_token: Option<Arc<Secret>>,
}

/// Obtains credentials from `source`.
pub async fn fetch(client: &FetchClient, source: &AwsSource) -> Result<Fetched<AwsCreds>, String> {
    match source {
        AwsSource::Static {
            access_key_id,
            secret_access_key,
            session_token,
        } => Ok(Fetched {
            value: AwsCreds {
                access_key_id: access_key_id.clone(),
                secret_access_key: secret_access_key.clone(),
                session_token: session_token.clone().map(Arc::new),
            },
            expires: None,
        }),
        AwsSource::WebIdentity {
            token_file,
            role_arn,
            session_name,
            sts_endpoint,
        } => {
            let token = fetch::read_token_file(token_file, "web identity token file").await?;
            let body = fetch::form(&[
                ("Action", "AssumeRoleWithWebIdentity"),
                ("Version", "2011-06-15"),
                ("RoleArn", role_arn),
                ("RoleSessionName", session_name),
                ("WebIdentityToken", &token),
            ]);
            let req = Request::builder()
                .method(Method::POST)
                .uri(format!("{sts_endpoint}/"))
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Full::new(Bytes::from(body)))
                .map_err(|_| "the STS endpoint is not a valid URL".to_owned())?;
            let answer = fetch::call(client, req, "STS (AssumeRoleWithWebIdentity)").await?;
            sts_answer(&answer)
        }
        AwsSource::Container {
            url,
            auth_token_file,
            auth_token,
        } => {
            let mut req = Request::builder().method(Method::GET).uri(url.as_str());
            let token = match auth_token_file {
                Some(f) => {
                    Some(fetch::read_token_file(f, "container authorization token file").await?)
                }
                None => auth_token.as_ref().map(|t| t.expose().to_owned()),
            };
            if let Some(t) = token {
                let mut v = http::HeaderValue::from_str(&t).map_err(|_| {
                    "the container authorization token is not a header value".to_owned()
                })?;
                v.set_sensitive(true);
                req = req.header(header::AUTHORIZATION, v);
            }
            let req = req
                .body(Full::new(Bytes::new()))
                .map_err(|_| "the container credentials URL is not valid".to_owned())?;
            let answer = fetch::call(client, req, "the container credentials endpoint").await?;
            container_answer(&answer)
        }
        AwsSource::Profile { file, profile } => profile_keys(file, profile).await,
        AwsSource::Instance { url } => super::imds::fetch(client, url).await,
        AwsSource::Missing => Err(format!("no AWS credentials: {}", source.describe())),
    }
}

/// The shared credentials file is read again this often: it says nothing of when its keys
/// stop working, and tools that rotate keys write them there.
const PROFILE_REREAD: Duration = Duration::from_secs(300);

/// A profile's keys, read from the file on a blocking thread (it is a file read).
async fn profile_keys(file: &Path, profile: &str) -> Result<Fetched<AwsCreds>, String> {
    use crate::config::aws_profile::{Found, find, read};
    let shown = crate::config::shown::shown(&file.to_string_lossy()).into_owned();
    let (path, name) = (file.to_owned(), profile.to_owned());
    let found = tokio::task::spawn_blocking(move || read(&path).map(|t| find(&t, &name)))
        .await
        .map_err(|_| "the shared credentials file could not be read".to_owned())?
        .map_err(|e| format!("cannot read the shared credentials file {shown}: {e}"))?;
    match found {
        Found::Keys(k) => Ok(Fetched {
            value: AwsCreds {
                access_key_id: k.access_key_id,
                secret_access_key: k.secret_access_key,
                session_token: k.session_token.map(Arc::new),
            },
            expires: Some(SystemTime::now() + PROFILE_REREAD),
        }),
        Found::Partial | Found::NoKeys | Found::NoProfile { .. } => Err(format!(
            "the shared credentials file {shown} no longer holds both keys of its profile"
        )),
    }
}

/// The text of `<tag>…</tag>` in an STS XML answer (whose shape is fixed and flat enough that a
/// full XML parser buys nothing).
fn xml_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    Some(xml[start..end].trim())
}

fn expiry(s: &str) -> Option<SystemTime> {
    let t = aws_smithy_types::DateTime::from_str(s, aws_smithy_types::date_time::Format::DateTime)
        .ok()?;
    SystemTime::try_from(t).ok()
}

fn sts_answer(body: &[u8]) -> Result<Fetched<AwsCreds>, String> {
    let xml = std::str::from_utf8(body).map_err(|_| "STS sent a non-UTF-8 answer".to_owned())?;
    let field = |tag: &str| {
        xml_text(xml, tag)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("STS answer lacks {tag}"))
    };
    Ok(Fetched {
        value: AwsCreds {
            access_key_id: Secret::new(field("AccessKeyId")?.to_owned()),
            secret_access_key: Secret::new(field("SecretAccessKey")?.to_owned()),
            session_token: Some(Arc::new(Secret::new(field("SessionToken")?.to_owned()))),
        },
        expires: Some(expiry(field("Expiration")?).ok_or("STS sent an unreadable Expiration")?),
    })
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ContainerCreds {
    access_key_id: String,
    secret_access_key: String,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    expiration: Option<String>,
}

pub(super) fn container_answer(body: &[u8]) -> Result<Fetched<AwsCreds>, String> {
    let c: ContainerCreds = serde_json::from_slice(body)
        .map_err(|_| "the container credentials endpoint sent no credentials".to_owned())?;
    let expires = match &c.expiration {
        Some(e) => {
            Some(expiry(e).ok_or("the container credentials carry an unreadable Expiration")?)
        }
        None => None,
    };
    Ok(Fetched {
        value: AwsCreds {
            access_key_id: Secret::new(c.access_key_id),
            secret_access_key: Secret::new(c.secret_access_key),
            session_token: c
                .token
                .filter(|t| !t.is_empty())
                .map(|t| Arc::new(Secret::new(t))),
        },
        expires,
    })
}

/// Signs `req` (whose body is `body`) for `service` in `region` at `time`: adds `x-amz-date`,
/// `x-amz-security-token` when there is a session token, and `authorization`. Every header the
/// request carries is signed, so it must hold `host` and no header that changes on the way.
pub fn sign(
    req: &mut Request<Full<Bytes>>,
    body: &[u8],
    creds: &AwsCreds,
    region: &str,
    service: &str,
    time: SystemTime,
) -> Result<(), String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity: aws_smithy_runtime_api::client::identity::Identity =
        aws_credential_types::Credentials::new(
            creds.access_key_id.expose(),
            creds.secret_access_key.expose(),
            creds.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "legate",
        )
        .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|_| "SigV4 parameters incomplete".to_owned())?
        .into();
    let uri = req.uri().to_string();
    let headers: Vec<(&str, &str)> = req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
        .collect();
    let signable = SignableRequest::new(
        req.method().as_str(),
        uri,
        headers.into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|_| "the request cannot be signed".to_owned())?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|_| "SigV4 signing failed".to_owned())?
        .into_parts();
    let (new_headers, _params) = instructions.into_parts();
    for h in new_headers {
        let mut value = http::HeaderValue::from_str(h.value())
            .map_err(|_| "SigV4 produced an invalid header".to_owned())?;
        // The signature is as good as the key for this one request: kept out of any dump.
        value.set_sensitive(
            h.sensitive() || matches!(h.name(), "authorization" | "x-amz-security-token"),
        );
        let name = http::HeaderName::from_bytes(h.name().as_bytes())
            .map_err(|_| "SigV4 produced an invalid header name".to_owned())?;
        req.headers_mut().insert(name, value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sts_answer_yields_credentials_and_expiry() {
        let xml = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>\
            <Credentials><AccessKeyId>ASIAEXAMPLE</AccessKeyId>\
            <SecretAccessKey>secret</SecretAccessKey><SessionToken>tok</SessionToken>\
            <Expiration>2030-01-01T00:00:00Z</Expiration></Credentials>\
            </AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
        let f = sts_answer(xml.as_bytes()).unwrap();
        assert_eq!(f.value.access_key_id.expose(), "ASIAEXAMPLE");
        assert_eq!(f.value.session_token.unwrap().expose(), "tok");
        assert_eq!(
            f.expires
                .unwrap()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            1_893_456_000
        );
        assert!(sts_answer(b"<Error><Code>AccessDenied</Code></Error>").is_err());
    }

    #[test]
    fn container_answer_reads_the_documented_fields() {
        let body = br#"{"AccessKeyId":"A","SecretAccessKey":"S","Token":"T","Expiration":"2030-01-01T00:00:00Z"}"#;
        let f = container_answer(body).unwrap();
        assert_eq!(f.value.secret_access_key.expose(), "S");
        assert!(f.expires.is_some());
        assert!(container_answer(b"{}").is_err());
    }

    #[test]
    fn signing_adds_date_token_and_authorization() {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("https://bedrock-runtime.us-east-1.amazonaws.com/model/a%3A0/invoke")
            .header("host", "bedrock-runtime.us-east-1.amazonaws.com")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let creds = AwsCreds {
            access_key_id: Secret::new("AKIDEXAMPLE".into()),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into()),
            session_token: Some(Arc::new(Secret::new("session".into()))),
        };
        sign(
            &mut req,
            b"{}",
            &creds,
            "us-east-1",
            "bedrock",
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        let auth = req.headers()["authorization"].to_str().unwrap();
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/19700101/us-east-1/bedrock/aws4_request"
        ));
        assert!(auth.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token"));
        assert_eq!(req.headers()["x-amz-security-token"], "session");
        assert!(req.headers()["authorization"].is_sensitive());
    }
}
