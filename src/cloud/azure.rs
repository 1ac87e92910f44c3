//! Entra ID workload identity for Azure OpenAI: the projected service-account token in
//! `AZURE_FEDERATED_TOKEN_FILE` presented as a client assertion for an access token with the
//! Cognitive Services scope.

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;

use super::cache::Fetched;
use super::fetch::{self, FetchClient};
use crate::config::Secret;

pub const SCOPE: &str = "https://cognitiveservices.azure.com/.default";

pub async fn fetch(
    client: &FetchClient,
    token_file: &std::path::Path,
    client_id: &str,
    token_url: &str,
) -> Result<Fetched<Secret>, String> {
    let assertion = fetch::read_token_file(token_file, "federated token file").await?;
    let form = fetch::form(&[
        ("grant_type", "client_credentials"),
        ("client_id", client_id),
        ("scope", SCOPE),
        (
            "client_assertion_type",
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
        ),
        ("client_assertion", &assertion),
    ]);
    let req = Request::builder()
        .method(Method::POST)
        .uri(token_url)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(form)))
        .map_err(|_| "the Entra token URL is not valid".to_owned())?;
    let what = "the Entra ID token endpoint";
    let body = fetch::call(client, req, what).await?;
    let (token, expires) = fetch::oauth_token(&body, what)?;
    Ok(Fetched {
        value: Secret::new(token),
        expires,
    })
}
