//! The validated settings of the cloud platforms (SPEC §13): which platform a provider is, the
//! place names its URL is built from, and where its credential comes from. Every credential
//! source is decided here, from the config and the environment, so that `legate check` can say
//! which one a provider will use and the request path never reads the environment.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::adapt::mask_userinfo;
use super::secret::Secret;

/// The `anthropic_version` Bedrock accepts in the body.
pub const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";
/// The `anthropic_version` Vertex AI accepts in the body.
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";
/// The Azure OpenAI data-plane version used when `api_version` is not set.
pub const AZURE_API_VERSION: &str = "2024-10-21";

/// Which platform serves a provider. `Direct` is the provider's own API (kinds `anthropic` and
/// `openai`).
#[derive(Debug, Clone)]
pub enum Platform {
    Direct,
    Bedrock(BedrockConfig),
    Vertex(VertexConfig),
    AzureOpenAi(AzureConfig),
}

impl Platform {
    /// The provider kind as written in the config.
    pub fn kind_name(&self) -> Option<&'static str> {
        match self {
            Platform::Direct => None,
            Platform::Bedrock(_) => Some("bedrock"),
            Platform::Vertex(_) => Some("vertex"),
            Platform::AzureOpenAi(_) => Some("azure-openai"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BedrockConfig {
    pub region: String,
    pub anthropic_version: String,
    pub credentials: AwsSource,
    /// `AWS_PROFILE` when environment keys came first in the chain and it goes unused: the
    /// SDKs disagree on which wins, so `legate check` says which did.
    pub unused_profile: Option<String>,
}

/// Where Bedrock's SigV4 credentials come from: the AWS default chain, first match wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AwsSource {
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`).
    Static {
        access_key_id: Secret,
        secret_access_key: Secret,
        session_token: Option<Secret>,
    },
    /// IRSA: the projected token in `AWS_WEB_IDENTITY_TOKEN_FILE` exchanged at STS
    /// (`AssumeRoleWithWebIdentity`) for `AWS_ROLE_ARN`.
    WebIdentity {
        token_file: PathBuf,
        role_arn: String,
        session_name: String,
        sts_endpoint: String,
    },
    /// EKS Pod Identity / ECS: the container credentials endpoint, with its authorization
    /// token from a file (re-read on each refresh) or the environment.
    Container {
        url: String,
        auth_token_file: Option<PathBuf>,
        auth_token: Option<Secret>,
    },
    /// A profile's static keys in the shared credentials file (`~/.aws/credentials`), read
    /// again every few minutes so that keys rotated in the file are taken up.
    Profile { file: PathBuf, profile: String },
    /// The EC2 instance metadata service (IMDSv2): the instance role's credentials, the
    /// chain's last source (unless `AWS_EC2_METADATA_DISABLED=true`).
    Instance { url: String },
    /// Nothing in the chain: every request to the provider is a 502 that says so.
    Missing,
}

#[derive(Debug, Clone)]
pub struct VertexConfig {
    pub project: String,
    pub region: String,
    pub anthropic_version: String,
    pub credentials: GoogleSource,
}

/// Where Vertex's OAuth2 access token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoogleSource {
    /// `GOOGLE_APPLICATION_CREDENTIALS` (or `credentials_file`): a service-account key or an
    /// external account (workload identity federation), read on each refresh. `token_url`
    /// replaces the token endpoint the file names.
    File {
        path: PathBuf,
        token_url: Option<String>,
    },
    /// The metadata server (GKE Workload Identity, GCE).
    Metadata { url: String },
}

#[derive(Debug, Clone)]
pub struct AzureConfig {
    pub api_version: String,
    /// Model name the caller sends → deployment name; a model not listed is its own deployment.
    pub deployments: BTreeMap<String, String>,
    pub credentials: AzureSource,
}

impl AzureConfig {
    pub fn deployment<'a>(&'a self, model: &'a str) -> &'a str {
        self.deployments.get(model).map_or(model, String::as_str)
    }
}

/// Where Azure OpenAI's credential comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AzureSource {
    /// The `api-key` header, from the provider's `api_key_env` / `api_key_file`.
    ApiKey,
    /// Entra ID workload identity: the projected token in `AZURE_FEDERATED_TOKEN_FILE`
    /// exchanged as a client assertion at `{authority}{tenant}/oauth2/v2.0/token`.
    WorkloadIdentity {
        token_file: PathBuf,
        client_id: String,
        tenant_id: String,
        token_url: String,
    },
}

impl AwsSource {
    /// What `legate check` and `/admin/state` say about this source (never a secret).
    pub fn describe(&self) -> String {
        match self {
            AwsSource::Static { session_token, .. } => format!(
                "environment access keys (AWS_ACCESS_KEY_ID{})",
                if session_token.is_some() {
                    ", with AWS_SESSION_TOKEN"
                } else {
                    ""
                }
            ),
            AwsSource::WebIdentity {
                token_file,
                role_arn,
                sts_endpoint,
                ..
            } => format!(
                "web identity: token file {} exchanged for role {role_arn} at {}",
                token_file.display(),
                mask_userinfo(sts_endpoint)
            ),
            AwsSource::Container { url, .. } => {
                format!("container credentials endpoint {}", mask_userinfo(url))
            }
            AwsSource::Profile { file, profile } => format!(
                "profile {} of the shared credentials file {}",
                crate::config::shown::shown(profile),
                crate::config::shown::shown(&file.to_string_lossy())
            ),
            AwsSource::Instance { url } => format!(
                "the EC2 instance metadata service (IMDSv2) at {}, the chain's last source",
                mask_userinfo(url)
            ),
            AwsSource::Missing => "none found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
                 a profile in the shared credentials file, AWS_WEB_IDENTITY_TOKEN_FILE + \
                 AWS_ROLE_ARN, or AWS_CONTAINER_CREDENTIALS_FULL_URI (the instance metadata \
                 service is off: AWS_EC2_METADATA_DISABLED)"
                .to_owned(),
        }
    }
}

impl GoogleSource {
    pub fn describe(&self) -> String {
        match self {
            GoogleSource::File { path, token_url } => format!(
                "credentials file {}{}",
                path.display(),
                token_url
                    .as_ref()
                    .map(|u| format!(" (token endpoint {})", mask_userinfo(u)))
                    .unwrap_or_default()
            ),
            GoogleSource::Metadata { url } => format!("metadata server {}", mask_userinfo(url)),
        }
    }
}

impl AzureSource {
    pub fn describe(&self) -> String {
        match self {
            AzureSource::ApiKey => "api-key header (api_key_env / api_key_file)".to_owned(),
            AzureSource::WorkloadIdentity {
                token_file,
                client_id,
                token_url,
                ..
            } => format!(
                "Entra workload identity: token file {} for client {client_id} at {}",
                token_file.display(),
                mask_userinfo(token_url)
            ),
        }
    }
}

impl Platform {
    /// Which credential source a cloud provider will use; `None` for direct providers.
    pub fn credential_source(&self) -> Option<String> {
        match self {
            Platform::Direct => None,
            Platform::Bedrock(b) => Some(b.credentials.describe()),
            Platform::Vertex(v) => Some(v.credentials.describe()),
            Platform::AzureOpenAi(a) => Some(a.credentials.describe()),
        }
    }
}
