//! The keys of the cloud provider kinds (`bedrock`, `vertex`, `azure-openai`) and the choice of
//! each one's credential source from the environment, in the order the platforms' own SDKs use.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::Cx;
use crate::config::cloud::{
    AZURE_API_VERSION, AwsSource, AzureConfig, AzureSource, BEDROCK_ANTHROPIC_VERSION,
    BedrockConfig, GoogleSource, Platform, VERTEX_ANTHROPIC_VERSION, VertexConfig,
};
use crate::config::file::{DeploymentFile, ProviderFile, ProviderKind};
use crate::config::{KeySource, Secret};

/// Builds the platform of a provider of kind `kind`. `key` is its api-key source.
pub(super) fn platform(
    kind: ProviderKind,
    p: &ProviderFile,
    key: &KeySource,
    at: &str,
    cx: &mut Cx,
) -> Option<Platform> {
    foreign_keys(kind, p, at, cx);
    match kind {
        ProviderKind::Anthropic | ProviderKind::Openai => Some(Platform::Direct),
        ProviderKind::Bedrock => bedrock(p, at, cx).map(Platform::Bedrock),
        ProviderKind::Vertex => vertex(p, at, cx).map(Platform::Vertex),
        ProviderKind::AzureOpenai => Some(Platform::AzureOpenAi(azure(p, key, at, cx))),
    }
}

/// A platform key on a provider of another kind is as unknown there as a typo.
fn foreign_keys(kind: ProviderKind, p: &ProviderFile, at: &str, cx: &mut Cx) {
    use ProviderKind::{AzureOpenai as Az, Bedrock as Br, Vertex as Vx};
    let keys: [(&str, bool, &[ProviderKind]); 10] = [
        ("region", p.region.is_some(), &[Br, Vx]),
        ("project", p.project.is_some(), &[Vx]),
        (
            "anthropic_version",
            p.anthropic_version.is_some(),
            &[Br, Vx],
        ),
        ("api_version", p.api_version.is_some(), &[Az]),
        ("deployments", p.deployments.is_some(), &[Az]),
        ("credentials_file", p.credentials_file.is_some(), &[Br, Vx]),
        ("sts_endpoint", p.sts_endpoint.is_some(), &[Br]),
        ("credentials_url", p.credentials_url.is_some(), &[Br]),
        ("metadata_url", p.metadata_url.is_some(), &[Br, Vx]),
        ("token_url", p.token_url.is_some(), &[Vx, Az]),
    ];
    for (key, set, kinds) in keys {
        if set && !kinds.contains(&kind) {
            let names: Vec<&str> = kinds.iter().map(|k| kind_name(*k)).collect();
            cx.err(
                &format!("{at}.{key}"),
                format!(
                    "unknown key for a provider of kind {} (it belongs to kind {})",
                    kind_name(kind),
                    names.join(" or ")
                ),
            );
        }
    }
}

pub(crate) fn kind_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Openai => "openai",
        ProviderKind::Bedrock => "bedrock",
        ProviderKind::Vertex => "vertex",
        ProviderKind::AzureOpenai => "azure-openai",
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
fn place(s: &Option<String>, path: &str, cx: &mut Cx) -> Option<String> {
    let s = s.as_ref()?;
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        Some(s.clone())
    } else {
        cx.err(path, "not a valid name (letters, digits, - and _)");
        None
    }
}

/// An Azure deployment: a URL path segment, where names such as `gpt-4.1-mini` are common
/// (and a model sent without a mapping is its own deployment, dots and all). A name of dots
/// alone would be read as a path step.
fn deployment_name(s: &Option<String>, path: &str, cx: &mut Cx) -> Option<String> {
    let s = s.as_ref()?;
    let fits = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if fits && !s.chars().all(|c| c == '.') {
        Some(s.clone())
    } else {
        cx.err(path, "not a valid name (letters, digits, -, _ and .)");
        None
    }
}

fn url(s: &Option<String>, path: &str, cx: &mut Cx) -> Option<String> {
    let s = s.as_ref()?;
    super::providers::normalize_base_url(s)
        .map_err(|m| cx.err(path, m))
        .ok()
}

fn non_empty(s: &Option<String>, path: &str, cx: &mut Cx) -> Option<String> {
    match s {
        Some(s) if s.trim().is_empty() => {
            cx.err(path, "must not be empty");
            None
        }
        other => other.clone(),
    }
}

fn bedrock(p: &ProviderFile, at: &str, cx: &mut Cx) -> Option<BedrockConfig> {
    let region = place(&p.region, &format!("{at}.region"), cx);
    let anthropic_version = non_empty(&p.anthropic_version, &format!("{at}.anthropic_version"), cx);
    let sts_endpoint = url(&p.sts_endpoint, &format!("{at}.sts_endpoint"), cx);
    let credentials_url = url(&p.credentials_url, &format!("{at}.credentials_url"), cx);
    let metadata_url = url(&p.metadata_url, &format!("{at}.metadata_url"), cx);
    let region = match p.region.is_some() {
        true => region?,
        // From the environment it is checked as the key is: it goes into host names.
        false => match ["AWS_REGION", "AWS_DEFAULT_REGION"]
            .into_iter()
            .find_map(|var| env(cx, var).map(|r| (var, r)))
        {
            Some((var, r)) => place(&Some(r), &format!("{at}.region ({var})"), cx)?,
            None => {
                cx.err(
                    &format!("{at}.region"),
                    "missing: set region (or AWS_REGION in the environment)",
                );
                return None;
            }
        },
    };
    let endpoints = AwsEndpoints {
        sts: sts_endpoint,
        container: credentials_url,
        metadata: metadata_url,
    };
    let credentials = aws_chain(p, at, cx, &region, endpoints);
    let unused_profile = match credentials {
        AwsSource::Static { .. } => env(cx, "AWS_PROFILE"),
        _ => None,
    };
    Some(BedrockConfig {
        region,
        anthropic_version: anthropic_version
            .unwrap_or_else(|| BEDROCK_ANTHROPIC_VERSION.to_owned()),
        credentials,
        unused_profile,
    })
}

/// The endpoints of the AWS chain that config can set (each else from the environment).
struct AwsEndpoints {
    sts: Option<String>,
    container: Option<String>,
    metadata: Option<String>,
}

/// The AWS default chain: environment keys, web identity, the shared credentials file, the
/// container endpoint, then the instance metadata service. Web identity comes before the file
/// as in botocore and the Java SDK (some SDKs read the file first): in a pod, the token the
/// IRSA webhook mounts is the identity asked for, and a credentials file baked into an image
/// is not. A `credentials_file` in legate's config is asked for by name: it comes first.
fn aws_chain(
    p: &ProviderFile,
    at: &str,
    cx: &mut Cx,
    region: &str,
    endpoints: AwsEndpoints,
) -> AwsSource {
    let configured = p
        .credentials_file
        .clone()
        .filter(|f| !f.as_os_str().is_empty());
    if let Some(file) = configured {
        return aws_profile(Some(file), at, cx).unwrap_or(AwsSource::Missing);
    }
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
        let sts_endpoint = endpoints
            .sts
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
    if let Some(source) = aws_profile(None, at, cx) {
        return source;
    }
    let url = endpoints
        .container
        .or_else(|| env(cx, "AWS_CONTAINER_CREDENTIALS_FULL_URI"))
        .or_else(|| {
            env(cx, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                .map(|p| format!("http://169.254.170.2{p}"))
        });
    if let Some(url) = url {
        return AwsSource::Container {
            url,
            auth_token_file: env(cx, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").map(PathBuf::from),
            auth_token: env(cx, "AWS_CONTAINER_AUTHORIZATION_TOKEN").map(Secret::new),
        };
    }
    let disabled =
        env(cx, "AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    // A `metadata_url` in the file is asked for: the variable does not turn it off.
    if let Some(url) = endpoints.metadata {
        return AwsSource::Instance { url };
    }
    if disabled {
        return AwsSource::Missing;
    }
    let url = match env(cx, "AWS_EC2_METADATA_SERVICE_ENDPOINT") {
        None => "http://169.254.169.254".to_owned(),
        Some(u) => match super::providers::normalize_base_url(&u) {
            Ok(u) => u,
            Err(m) => {
                cx.err(
                    &format!("{at}.metadata_url (AWS_EC2_METADATA_SERVICE_ENDPOINT)"),
                    m,
                );
                return AwsSource::Missing;
            }
        },
    };
    AwsSource::Instance { url }
}

/// The shared credentials file's source, when it holds the profile's keys: `configured`
/// (`credentials_file`), else `AWS_SHARED_CREDENTIALS_FILE` (a leading `~/` is the home
/// directory, as the SDKs read it), else `~/.aws/credentials`; the profile `AWS_PROFILE`,
/// else `default`. A file or a profile the operator named that gives no keys is an error, as
/// is a profile with one key of the two: the SDKs would find such a profile in
/// `~/.aws/config` (SSO, a role, a process, or keys), which legate does not read, and going on
/// down the chain would serve under another identity than the one asked for.
fn aws_profile(configured: Option<PathBuf>, at: &str, cx: &mut Cx) -> Option<AwsSource> {
    use crate::config::aws_profile::{Found, find, read};
    let named = env(cx, "AWS_PROFILE");
    let home = env(cx, "HOME");
    let file = match configured.clone() {
        Some(f) => Some(f),
        None => match env(cx, "AWS_SHARED_CREDENTIALS_FILE") {
            Some(f) => match (f.strip_prefix("~/"), &home) {
                (Some(rest), Some(home)) => Some(PathBuf::from(home).join(rest)),
                _ => Some(PathBuf::from(f)),
            },
            None => home
                .as_ref()
                .map(|h| PathBuf::from(h).join(".aws").join("credentials")),
        },
    };
    let profile = named.clone().unwrap_or_else(|| "default".to_owned());
    let shown_profile = || crate::config::shown::shown(&profile).into_owned();
    const NOT_READ: &str = "legate reads a profile's static keys from the shared credentials \
         file only, not ~/.aws/config, nor its SSO, role_arn or credential_process profiles";
    let problem = match &file {
        None => format!(
            "no shared credentials file to find profile `{}` in (HOME is not set)",
            shown_profile()
        ),
        Some(file) => {
            let shown_file = || crate::config::shown::shown(&file.to_string_lossy()).into_owned();
            match read(file) {
                Ok(text) => match find(&text, &profile) {
                    Found::Keys(_) => {
                        return Some(AwsSource::Profile {
                            file: file.clone(),
                            profile,
                        });
                    }
                    Found::Partial => {
                        // One key of two is a mistake wherever it is: never passed over.
                        cx.err(
                            at,
                            format!(
                                "profile `{}` in {} has only one of aws_access_key_id and \
                                 aws_secret_access_key",
                                shown_profile(),
                                shown_file()
                            ),
                        );
                        return None;
                    }
                    Found::NoKeys => format!(
                        "profile `{}` in {} has no aws_access_key_id and \
                         aws_secret_access_key ({NOT_READ})",
                        shown_profile(),
                        shown_file()
                    ),
                    Found::NoProfile { config_style } => format!(
                        "{} has no profile `{}`{} ({NOT_READ})",
                        shown_file(),
                        shown_profile(),
                        if config_style {
                            format!(
                                "; a `[profile {}]` section is ~/.aws/config's form: in the \
                                 credentials file it is written `[{}]`",
                                shown_profile(),
                                shown_profile()
                            )
                        } else {
                            String::new()
                        }
                    ),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    format!("{} does not exist ({NOT_READ})", shown_file())
                }
                Err(e) => format!("cannot read {}: {e}", shown_file()),
            }
        }
    };
    if configured.is_some() {
        cx.err(&format!("{at}.credentials_file"), problem);
    } else if named.is_some() {
        cx.err(
            at,
            format!("AWS_PROFILE names a profile legate cannot use: {problem}"),
        );
    }
    None
}

fn vertex(p: &ProviderFile, at: &str, cx: &mut Cx) -> Option<VertexConfig> {
    let project = cx.required(p.project.as_ref(), &format!("{at}.project"));
    let region = cx.required(p.region.as_ref(), &format!("{at}.region"));
    let project = project.and_then(|_| place(&p.project, &format!("{at}.project"), cx));
    let region = region.and_then(|_| place(&p.region, &format!("{at}.region"), cx));
    let anthropic_version = non_empty(&p.anthropic_version, &format!("{at}.anthropic_version"), cx);
    let metadata_url = url(&p.metadata_url, &format!("{at}.metadata_url"), cx);
    let token_url = url(&p.token_url, &format!("{at}.token_url"), cx);
    let file = p
        .credentials_file
        .clone()
        .filter(|f| !f.as_os_str().is_empty());
    let credentials =
        match file.or_else(|| env(cx, "GOOGLE_APPLICATION_CREDENTIALS").map(PathBuf::from)) {
            Some(path) => GoogleSource::File { path, token_url },
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

fn azure(p: &ProviderFile, key: &KeySource, at: &str, cx: &mut Cx) -> AzureConfig {
    let api_version = non_empty(&p.api_version, &format!("{at}.api_version"), cx);
    let token_url = url(&p.token_url, &format!("{at}.token_url"), cx);
    let deployments = deployments(p.deployments.as_deref().unwrap_or(&[]), at, cx);
    match p.base_url.as_deref().map(|u| u.trim_end_matches('/')) {
        None => cx.err(
            &format!("{at}.base_url"),
            "missing: an azure-openai provider needs its resource endpoint \
             (https://NAME.openai.azure.com)",
        ),
        // The SDKs' instructions for the v1 surface name `…/openai/v1/`: legate adds the
        // path itself, and every call would go to `/openai/v1/openai/v1/…` and get 404.
        Some(u) if u.ends_with("/openai") || u.ends_with("/openai/v1") => cx.err(
            &format!("{at}.base_url"),
            "give the resource endpoint alone (https://NAME.openai.azure.com): legate adds \
             /openai/deployments/… and /openai/v1/… itself",
        ),
        Some(_) => {}
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
    AzureConfig {
        api_version: api_version.unwrap_or_else(|| AZURE_API_VERSION.to_owned()),
        deployments,
        credentials,
    }
}

/// Model name the caller sends → deployment name.
fn deployments(items: &[DeploymentFile], at: &str, cx: &mut Cx) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (i, d) in items.iter().enumerate() {
        let p = format!("{at}.deployments[{i}]");
        let model = cx.required(d.model.clone(), &format!("{p}.model"));
        let deployment = cx.required(d.deployment.as_ref(), &format!("{p}.deployment"));
        let deployment =
            deployment.and_then(|_| deployment_name(&d.deployment, &format!("{p}.deployment"), cx));
        if let (Some(m), Some(d)) = (model, deployment)
            && out.insert(m.clone(), d).is_some()
        {
            cx.err(&p, format!("model `{m}` is listed twice"));
        }
    }
    out
}
