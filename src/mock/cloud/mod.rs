//! `legate mock --cloud`: the cloud platforms and the endpoints their credentials come from,
//! played on the same listener, so legate's pod-identity paths run end to end on a laptop.
//!
//! Credential endpoints (each issues fresh credentials that expire after `--credential-ttl`;
//! every issued secret contains `CANARY`, so leak tests can search for it):
//! - `POST /sts/` — STS `AssumeRoleWithWebIdentity` (form), XML answer;
//! - `GET /aws/credentials` — the container credentials endpoint (needs `Authorization`);
//! - `PUT /latest/api/token`, then `GET /latest/meta-data/iam/security-credentials/[ROLE]` —
//!   the EC2 instance metadata service, version 2 only (reads need the session token);
//! - `GET /computeMetadata/v1/instance/service-accounts/default/token` — the GCE metadata
//!   server (needs `Metadata-Flavor: Google`);
//! - `POST /google/token` — Google's token endpoint: a service-account JWT (`jwt-bearer`) or a
//!   federated subject token (`token-exchange`);
//! - `POST /{tenant}/oauth2/v2.0/token` — Entra ID, a client assertion for the Cognitive
//!   Services scope.
//!
//! Platforms (answers come from the script like any other request, matched on the model the
//! URL names):
//! - Bedrock `POST /model/{id}/invoke` and `/invoke-with-response-stream`: the SigV4 signature
//!   is recomputed and must match, with credentials this mock issued (or `--aws-static-key`)
//!   that have not expired; the body must carry `anthropic_version` and no `model`; streams are
//!   binary event-stream frames, scripted errors come in Bedrock's shape;
//! - Vertex `POST /v1/projects/{p}/locations/{r}/publishers/anthropic/models/{m}:rawPredict` and
//!   `:streamRawPredict`: a bearer token this mock issued; a scripted 429 comes in Google's shape;
//! - Azure `POST /openai/deployments/{d}/chat/completions?api-version=…`: `api-key` equal to
//!   `--azure-api-key`, or an Entra token this mock issued; the same credential on the v1
//!   surface's Responses API (`/openai/v1/responses…`), answered as the mock's own.
//!
//! `GET /_mock/cloud` reports how many credentials each endpoint issued and how many platform
//! calls were refused.

mod creds;
pub(crate) mod platforms;
mod sigv4;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};

use super::body::MockBody;

pub(crate) use platforms::{Platform, route};

/// How `legate mock --cloud` plays the platforms.
#[derive(Debug, Clone)]
pub struct CloudOptions {
    /// Lifetime of every credential issued.
    pub credential_ttl: Duration,
    /// The key Azure deployments accept in `api-key`.
    pub azure_api_key: Option<String>,
    /// A long-lived access key pair Bedrock accepts, as `AWS_ACCESS_KEY_ID` would carry it.
    pub aws_static_key: Option<(String, String)>,
}

impl Default for CloudOptions {
    fn default() -> Self {
        CloudOptions {
            credential_ttl: Duration::from_secs(3600),
            azure_api_key: None,
            aws_static_key: None,
        }
    }
}

/// Issued credentials are kept up to this many; the oldest go first.
const ISSUED_LIMIT: usize = 4096;

pub(crate) struct AwsIssued {
    pub secret: String,
    pub token: Option<String>,
    pub expires: Option<SystemTime>,
}

pub(crate) struct Cloud {
    pub opts: CloudOptions,
    serial: AtomicU64,
    aws: Mutex<HashMap<String, AwsIssued>>,
    /// Bearer tokens issued (Google and Entra) with their expiry.
    tokens: Mutex<HashMap<String, SystemTime>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Cloud {
    pub(super) fn new(opts: CloudOptions) -> Cloud {
        let cloud = Cloud {
            opts,
            serial: AtomicU64::new(1),
            aws: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            counts: Mutex::new(BTreeMap::new()),
        };
        if let Some((id, secret)) = &cloud.opts.aws_static_key {
            lock(&cloud.aws).insert(
                id.clone(),
                AwsIssued {
                    secret: secret.clone(),
                    token: None,
                    expires: None,
                },
            );
        }
        cloud
    }

    pub(super) fn count(&self, what: &'static str) {
        *lock(&self.counts).entry(what).or_default() += 1;
    }

    fn next(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed)
    }

    fn expiry(&self) -> SystemTime {
        SystemTime::now() + self.opts.credential_ttl
    }

    /// Issues an AWS key pair with a session token.
    pub(super) fn issue_aws(&self) -> (String, String, String, SystemTime) {
        let n = self.next();
        let id = format!("ASIACANARY{n:06}");
        let secret = format!("CANARY-aws-secret-{n:06}");
        let token = format!("CANARY-aws-session-{n:06}");
        let expires = self.expiry();
        let mut aws = lock(&self.aws);
        if aws.len() >= ISSUED_LIMIT {
            aws.retain(|_, v| v.expires.is_none());
        }
        aws.insert(
            id.clone(),
            AwsIssued {
                secret: secret.clone(),
                token: Some(token.clone()),
                expires: Some(expires),
            },
        );
        (id, secret, token, expires)
    }

    /// Issues a bearer token (`prefix` says whose).
    pub(super) fn issue_token(&self, prefix: &str) -> (String, SystemTime) {
        let token = format!("{prefix}CANARY-{:06}", self.next());
        let expires = self.expiry();
        let mut tokens = lock(&self.tokens);
        if tokens.len() >= ISSUED_LIMIT {
            let now = SystemTime::now();
            tokens.retain(|_, exp| *exp > now);
        }
        tokens.insert(token.clone(), expires);
        (token, expires)
    }

    /// Whether `token` was issued here and has not expired (`Err` says why not).
    pub(super) fn check_token(&self, token: &str) -> Result<(), &'static str> {
        match lock(&self.tokens).get(token) {
            None => Err("unknown access token"),
            Some(exp) if *exp <= SystemTime::now() => Err("expired access token"),
            Some(_) => Ok(()),
        }
    }

    /// The secret and session token of an access key id, if valid now.
    pub(super) fn aws_key(&self, id: &str) -> Result<(String, Option<String>), &'static str> {
        match lock(&self.aws).get(id) {
            None => Err("UnrecognizedClientException"),
            Some(k) if k.expires.is_some_and(|e| e <= SystemTime::now()) => {
                Err("ExpiredTokenException")
            }
            Some(k) => Ok((k.secret.clone(), k.token.clone())),
        }
    }

    /// `GET /_mock/cloud`.
    pub(super) fn report(&self) -> Response<MockBody> {
        let counts = lock(&self.counts).clone();
        let body = serde_json::to_vec(&counts).unwrap_or_default();
        let mut resp = Response::new(MockBody::full(Bytes::from(body)));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }

    /// Answers a credential endpoint, if `parts` names one.
    pub(super) fn credential_endpoint(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Option<Response<MockBody>> {
        creds::answer(self, parts, body)
    }
}

pub(crate) fn simple(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<MockBody> {
    let mut resp = Response::new(MockBody::full(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}
