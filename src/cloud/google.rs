//! Google OAuth2 access tokens for Vertex AI: from a service-account key (an RS256 JWT
//! exchanged at the token endpoint), from an external account (workload identity federation:
//! a subject token exchanged at Google's STS, optionally impersonating a service account), or
//! from the metadata server (GKE Workload Identity, GCE).
//!
//! The JWT is signed with `ring`, already linked for TLS; the rest is three documented HTTP
//! calls whose endpoints must all be overridable — which the maintained Google auth crates
//! allow only in part.

use std::path::Path;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;

use super::cache::Fetched;
use super::fetch::{self, FetchClient};
use crate::config::Secret;
use crate::config::cloud::GoogleSource;

pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
const JWT_LIFETIME: Duration = Duration::from_secs(3600);

#[derive(serde::Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: String,
    // service_account
    #[serde(default)]
    client_email: Option<String>,
    #[serde(default)]
    private_key: Option<String>,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    token_uri: Option<String>,
    // external_account
    #[serde(default)]
    audience: Option<String>,
    #[serde(default)]
    subject_token_type: Option<String>,
    #[serde(default)]
    token_url: Option<String>,
    #[serde(default)]
    service_account_impersonation_url: Option<String>,
    #[serde(default)]
    credential_source: Option<CredentialSource>,
}

#[derive(serde::Deserialize)]
struct CredentialSource {
    #[serde(default)]
    file: Option<String>,
}

pub async fn fetch(client: &FetchClient, source: &GoogleSource) -> Result<Fetched<Secret>, String> {
    let (token, expires) = match source {
        GoogleSource::Metadata { url } => metadata(client, url).await?,
        GoogleSource::File { path, token_url } => {
            let key = read_key_file(path).await?;
            match key.kind.as_str() {
                "service_account" => service_account(client, &key, token_url.as_deref()).await?,
                "external_account" => external_account(client, &key, token_url.as_deref()).await?,
                other => {
                    return Err(format!(
                        "{}: credentials of type `{other}` are not supported (service_account or external_account)",
                        path.display()
                    ));
                }
            }
        }
    };
    Ok(Fetched {
        value: Secret::new(token),
        expires,
    })
}

async fn read_key_file(path: &Path) -> Result<KeyFile, String> {
    let text = crate::config::read::bounded_async(path, crate::config::read::SMALL)
        .await
        .map_err(|e| {
            format!(
                "cannot read the Google credentials file {}: {e}",
                path.display()
            )
        })?;
    serde_json::from_slice(&text)
        .map_err(|_| format!("{} is not a Google credentials JSON file", path.display()))
}

type Token = (String, Option<SystemTime>);

async fn metadata(client: &FetchClient, base: &str) -> Result<Token, String> {
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!(
            "{base}/computeMetadata/v1/instance/service-accounts/default/token"
        ))
        .header("metadata-flavor", "Google")
        .body(Full::new(Bytes::new()))
        .map_err(|_| "the metadata server URL is not valid".to_owned())?;
    let body = fetch::call(client, req, "the GCE metadata server").await?;
    fetch::oauth_token(&body, "the GCE metadata server")
}

async fn post_form(
    client: &FetchClient,
    url: &str,
    form: String,
    what: &str,
) -> Result<Token, String> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(form)))
        .map_err(|_| format!("the {what} URL is not valid"))?;
    let body = fetch::call(client, req, what).await?;
    fetch::oauth_token(&body, what)
}

async fn service_account(
    client: &FetchClient,
    key: &KeyFile,
    token_url: Option<&str>,
) -> Result<Token, String> {
    let aud = token_url
        .map(str::to_owned)
        .or_else(|| key.token_uri.clone())
        .unwrap_or_else(|| DEFAULT_TOKEN_URI.to_owned());
    let email = key
        .client_email
        .as_deref()
        .ok_or("the service-account key lacks client_email")?;
    let pem = key
        .private_key
        .as_deref()
        .ok_or("the service-account key lacks private_key")?;
    let jwt = signed_jwt(
        email,
        key.private_key_id.as_deref(),
        pem,
        &aud,
        SystemTime::now(),
    )?;
    let form = fetch::form(&[
        ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
        ("assertion", &jwt),
    ]);
    post_form(client, &aud, form, "the Google token endpoint").await
}

/// The RS256 JWT a service account presents: `iss` its e-mail, `aud` the token endpoint.
pub fn signed_jwt(
    email: &str,
    key_id: Option<&str>,
    pem: &str,
    aud: &str,
    now: SystemTime,
) -> Result<String, String> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let der = match PrivateKeyDer::from_pem_slice(pem.as_bytes()) {
        Ok(PrivateKeyDer::Pkcs8(k)) => k,
        _ => return Err("the service-account private_key is not a PKCS#8 PEM key".to_owned()),
    };
    let pair = ring::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
        .map_err(|_| "the service-account private_key is not a usable RSA key".to_owned())?;
    let iat = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| "the clock is before 1970".to_owned())?
        .as_secs();
    let mut head = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = key_id {
        head["kid"] = serde_json::Value::from(kid);
    }
    let claims = serde_json::json!({
        "iss": email, "scope": SCOPE, "aud": aud, "iat": iat, "exp": iat + JWT_LIFETIME.as_secs(),
    });
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(head.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut sig = vec![0u8; pair.public().modulus_len()];
    pair.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut sig,
    )
    .map_err(|_| "signing the service-account JWT failed".to_owned())?;
    Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

async fn external_account(
    client: &FetchClient,
    key: &KeyFile,
    token_url: Option<&str>,
) -> Result<Token, String> {
    let url = token_url
        .map(str::to_owned)
        .or_else(|| key.token_url.clone())
        .ok_or("the external account lacks token_url")?;
    let file = key
        .credential_source
        .as_ref()
        .and_then(|s| s.file.as_deref())
        .ok_or("the external account's credential_source names no file (only file sources are supported)")?;
    let subject = fetch::read_token_file(Path::new(file), "federated subject token file").await?;
    let form = fetch::form(&[
        (
            "grant_type",
            "urn:ietf:params:oauth:grant-type:token-exchange",
        ),
        ("audience", key.audience.as_deref().unwrap_or_default()),
        ("scope", SCOPE),
        (
            "requested_token_type",
            "urn:ietf:params:oauth:token-type:access_token",
        ),
        ("subject_token", &subject),
        (
            "subject_token_type",
            key.subject_token_type
                .as_deref()
                .unwrap_or("urn:ietf:params:oauth:token-type:jwt"),
        ),
    ]);
    let federated = post_form(client, &url, form, "the Google STS token endpoint").await?;
    match &key.service_account_impersonation_url {
        None => Ok(federated),
        Some(imp) => impersonate(client, imp, &federated.0).await,
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Impersonated {
    access_token: String,
    expire_time: String,
}

async fn impersonate(client: &FetchClient, url: &str, federated: &str) -> Result<Token, String> {
    let mut bearer = http::HeaderValue::from_str(&format!("Bearer {federated}"))
        .map_err(|_| "the federated token is not a header value".to_owned())?;
    bearer.set_sensitive(true);
    let req = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, bearer)
        .body(Full::new(Bytes::from(
            serde_json::json!({"scope": [SCOPE]}).to_string(),
        )))
        .map_err(|_| "the service account impersonation URL is not valid".to_owned())?;
    let what = "the service account impersonation endpoint";
    let body = fetch::call(client, req, what).await?;
    let t: Impersonated =
        serde_json::from_slice(&body).map_err(|_| format!("{what} sent no accessToken"))?;
    let expires = aws_smithy_types::DateTime::from_str(
        &t.expire_time,
        aws_smithy_types::date_time::Format::DateTime,
    )
    .ok()
    .and_then(|d| SystemTime::try_from(d).ok())
    // An expiry that cannot be read is taken as the usual hour, not as none (see `fetch`).
    .or_else(|| Some(SystemTime::now() + fetch::ASSUMED_TOKEN_LIFE));
    Ok((t.access_token, expires))
}
