//! The EC2 instance metadata service, version 2: a session token (`PUT /latest/api/token`),
//! then the instance role's name and its credentials under
//! `/latest/meta-data/iam/security-credentials/`. Version 1 (the same reads without a token)
//! is never used: it is what instance hardening turns off.
//!
//! Off EC2 nothing answers at the link-local address, and a container whose instance sets a
//! hop limit of 1 gets no token back. The first call is therefore cut after
//! [`TOKEN_TIMEOUT`], so a chain that ends here fails (or falls back) quickly, as the SDKs do.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request};
use http_body_util::Full;

use super::aws::{AwsCreds, container_answer};
use super::cache::Fetched;
use super::fetch::{self, FetchClient};

/// How long the token request may take: the service answers in milliseconds where it exists.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(1);
/// The token's life asked for (the service's longest); a new one is taken on every refresh.
const TOKEN_TTL_SECS: &str = "21600";
const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";
const ROLE_PATH: &str = "/latest/meta-data/iam/security-credentials/";

/// The instance role's credentials from the service at `base`.
pub(super) async fn fetch(client: &FetchClient, base: &str) -> Result<Fetched<AwsCreds>, String> {
    let what = "the instance metadata service";
    let req = Request::builder()
        .method(Method::PUT)
        .uri(format!("{base}/latest/api/token"))
        .header("x-aws-ec2-metadata-token-ttl-seconds", TOKEN_TTL_SECS)
        .body(Full::new(Bytes::new()))
        .map_err(|_| "the instance metadata URL is not valid".to_owned())?;
    let token = tokio::time::timeout(TOKEN_TIMEOUT, fetch::call(client, req, what))
        .await
        .map_err(|_| {
            format!(
                "{what} gave no session token within {}s: not an EC2 instance, or a container \
                 behind a metadata hop limit of 1. It is the AWS chain's last source, asked \
                 because none before it was set (AWS_ACCESS_KEY_ID, AWS_WEB_IDENTITY_TOKEN_FILE, \
                 a profile in ~/.aws/credentials, AWS_CONTAINER_CREDENTIALS_FULL_URI)",
                TOKEN_TIMEOUT.as_secs()
            )
        })??;
    let token = token.trim_ascii();
    let mut token = HeaderValue::from_bytes(token)
        .ok()
        .filter(|_| !token.is_empty())
        .ok_or_else(|| format!("{what} sent a session token that is not a header value"))?;
    token.set_sensitive(true);
    let get = |path: String| {
        Request::builder()
            .method(Method::GET)
            .uri(format!("{base}{path}"))
            .header(TOKEN_HEADER, token.clone())
            .body(Full::new(Bytes::new()))
            .map_err(|_| "the instance metadata URL is not valid".to_owned())
    };
    let no_role = || format!("{what} names no instance role (is one attached to the instance?)");
    // Without a role the service answers 404 here.
    let roles = match fetch::call(client, get(ROLE_PATH.to_owned())?, what).await {
        Err(e) if e.ends_with("answered 404") => return Err(no_role()),
        other => other?,
    };
    let role = std::str::from_utf8(&roles)
        .ok()
        .and_then(|r| r.lines().map(str::trim).find(|l| !l.is_empty()))
        .ok_or_else(no_role)?;
    // The name goes into the path: anything but a role name's characters is not one.
    if !role
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-".contains(&b))
    {
        return Err(format!("{what} sent an instance role name that is not one"));
    }
    let answer = fetch::call(client, get(format!("{ROLE_PATH}{role}"))?, what).await?;
    #[derive(serde::Deserialize)]
    struct Code {
        #[serde(rename = "Code", default)]
        code: Option<String>,
    }
    if let Ok(Code { code: Some(c) }) = serde_json::from_slice::<Code>(&answer)
        && c != "Success"
    {
        return Err(format!(
            "{what} answered the credential request with code {c:?}"
        ));
    }
    container_answer(&answer).map_err(|_| format!("{what} sent no credentials"))
}
