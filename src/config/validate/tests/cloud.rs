//! The cloud provider kinds: their keys, and the credential source chosen from the environment.

use super::{no_env, refused_at};
use crate::config::cloud::{AwsSource, AzureSource, GoogleSource, Platform};
use crate::config::load::env_of;
use crate::config::{ApiKind, AuthHeader, Config, load_str, render_masked};

/// The two direct providers every config needs for its default routes.
const DIRECT: &str = "[providers.anthropic]\n[providers.openai]\n";

fn load(toml: &str, pairs: &[(&str, &str)]) -> Config {
    match load_str(&format!("{DIRECT}{toml}"), &env_of(pairs)) {
        Ok(c) => c,
        Err(e) => panic!("config refused:\n{e}"),
    }
}

const BEDROCK: &str = "[providers.br]\nkind = \"bedrock\"\nregion = \"eu-west-1\"\n";

fn aws(cfg: &Config) -> &AwsSource {
    match &cfg.providers["br"].platform {
        Platform::Bedrock(b) => &b.credentials,
        other => panic!("not bedrock: {other:?}"),
    }
}

#[test]
fn bedrock_follows_the_aws_default_chain() {
    let cfg = load(BEDROCK, &[]);
    assert_eq!(cfg.providers["br"].kind, ApiKind::Anthropic);
    assert_eq!(
        cfg.providers["br"].base_url,
        "https://bedrock-runtime.eu-west-1.amazonaws.com"
    );
    assert!(matches!(aws(&cfg), AwsSource::Missing));

    let keys = [
        ("AWS_ACCESS_KEY_ID", "AKID"),
        ("AWS_SECRET_ACCESS_KEY", "CANARY-secret"),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
    ];
    assert!(matches!(
        aws(&load(BEDROCK, &keys)),
        AwsSource::Static { .. }
    ));

    let web = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
        ("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9/"),
    ];
    match aws(&load(BEDROCK, &web)) {
        AwsSource::WebIdentity { sts_endpoint, .. } => {
            assert_eq!(sts_endpoint, "http://127.0.0.1:9")
        }
        other => panic!("{other:?}"),
    }
    let toml = format!("{BEDROCK}sts_endpoint = \"http://127.0.0.1:7\"\n");
    match aws(&load(&toml, &web)) {
        AwsSource::WebIdentity { sts_endpoint, .. } => {
            assert_eq!(sts_endpoint, "http://127.0.0.1:7")
        }
        other => panic!("{other:?}"),
    }

    let pod = [
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://169.254.170.23/v1/credentials",
        ),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            "/var/run/eks-token",
        ),
    ];
    match aws(&load(BEDROCK, &pod)) {
        AwsSource::Container {
            url,
            auth_token_file,
            ..
        } => {
            assert_eq!(url, "http://169.254.170.23/v1/credentials");
            assert!(auth_token_file.is_some());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bedrock_needs_a_region_and_platform_keys_stay_on_platforms() {
    refused_at(
        "[providers.br]\nkind = \"bedrock\"\n",
        "providers.br.region",
    );
    let cfg = load(
        "[providers.br]\nkind = \"bedrock\"\n",
        &[("AWS_REGION", "us-west-2")],
    );
    assert!(cfg.providers["br"].base_url.contains("us-west-2"));
    // From the environment, a region is held to the same rule: it goes into host names.
    let errs = load_str(
        &format!("{DIRECT}[providers.br]\nkind = \"bedrock\"\n"),
        &env_of(&[("AWS_REGION", "evil.example.com/x?")]),
    )
    .expect_err("a region that is no name");
    assert!(errs.to_string().contains("providers.br.region"), "{errs}");
    refused_at(
        "[providers.anthropic]\nregion = \"us-east-1\"\n",
        "providers.anthropic.region",
    );
    refused_at(
        "[providers.v]\nkind = \"vertex\"\nregion = \"us-east5\"\n",
        "providers.v.project",
    );
    refused_at(
        "[providers.br]\nkind = \"bedrock\"\nregion = \"us east\"\n",
        "providers.br.region",
    );
    refused_at("[providers.x]\nkind = \"watsonx\"\n", "providers.x.kind");
}

#[test]
fn vertex_uses_the_credentials_file_else_the_metadata_server() {
    let toml = "[providers.v]\nkind = \"vertex\"\nproject = \"p\"\nregion = \"global\"\n";
    let source = |cfg: &Config| match &cfg.providers["v"].platform {
        Platform::Vertex(v) => v.credentials.clone(),
        other => panic!("{other:?}"),
    };
    let cfg = load(toml, &[("GCE_METADATA_HOST", "127.0.0.1:8")]);
    assert_eq!(
        cfg.providers["v"].base_url,
        "https://aiplatform.googleapis.com"
    );
    assert!(matches!(source(&cfg), GoogleSource::Metadata { url } if url == "http://127.0.0.1:8"));
    let cfg = load(toml, &[("GOOGLE_APPLICATION_CREDENTIALS", "/etc/sa.json")]);
    assert!(matches!(source(&cfg), GoogleSource::File { .. }));
}

#[test]
fn azure_uses_its_api_key_else_workload_identity() {
    let base =
        "[providers.az]\nkind = \"azure-openai\"\nbase_url = \"https://r.openai.azure.com\"\n";
    let fed = [
        ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/azure-token"),
        ("AZURE_CLIENT_ID", "cid"),
        ("AZURE_TENANT_ID", "tid"),
    ];
    let cfg = load(base, &fed);
    assert_eq!(cfg.providers["az"].kind, ApiKind::OpenAi);
    match &cfg.providers["az"].platform {
        Platform::AzureOpenAi(a) => match &a.credentials {
            AzureSource::WorkloadIdentity { token_url, .. } => {
                assert_eq!(
                    token_url,
                    "https://login.microsoftonline.com/tid/oauth2/v2.0/token"
                );
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let keyed = format!(
        "{base}api_key_env = \"AZ_KEY\"\ndeployments = [{{ model = \"gpt-4.1\", deployment = \"prod\" }}, {{ model = \"mini\", deployment = \"gpt-4.1-mini\" }}]\n"
    );
    let cfg = load(&keyed, &fed);
    assert_eq!(cfg.providers["az"].auth_header, AuthHeader::ApiKey);
    match &cfg.providers["az"].platform {
        Platform::AzureOpenAi(a) => {
            assert!(matches!(a.credentials, AzureSource::ApiKey));
            assert_eq!(a.deployment("gpt-4.1"), "prod");
            assert_eq!(a.deployment("mini"), "gpt-4.1-mini");
            assert_eq!(a.deployment("other"), "other");
        }
        other => panic!("{other:?}"),
    }
    refused_at(
        "[providers.az]\nkind = \"azure-openai\"\n",
        "providers.az.base_url",
    );
    for bad in ["..", "a/b", "gpt 4"] {
        let errs = load_str(
            &format!(
                "{DIRECT}{base}api_key_env = \"AZ_KEY\"\ndeployments = [{{ model = \"m\", deployment = \"{bad}\" }}]\n"
            ),
            &env_of(&fed),
        )
        .expect_err(bad);
        assert!(
            errs.to_string()
                .contains("providers.az.deployments[0].deployment"),
            "{bad}: {errs}"
        );
    }
    let _ = no_env();
}

#[test]
fn check_output_names_the_credential_source_and_no_secret() {
    let keys = [
        ("AWS_ACCESS_KEY_ID", "AKIDCANARY"),
        ("AWS_SECRET_ACCESS_KEY", "CANARY-secret"),
        ("AWS_SESSION_TOKEN", "CANARY-session"),
    ];
    let text = render_masked(&load(BEDROCK, &keys));
    assert!(text.contains("kind = \"bedrock\""), "{text}");
    assert!(
        text.contains("# credentials: environment access keys"),
        "{text}"
    );
    assert!(!text.contains("CANARY"), "{text}");
}
