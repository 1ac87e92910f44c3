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
    // Nothing else set: the chain ends at the instance metadata service, unless it is off.
    assert_eq!(
        aws(&cfg),
        &AwsSource::Instance {
            url: "http://169.254.169.254".into()
        }
    );
    let off = [("AWS_EC2_METADATA_DISABLED", "TRUE")];
    assert_eq!(aws(&load(BEDROCK, &off)), &AwsSource::Missing);

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
fn bedrock_reads_a_profile_of_the_shared_credentials_file_after_environment_keys() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".aws")).unwrap();
    let home_file = dir.path().join(".aws").join("credentials");
    std::fs::write(
        &home_file,
        "[default]\naws_access_key_id = AKIDHOME\naws_secret_access_key = s\n\
         [sso]\nsso_session = corp\n",
    )
    .unwrap();
    let home = dir.path().display().to_string();
    assert_eq!(
        aws(&load(BEDROCK, &[("HOME", home.as_str())])),
        &AwsSource::Profile {
            file: home_file.clone(),
            profile: "default".into()
        }
    );
    // Web identity comes before it (a file baked into an image is not the pod's identity),
    // and environment keys before both.
    let web = [
        ("HOME", home.as_str()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
    ];
    assert!(matches!(
        aws(&load(BEDROCK, &web)),
        AwsSource::WebIdentity { .. }
    ));
    let keys = [
        ("HOME", home.as_str()),
        ("AWS_ACCESS_KEY_ID", "AKID"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
    ];
    assert!(matches!(
        aws(&load(BEDROCK, &keys)),
        AwsSource::Static { .. }
    ));
    // A file named in legate's config is asked for: it comes first.
    let toml = format!("{BEDROCK}credentials_file = \"{}\"\n", home_file.display());
    assert!(matches!(
        aws(&load(&toml, &keys)),
        AwsSource::Profile { .. }
    ));

    // AWS_SHARED_CREDENTIALS_FILE and AWS_PROFILE choose the file and the profile.
    let other = dir.path().join("creds");
    std::fs::write(
        &other,
        "[ci]\naws_access_key_id=A\naws_secret_access_key=B\n",
    )
    .unwrap();
    let other_s = other.display().to_string();
    let chosen = [
        ("HOME", home.as_str()),
        ("AWS_SHARED_CREDENTIALS_FILE", other_s.as_str()),
        ("AWS_PROFILE", "ci"),
    ];
    // `~/` is the home directory, as the SDKs read the variable.
    let tilde = [
        ("HOME", home.as_str()),
        ("AWS_SHARED_CREDENTIALS_FILE", "~/creds"),
        ("AWS_PROFILE", "ci"),
    ];
    assert!(matches!(
        aws(&load(BEDROCK, &tilde)),
        AwsSource::Profile { .. }
    ));
    assert_eq!(
        aws(&load(BEDROCK, &chosen)),
        &AwsSource::Profile {
            file: other.clone(),
            profile: "ci".into()
        }
    );
    // No default profile there, and none named: the chain goes on.
    let unnamed = [("AWS_SHARED_CREDENTIALS_FILE", other_s.as_str())];
    assert!(matches!(
        aws(&load(BEDROCK, &unnamed)),
        AwsSource::Instance { .. }
    ));

    // A profile the operator named that gives no keys is refused, not passed over for
    // another identity; so is one without a HOME to find the file in.
    let named = |profile: &'static str, with_home: bool| {
        let mut pairs = vec![("AWS_PROFILE", profile)];
        if with_home {
            pairs.push(("HOME", home.as_str()));
        }
        load_str(&format!("{DIRECT}{BEDROCK}"), &env_of(&pairs))
    };
    for (profile, with_home, said) in [
        ("sso", true, "~/.aws/config"),
        ("absent", true, "has no profile `absent`"),
        ("default", false, "HOME is not set"),
    ] {
        let errs = named(profile, with_home).expect_err("an unusable named profile");
        assert!(errs.has_path("providers.br"), "{errs}");
        let text = errs.to_string();
        assert!(
            text.contains("AWS_PROFILE") && text.contains(said),
            "{text}"
        );
    }
    // One key of two is refused even in the default profile, and a `[profile x]` section is
    // told apart.
    std::fs::write(
        &home_file,
        "[default]\naws_access_key_id = AKIDHOME\n[profile dev]\naws_access_key_id = A\n",
    )
    .unwrap();
    let errs = load_str(
        &format!("{DIRECT}{BEDROCK}"),
        &env_of(&[("HOME", home.as_str())]),
    )
    .expect_err("half a key pair");
    assert!(errs.to_string().contains("only one of"), "{errs}");
    let errs = named("dev", true).expect_err("a config-style section");
    assert!(errs.to_string().contains("`[dev]`"), "{errs}");
    // So is a configured file that does not hold it.
    let toml = format!(
        "{BEDROCK}credentials_file = \"{}\"\n",
        dir.path().join("nope").display()
    );
    let errs = load_str(&format!("{DIRECT}{toml}"), &env_of(&[]))
        .expect_err("a configured file that is not there");
    assert!(errs.has_path("providers.br.credentials_file"), "{errs}");
    let toml = format!("{BEDROCK}credentials_file = \"{}\"\n", other.display());
    assert!(matches!(
        aws(&load(&toml, &[("AWS_PROFILE", "ci")])),
        AwsSource::Profile { .. }
    ));
}

#[test]
fn environment_keys_beside_a_named_profile_are_used_and_check_says_so() {
    let both = [
        ("AWS_ACCESS_KEY_ID", "AKID"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
        ("AWS_PROFILE", "dev"),
    ];
    let cfg = load(BEDROCK, &both);
    assert!(matches!(aws(&cfg), AwsSource::Static { .. }));
    let warned = crate::config::render::warnings(&cfg);
    assert!(
        warned
            .iter()
            .any(|w| w.starts_with("providers.br: AWS_PROFILE names profile `dev`")),
        "{warned:?}"
    );
    // Keys alone: nothing to say.
    let cfg = load(BEDROCK, &both[..2]);
    assert!(
        !crate::config::render::warnings(&cfg)
            .iter()
            .any(|w| w.contains("AWS_PROFILE"))
    );
}

#[test]
fn bedrock_instance_metadata_endpoint_comes_from_config_or_the_environment() {
    let bad = [("AWS_EC2_METADATA_SERVICE_ENDPOINT", "not a url")];
    let errs = load_str(&format!("{DIRECT}{BEDROCK}"), &env_of(&bad)).expect_err("a bad URL");
    assert!(
        errs.to_string()
            .contains("AWS_EC2_METADATA_SERVICE_ENDPOINT"),
        "{errs}"
    );
    let env = [(
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
        "http://[fd00:ec2::254]/",
    )];
    assert_eq!(
        aws(&load(BEDROCK, &env)),
        &AwsSource::Instance {
            url: "http://[fd00:ec2::254]".into()
        }
    );
    // Set in the file, it is asked for: the variable that turns the default off does not.
    let toml = format!("{BEDROCK}metadata_url = \"http://127.0.0.1:9/\"\n");
    assert_eq!(
        aws(&load(&toml, &[("AWS_EC2_METADATA_DISABLED", "true")])),
        &AwsSource::Instance {
            url: "http://127.0.0.1:9".into()
        }
    );
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
    // The SDKs' base URL for the v1 surface, pasted: legate adds those paths itself.
    for pasted in ["/openai/v1/", "/openai/v1", "/openai"] {
        refused_at(
            &format!(
                "[providers.az]\nkind = \"azure-openai\"\nbase_url = \"https://r.openai.azure.com{pasted}\"\n"
            ),
            "providers.az.base_url",
        );
    }
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
