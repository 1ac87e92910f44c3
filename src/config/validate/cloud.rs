//! The keys of the cloud provider kinds (`bedrock`, `vertex`, `azure-openai`) and the choice of
//! each one's credential source from the environment, in the order the platforms' own SDKs use.

use std::collections::BTreeMap;
use std::path::PathBuf;

use config::{Value, ValueKind};

use super::reader::{self, Cx, Table};
use crate::config::cloud::{
    AZURE_API_VERSION, AwsSource, AzureConfig, AzureSource, BEDROCK_ANTHROPIC_VERSION,
    BedrockConfig, GoogleSource, Platform, VERTEX_ANTHROPIC_VERSION, VertexConfig,
};
use crate::config::{ApiKind, KeySource, Secret};

/// A provider `kind` as written: a wire API, or a platform serving one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Declared {
    Direct(ApiKind),
    Bedrock,
    Vertex,
    Azure,
}

impl Declared {
    /// The wire API the caller's request is in when it reaches this provider.
    pub(super) fn api(self) -> ApiKind {
        match self {
            Declared::Direct(k) => k,
            Declared::Bedrock | Declared::Vertex => ApiKind::Anthropic,
            Declared::Azure => ApiKind::OpenAi,
        }
    }
}

pub(super) fn kind(v: &Value, path: &str, cx: &mut Cx) -> Option<Declared> {
    match reader::string(v, path, cx)?.as_str() {
        "anthropic" => Some(Declared::Direct(ApiKind::Anthropic)),
        "openai" => Some(Declared::Direct(ApiKind::OpenAi)),
        "bedrock" => Some(Declared::Bedrock),
        "vertex" => Some(Declared::Vertex),
        "azure-openai" => Some(Declared::Azure),
        other => {
            cx.err(
                path,
                format!(
                    "unknown provider kind `{other}` (expected anthropic, openai, bedrock, \
                     vertex or azure-openai)"
                ),
            );
            None
        }
    }
}

/// Reads the platform keys of a provider of kind `declared` (none for a direct provider, so
/// that they are reported as unknown there). `key` is the provider's api-key source.
pub(super) fn platform(
    declared: Option<Declared>,
    t: &mut Table,
    key: &KeySource,
    cx: &mut Cx,
) -> Option<Platform> {
    match declared? {
        Declared::Direct(_) => Some(Platform::Direct),
        Declared::Bedrock => bedrock(t, cx).map(Platform::Bedrock),
        Declared::Vertex => vertex(t, cx).map(Platform::Vertex),
        Declared::Azure => azure(t, key, cx).map(Platform::AzureOpenAi),
    }
}

/// The platform's public endpoint, when `base_url` is not set.
pub(super) fn default_base_url(platform: &Platform) -> Option<String> {
    match platform {
        Platform::Direct | Platform::AzureOpenAi(_) => None,
        Platform::Bedrock(b) => Some(format!(
            "https://bedrock-runtime.{}.amazonaws.com",
            b.region
        )),
        Platform::Vertex(v) if v.region == "global" => {
            Some("https://aiplatform.googleapis.com".to_owned())
        }
        Platform::Vertex(v) => Some(format!("https://{}-aiplatform.googleapis.com", v.region)),
    }
}

fn env(cx: &Cx, var: &str) -> Option<String> {
    cx.env.get(var).filter(|v| !v.is_empty()).cloned()
}

/// A region or project: what goes into a host name or a URL path segment.
fn place(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    let s = reader::non_empty_string(v, path, cx)?;
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        Some(s)
    } else {
        cx.err(
            path,
            format!("`{s}` is not a valid name (letters, digits, - and _)"),
        );
        None
    }
}

fn url(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    let s = reader::non_empty_string(v, path, cx)?;
    super::providers::normalize_base_url(&s)
        .map_err(|m| cx.err(path, m))
        .ok()
}

fn bedrock(t: &mut Table, cx: &mut Cx) -> Option<BedrockConfig> {
    let region = t.opt(cx, "region", place);
    let anthropic_version = t.opt(cx, "anthropic_version", reader::non_empty_string);
    let sts_endpoint = t.opt(cx, "sts_endpoint", url);
    let credentials_url = t.opt(cx, "credentials_url", url);
    let region =
        match region.or_else(|| env(cx, "AWS_REGION").or_else(|| env(cx, "AWS_DEFAULT_REGION"))) {
            Some(r) => r,
            None => {
                cx.err(
                    &t.child("region"),
                    "missing: set region (or AWS_REGION in the environment)",
                );
                return None;
            }
        };
    let credentials = aws_chain(cx, &region, sts_endpoint, credentials_url);
    Some(BedrockConfig {
        region,
        anthropic_version: anthropic_version
            .unwrap_or_else(|| BEDROCK_ANTHROPIC_VERSION.to_owned()),
        credentials,
    })
}

/// The AWS default chain: environment keys, then web identity, then the container endpoint.
fn aws_chain(
    cx: &Cx,
    region: &str,
    sts_endpoint: Option<String>,
    credentials_url: Option<String>,
) -> AwsSource {
    if let (Some(id), Some(secret)) = (
        env(cx, "AWS_ACCESS_KEY_ID"),
        env(cx, "AWS_SECRET_ACCESS_KEY"),
    ) {
        return AwsSource::Static {
            access_key_id: Secret::new(id),
            secret_access_key: Secret::new(secret),
            session_token: env(cx, "AWS_SESSION_TOKEN").map(Secret::new),
        };
    }
    if let (Some(file), Some(role_arn)) = (
        env(cx, "AWS_WEB_IDENTITY_TOKEN_FILE"),
        env(cx, "AWS_ROLE_ARN"),
    ) {
        let sts_endpoint = sts_endpoint
            .or_else(|| env(cx, "AWS_ENDPOINT_URL_STS"))
            .or_else(|| env(cx, "AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
        return AwsSource::WebIdentity {
            token_file: PathBuf::from(file),
            role_arn,
            session_name: env(cx, "AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "legate".to_owned()),
            sts_endpoint: sts_endpoint.trim_end_matches('/').to_owned(),
        };
    }
    let url = credentials_url
        .or_else(|| env(cx, "AWS_CONTAINER_CREDENTIALS_FULL_URI"))
        .or_else(|| {
            env(cx, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                .map(|p| format!("http://169.254.170.2{p}"))
        });
    match url {
        Some(url) => AwsSource::Container {
            url,
            auth_token_file: env(cx, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").map(PathBuf::from),
            auth_token: env(cx, "AWS_CONTAINER_AUTHORIZATION_TOKEN").map(Secret::new),
        },
        None => AwsSource::Missing,
    }
}

fn vertex(t: &mut Table, cx: &mut Cx) -> Option<VertexConfig> {
    let project = t.req(cx, "project", place);
    let region = t.req(cx, "region", place);
    let anthropic_version = t.opt(cx, "anthropic_version", reader::non_empty_string);
    let metadata_url = t.opt(cx, "metadata_url", url);
    let token_url = t.opt(cx, "token_url", url);
    let file = t.opt(cx, "credentials_file", reader::non_empty_string);
    let credentials = match file.or_else(|| env(cx, "GOOGLE_APPLICATION_CREDENTIALS")) {
        Some(path) => GoogleSource::File {
            path: PathBuf::from(path),
            token_url,
        },
        None => GoogleSource::Metadata {
            url: metadata_url
                .or_else(|| env(cx, "GCE_METADATA_HOST").map(|h| format!("http://{h}")))
                .unwrap_or_else(|| "http://metadata.google.internal".to_owned()),
        },
    };
    Some(VertexConfig {
        project: project?,
        region: region?,
        anthropic_version: anthropic_version.unwrap_or_else(|| VERTEX_ANTHROPIC_VERSION.to_owned()),
        credentials,
    })
}

fn azure(t: &mut Table, key: &KeySource, cx: &mut Cx) -> Option<AzureConfig> {
    let api_version = t.opt(cx, "api_version", reader::non_empty_string);
    let token_url = t.opt(cx, "token_url", url);
    let deployments = match t.get("deployments") {
        Some((v, path)) => deployments(v, &path, cx),
        None => BTreeMap::new(),
    };
    if t.get("base_url").is_none() {
        cx.err(
            &t.child("base_url"),
            "missing: an azure-openai provider needs its resource endpoint \
             (https://NAME.openai.azure.com)",
        );
    }
    let federated = (
        env(cx, "AZURE_FEDERATED_TOKEN_FILE"),
        env(cx, "AZURE_CLIENT_ID"),
        env(cx, "AZURE_TENANT_ID"),
    );
    let credentials = match (key, federated) {
        (KeySource::None, (Some(file), Some(client_id), Some(tenant_id))) => {
            let token_url = token_url.unwrap_or_else(|| {
                let host = env(cx, "AZURE_AUTHORITY_HOST")
                    .unwrap_or_else(|| "https://login.microsoftonline.com/".to_owned());
                format!(
                    "{}/{tenant_id}/oauth2/v2.0/token",
                    host.trim_end_matches('/')
                )
            });
            AzureSource::WorkloadIdentity {
                token_file: PathBuf::from(file),
                client_id,
                tenant_id,
                token_url,
            }
        }
        _ => AzureSource::ApiKey,
    };
    Some(AzureConfig {
        api_version: api_version.unwrap_or_else(|| AZURE_API_VERSION.to_owned()),
        deployments,
        credentials,
    })
}

/// `deployments = [{ model = "gpt-4o", deployment = "gpt4o-prod" }, …]`: an array of tables,
/// because model names contain dots that table keys would split.
fn deployments(v: &Value, path: &str, cx: &mut Cx) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let ValueKind::Array(items) = &v.kind else {
        cx.err(path, "expected an array of { model, deployment } tables");
        return out;
    };
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let Some(mut t) = Table::of(item, &p, cx) else {
            continue;
        };
        let model = t.req(cx, "model", reader::non_empty_string);
        let deployment = t.req(cx, "deployment", place);
        t.finish(cx);
        if let (Some(m), Some(d)) = (model, deployment) {
            if out.insert(m.clone(), d).is_some() {
                cx.err(&p, format!("model `{m}` is listed twice"));
            }
        }
    }
    out
}
