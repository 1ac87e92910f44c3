//! What `legate check` shows: the effective configuration, serialised from the same structs the
//! file is read into ([`super::file`]) with every default filled in and every secret masked;
//! the warnings that do not make it invalid; and a stable hash of it.
//!
//! The rendering is itself a loadable configuration, apart from masked values: collector
//! header values read `[redacted]`, client key digests show their first 8 hex digits, URL
//! userinfo shows as `***`. Where each provider's credential comes from, which no key says, is
//! a comment under the provider's table.

use std::collections::BTreeMap;
use std::num::{NonZeroU64, NonZeroUsize};

use sha2::{Digest, Sha256};

use super::adapt::{PerMtok, mask_userinfo};
use super::cloud::{AwsSource, AzureSource, GoogleSource, Platform};
use super::file::{
    ClientFile, DeploymentFile, FileConfig, LimitFile, ModelFile, PriceFile, ProviderFile,
    ProviderKind, RoutingFile, ServerFile, StepFile, StepTable, TelemetryFile,
};
use super::secret::Secret;
use crate::config::{ApiKind, ChainStep, Config, KeySource, ProviderConfig};

/// The effective config as TOML, secrets masked (variable names and file paths are shown).
pub fn render_masked(cfg: &Config) -> String {
    let body = toml::to_string(&effective(cfg))
        .unwrap_or_else(|e| format!("# the configuration cannot be shown: {e}\n"));
    let mut out = String::from("# legate: effective configuration (secrets masked)\n\n");
    for line in body.lines() {
        out.push_str(line);
        out.push('\n');
        for note in notes(cfg, line) {
            out.push_str("# ");
            out.push_str(&note);
            out.push('\n');
        }
    }
    out
}

/// Stable hash (sha256 hex) of [`render_masked`], for `/admin/state`.
pub fn config_hash(cfg: &Config) -> String {
    hex::encode(Sha256::digest(render_masked(cfg).as_bytes()))
}

/// Comments shown under a table header: what the keys cannot say.
fn notes(cfg: &Config, line: &str) -> Vec<String> {
    if line == "[telemetry]" {
        let t = &cfg.observe.telemetry;
        if t.enabled() && common_base(cfg).is_none() {
            let shown = |u: &Option<String>| u.as_deref().map_or("off".into(), mask_userinfo);
            return vec![format!(
                "export: traces {}, metrics {}",
                shown(&t.traces_endpoint),
                shown(&t.metrics_endpoint)
            )];
        }
        return Vec::new();
    }
    let Some(name) = line
        .strip_prefix("[providers.")
        .and_then(|l| l.strip_suffix(']'))
    else {
        return Vec::new();
    };
    let Some(p) = cfg.providers.get(name.trim_matches('"')) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match &p.key {
        KeySource::Env { var, value } => out.push(format!(
            "key: from {var}, {}",
            if value.is_some() {
                "set (value masked)"
            } else {
                "not set"
            }
        )),
        KeySource::File { .. } => out.push("key: from api_key_file, re-read on change".into()),
        KeySource::None if owns_credential(&p.platform) => {}
        KeySource::None => out.push("no provider key".into()),
    }
    if let Some(source) = p.platform.credential_source() {
        out.push(format!("credentials: {source}"));
    }
    out
}

/// The base URL both OTLP endpoints were built from, if they were.
fn common_base(cfg: &Config) -> Option<String> {
    let t = &cfg.observe.telemetry;
    let traces = t.traces_endpoint.as_deref()?.strip_suffix("/v1/traces")?;
    let metrics = t.metrics_endpoint.as_deref()?.strip_suffix("/v1/metrics")?;
    (traces == metrics).then(|| traces.to_owned())
}

/// The runtime config put back into the shape of the file.
pub fn effective(cfg: &Config) -> FileConfig {
    let s = &cfg.server;
    let l = &s.limits;
    let nz = |n: usize| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN);
    let server = ServerFile {
        listen: s.listen,
        admin_listen: s.admin_listen,
        max_body_bytes: nz(s.max_body_bytes),
        default_deadline: s.default_deadline,
        shutdown_grace: s.shutdown_grace,
        worker_threads: s.worker_threads,
        header_read_timeout: l.header_read_timeout,
        body_read_timeout: l.body_read_timeout,
        connection_idle_timeout: l.connection_idle_timeout,
        max_connections: nz(l.max_connections),
        admin_max_connections: nz(l.admin_max_connections),
        max_event_bytes: nz(l.max_event_bytes),
        max_buffered_bytes: nz(l.max_buffered_bytes),
    };
    let t = &cfg.observe.telemetry;
    let headers: BTreeMap<String, Secret> = t
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Secret::new(v.clone())))
        .collect();
    FileConfig {
        server,
        providers: cfg
            .providers
            .iter()
            .map(|(name, p)| (name.clone(), provider(p)))
            .collect(),
        models: cfg
            .models
            .iter()
            .map(|m| ModelFile {
                name: Some(m.name.clone()),
                chain: Some(m.chain.iter().map(step).collect()),
            })
            .collect(),
        routing: RoutingFile {
            anthropic: Some(cfg.routing.anthropic.clone()).filter(|p| !p.is_empty()),
            openai: Some(cfg.routing.openai.clone()).filter(|p| !p.is_empty()),
        },
        clients: cfg
            .clients
            .iter()
            .map(|c| ClientFile {
                tenant: Some(c.tenant.clone()),
                key_sha256: Some(hex::encode(c.key_sha256)),
            })
            .collect(),
        tenants: cfg.tenants.clone(),
        ratelimit: cfg.ratelimit.clone(),
        shedding: cfg.shedding.clone(),
        responses: cfg.responses.clone(),
        retry: cfg.retry.clone(),
        breaker: cfg.breaker.clone(),
        log: cfg.observe.log.clone(),
        telemetry: TelemetryFile {
            otlp_endpoint: common_base(cfg),
            service_name: Some(t.service_name.clone()),
            export_timeout: Some(t.export_timeout),
            metrics_interval: Some(t.metrics_interval),
            queue_size: NonZeroUsize::new(t.queue_size),
            headers: (!headers.is_empty()).then_some(headers),
        },
        journal: cfg.observe.journal.clone(),
        prices: cfg
            .prices
            .iter()
            .map(|(model, p)| PriceFile {
                model: Some(model.clone()),
                input: Some(PerMtok(p.input)),
                output: Some(PerMtok(p.output)),
                cache_write: PerMtok(p.cache_write),
                cache_read: PerMtok(p.cache_read),
            })
            .collect(),
        limits: cfg
            .limits
            .iter()
            .map(|l| LimitFile {
                model: Some(l.model.clone()),
                max_output_tokens: NonZeroU64::new(l.max_output_tokens),
            })
            .collect(),
    }
}

fn step(s: &ChainStep) -> StepFile {
    if s.max_tokens.is_none() && !s.drop_thinking {
        return StepFile::Target(s.target().to_owned());
    }
    StepFile::Fitted(StepTable {
        target: Some(s.target().to_owned()),
        max_tokens: s.max_tokens.and_then(NonZeroU64::new),
        drop_thinking: s.drop_thinking,
    })
}

fn provider(p: &ProviderConfig) -> ProviderFile {
    let kind = match (&p.platform, p.kind) {
        (Platform::Bedrock(_), _) => ProviderKind::Bedrock,
        (Platform::Vertex(_), _) => ProviderKind::Vertex,
        (Platform::AzureOpenAi(_), _) => ProviderKind::AzureOpenai,
        (Platform::Direct, ApiKind::Anthropic) => ProviderKind::Anthropic,
        // The Responses API is never a provider's kind: its `openai` provider says it serves it.
        (Platform::Direct, ApiKind::OpenAi | ApiKind::Responses) => ProviderKind::Openai,
    };
    let mut f = ProviderFile {
        kind: Some(kind),
        base_url: Some(p.base_url.clone()),
        auth_header: Some(p.auth_header),
        connect_timeout: p.connect_timeout,
        first_byte_timeout: p.first_byte_timeout,
        idle_timeout: p.idle_timeout,
        pool_idle_timeout: p.pool_idle_timeout,
        max_concurrency: NonZeroUsize::new(p.max_concurrency).unwrap_or(NonZeroUsize::MIN),
        tls_roots: p.tls_roots,
        ca_file: p.ca_file.clone(),
        client_cert_file: p.client_cert_file.clone(),
        client_key_file: p.client_key_file.clone(),
        responses: (p.kind == ApiKind::OpenAi).then_some(p.responses),
        ..ProviderFile::default()
    };
    match &p.key {
        KeySource::Env { var, .. } => f.api_key_env = Some(var.clone()),
        KeySource::File { path } => f.api_key_file = Some(path.clone()),
        KeySource::None => {}
    }
    match &p.platform {
        Platform::Direct => {}
        Platform::Bedrock(b) => {
            f.region = Some(b.region.clone());
            f.anthropic_version = Some(b.anthropic_version.clone());
        }
        Platform::Vertex(v) => {
            f.project = Some(v.project.clone());
            f.region = Some(v.region.clone());
            f.anthropic_version = Some(v.anthropic_version.clone());
        }
        Platform::AzureOpenAi(a) => {
            f.api_version = Some(a.api_version.clone());
            f.deployments = (!a.deployments.is_empty()).then(|| {
                a.deployments
                    .iter()
                    .map(|(m, d)| DeploymentFile {
                        model: Some(m.clone()),
                        deployment: Some(d.clone()),
                    })
                    .collect()
            });
        }
    }
    f
}

/// Problems that do not make the config invalid but that an operator should know about.
pub fn warnings(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (route, api) in [
        (&cfg.routing.anthropic, "the Anthropic API (/v1/messages)"),
        (
            &cfg.routing.openai,
            "the OpenAI APIs (/v1/chat/completions, /v1/responses)",
        ),
    ] {
        if route.is_empty() {
            out.push(format!(
                "routing: no provider speaks {api}; on it legate serves only the names \
                 [[models]] routes (translated), and any other model is 404 model_not_found"
            ));
        }
    }
    for p in cfg.providers.values() {
        provider_warnings(p, &mut out);
    }
    if !crate::loopback::is_loopback_ip(cfg.server.admin_listen.ip()) {
        out.push(format!(
            "server.admin_listen: `{}` is reachable from other hosts, and the admin plane has \
             no authentication",
            cfg.server.admin_listen
        ));
    }
    for model in cfg.prices.keys() {
        let provider = model.split_once(':').map_or(model.as_str(), |(p, _)| p);
        if !cfg.providers.contains_key(provider) {
            out.push(format!(
                "prices: `{model}` names provider `{provider}`, which is not configured"
            ));
        }
    }
    out
}

fn provider_warnings(p: &ProviderConfig, out: &mut Vec<String>) {
    let at = format!("providers.{}", p.name);
    match &p.key {
        KeySource::Env { var, value: None } => out.push(format!(
            "{at}: {var} is not set; requests to this provider will fail until it is"
        )),
        // A cloud provider with its own credential source needs no key.
        KeySource::None if owns_credential(&p.platform) => {}
        KeySource::None if p.base_url.starts_with("https://") => out.push(format!(
            "{at}: no api_key_env or api_key_file; requests are sent without a provider key"
        )),
        KeySource::File { path } if readable_by_others(path) => out.push(format!(
            "{at}.api_key_file: `{}` is readable by other users; restrict it (chmod 600)",
            path.display()
        )),
        _ => {}
    }
    let sends_key = !matches!(p.key, KeySource::None);
    if sends_key && key_in_the_clear(&p.base_url) {
        out.push(format!(
            "{at}.base_url: the provider key is sent over plain http:// to `{}`, which is not \
             this host; use https://",
            mask_userinfo(&p.base_url)
        ));
    }
    credential_endpoint_warnings(p, &at, out);
    if let Platform::Bedrock(b) = &p.platform
        && let Some(profile) = &b.unused_profile
    {
        out.push(format!(
            "{at}: AWS_PROFILE names profile `{}`, but AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY are set and come first in the AWS chain: the profile is not \
             used (unset them to use it)",
            crate::config::shown::shown(profile)
        ));
    }
    if p.base_url.starts_with("http://") {
        let tls_files = [
            ("ca_file", &p.ca_file),
            ("client_cert_file", &p.client_cert_file),
        ];
        for (key, file) in tls_files {
            if file.is_some() {
                out.push(format!(
                    "{at}.{key}: unused, base_url is plain http (no TLS)"
                ));
            }
        }
    }
}

/// A credential endpoint reached over plain `http://` on another host: what legate sends it
/// (a web-identity token, a container authorization token, a signed assertion) and the
/// credential it answers with cross the network in the clear. The container endpoints' own
/// link-local addresses (ECS 169.254.170.2, EKS Pod Identity 169.254.170.23 and
/// fd00:ec2::23) are plain http by design, as the AWS SDKs allow; so is a metadata server.
fn credential_endpoint_warnings(p: &ProviderConfig, at: &str, out: &mut Vec<String>) {
    let (key, url) = match &p.platform {
        Platform::Bedrock(b) => match &b.credentials {
            AwsSource::WebIdentity { sts_endpoint, .. } => ("sts_endpoint", sts_endpoint),
            AwsSource::Container { url, .. } if !aws_container_host(url) => {
                ("credentials_url", url)
            }
            _ => return,
        },
        Platform::Vertex(v) => match &v.credentials {
            GoogleSource::File {
                token_url: Some(url),
                ..
            } => ("token_url", url),
            _ => return,
        },
        Platform::AzureOpenAi(a) => match &a.credentials {
            AzureSource::WorkloadIdentity { token_url, .. } => ("token_url", token_url),
            AzureSource::ApiKey => return,
        },
        Platform::Direct => return,
    };
    if key_in_the_clear(url) {
        out.push(format!(
            "{at}.{key}: credentials are fetched over plain http:// from `{}`, which is not \
             this host; use https://",
            mask_userinfo(url)
        ));
    }
}

/// Whether `url` names one of the container credentials endpoints' link-local addresses.
fn aws_container_host(url: &str) -> bool {
    url.parse::<http::Uri>().is_ok_and(|u| {
        matches!(
            u.host(),
            Some("169.254.170.2" | "169.254.170.23" | "[fd00:ec2::23]")
        )
    })
}

/// Whether a provider's credential comes from its platform (pod identity), not a key.
fn owns_credential(p: &Platform) -> bool {
    match p {
        Platform::Direct => false,
        Platform::AzureOpenAi(a) => !matches!(a.credentials, AzureSource::ApiKey),
        Platform::Bedrock(_) | Platform::Vertex(_) => true,
    }
}

/// Whether a provider key goes in the clear to another host: plain `http://` to a host that is
/// not a loopback address.
fn key_in_the_clear(base_url: &str) -> bool {
    let Some(rest) = base_url.strip_prefix("http://") else {
        return false;
    };
    let Ok(uri) = format!("http://{rest}").parse::<http::Uri>() else {
        return false;
    };
    !crate::loopback::is_loopback_host(uri.host().unwrap_or(""))
}

/// Key files other users can read (POSIX only).
fn readable_by_others(file: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(file).is_ok_and(|m| m.permissions().mode() & 0o004 != 0)
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        false
    }
}

#[cfg(test)]
mod tests {

    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::config::load::{env_of, temp_file};
    use crate::config::load_str;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const SECRET: &str = "sk-ant-api03-DO-NOT-PRINT";

    #[test]
    fn secrets_never_appear_in_the_rendering_or_debug_output() -> TestResult {
        let (_dir, key_file) = temp_file("openai-key", "sk-file-DO-NOT-PRINT")?;
        let toml = format!(
            "[providers.anthropic]\napi_key_env = \"ANTHROPIC_API_KEY\"\n[providers.openai]\napi_key_file = {:?}\n",
            key_file.display().to_string()
        );
        let cfg = load_str(&toml, &env_of(&[("ANTHROPIC_API_KEY", SECRET)]))?;
        let shown = [render_masked(&cfg), format!("{cfg:?}"), format!("{cfg:#?}")];
        for text in &shown {
            assert!(!text.contains("DO-NOT-PRINT"), "{text}");
        }
        // The names of the variable and file are shown; the value is masked.
        assert!(shown[0].contains(
            "[providers.anthropic]\n# key: from ANTHROPIC_API_KEY, set (value masked)\n"
        ));
        assert!(shown[0].contains("api_key_env = \"ANTHROPIC_API_KEY\"\n"));
        assert!(shown[0].contains(&key_file.display().to_string()));
        Ok(())
    }

    #[test]
    fn client_digests_show_only_a_prefix() -> TestResult {
        let digest = "0123456789abcdef".repeat(4);
        let cfg = load_str(
            &format!("[[clients]]\ntenant = \"a\"\nkey_sha256 = \"{digest}\"\n"),
            &env_of(&[]),
        )?;
        let text = render_masked(&cfg);
        assert!(text.contains("key_sha256 = \"01234567…\""), "{text}");
        assert!(!text.contains(&digest[..9]));
        Ok(())
    }

    #[test]
    fn rendering_fills_defaults_and_loads_back_to_the_same_config() -> TestResult {
        let toml = "[server]\ndefault_deadline = \"90s\"\n[providers.anthropic]\n[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:8000\"\n[[models]]\nname = \"big\"\nchain = [\"anthropic:a\", { target = \"anthropic:b\", max_tokens = 100 }]\n[[prices]]\nmodel = \"anthropic:a\"\ninput = \"0.30\"\noutput = \"1.5\"\n";
        let cfg = load_str(toml, &env_of(&[]))?;
        let text = render_masked(&cfg);
        for expected in [
            "default_deadline = \"1m 30s\"",
            "max_concurrency = 256",
            "auth_header = \"bearer\"",
            "tls_roots = \"webpki\"",
            "{ target = \"anthropic:b\", max_tokens = 100, drop_thinking = false }",
            "input = \"0.3\"",
            "cache_read = \"0\"",
            "openai = \"local\"",
        ] {
            assert!(text.contains(expected), "missing {expected}:\n{text}");
        }
        let again = load_str(&text, &env_of(&[]))?;
        assert_eq!(render_masked(&again), text);
        assert_eq!(config_hash(&again), config_hash(&cfg));
        Ok(())
    }

    #[test]
    fn the_hash_is_sha256_of_the_rendering_and_tracks_changes() -> TestResult {
        let a = load_str("", &env_of(&[]))?;
        let b = load_str("[server]\nmax_body_bytes = 10\n", &env_of(&[]))?;
        let hash = config_hash(&a);
        assert_eq!(hash.len(), 64);
        assert_eq!(
            hash,
            hex::encode(Sha256::digest(render_masked(&a).as_bytes()))
        );
        assert_ne!(hash, config_hash(&b));
        Ok(())
    }

    #[test]
    fn warnings_name_unset_keys_and_risky_settings() -> TestResult {
        let cfg = load_str(
            "[server]\nadmin_listen = \"0.0.0.0:9787\"\n[providers.anthropic]\napi_key_env = \"ANTHROPIC_API_KEY\"\n[providers.openai]\nbase_url = \"https://gw.example\"\napi_key_env = \"OPENAI_API_KEY\"\n[[prices]]\nmodel = \"gemini:pro\"\ninput = \"1\"\noutput = \"1\"\n",
            &env_of(&[("OPENAI_API_KEY", "sk-x")]),
        )?;
        let w = warnings(&cfg);
        assert!(w.contains(&"providers.anthropic: ANTHROPIC_API_KEY is not set; requests to this provider will fail until it is".to_owned()), "{w:?}");
        assert!(
            w.iter().any(|l| l.starts_with("server.admin_listen:")),
            "{w:?}"
        );
        assert!(
            w.iter().any(|l| l.starts_with("prices: `gemini:pro`")),
            "{w:?}"
        );
        assert_eq!(w.len(), 3, "{w:?}");
        let keyless = load_str(
            "[providers.anthropic]\n[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:8000\"\n",
            &env_of(&[]),
        )?;
        // Only the https provider is warned about: a local server usually needs no key.
        assert_eq!(
            warnings(&keyless),
            [
                "providers.anthropic: no api_key_env or api_key_file; requests are sent without a provider key"
            ]
        );
        let quiet = load_str(
            "",
            &env_of(&[("ANTHROPIC_API_KEY", "a"), ("OPENAI_API_KEY", "b")]),
        )?;
        assert!(warnings(&quiet).is_empty());
        Ok(())
    }

    #[test]
    fn credential_endpoints_over_plain_http_to_another_host_are_warned_about() -> TestResult {
        let warned = |provider: &str, env: &[(&str, &str)]| -> Result<Vec<String>, String> {
            let toml = format!(
                "[providers.cloud]\n{provider}[providers.openai]\napi_key_env = \"K\"\n\
                 [routing]\nanthropic = \"cloud\"\nopenai = \"openai\"\n"
            );
            let mut env = env.to_vec();
            env.push(("K", "k"));
            let cfg = load_str(&toml, &env_of(&env)).map_err(|e| format!("{e:?}"))?;
            Ok(warnings(&cfg))
        };
        let bedrock = "kind = \"bedrock\"\nregion = \"us-east-1\"\n";
        let container = format!("{bedrock}credentials_url = \"http://10.1.2.3/creds\"\n");
        assert_eq!(
            warned(&container, &[])?,
            [
                "providers.cloud.credentials_url: credentials are fetched over plain http:// from `http://10.1.2.3/creds`, which is not this host; use https://"
            ]
        );
        // The EKS Pod Identity agent's own address is plain http by design.
        let agent =
            format!("{bedrock}credentials_url = \"http://169.254.170.23/v1/credentials\"\n");
        assert!(warned(&agent, &[])?.is_empty());
        let sts = format!("{bedrock}sts_endpoint = \"http://10.1.2.4\"\n");
        let identity = [
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
        ];
        let w = warned(&sts, &identity)?;
        assert!(
            w.len() == 1
                && w[0].starts_with(
                    "providers.cloud.sts_endpoint: credentials are fetched over plain http://"
                ),
            "{w:?}"
        );
        Ok(())
    }

    #[test]
    fn only_plain_http_to_another_host_is_in_the_clear() {
        assert!(key_in_the_clear("http://gw.example:8080"));
        assert!(key_in_the_clear("http://10.0.0.7/v1"));
        for safe in [
            "https://gw.example",
            "http://127.0.0.1:8000",
            "http://[::1]:11434",
            "http://localhost:11434",
            "http://[::ffff:127.0.0.1]:80",
        ] {
            assert!(!key_in_the_clear(safe), "{safe}");
        }
    }

    #[test]
    fn durations_are_shown_in_days_at_most() {
        let show = |s| crate::config::adapt::shown_duration(humantime::parse_duration(s).unwrap());
        assert_eq!(show("365d"), "365d");
        assert_eq!(show("90s"), "1m 30s");
        assert_eq!(show("0s"), "0s");
        assert_eq!(show("1500ms"), "1s 500ms");
    }

    proptest! {
        #[test]
        fn rendered_durations_parse_back_unchanged(ns in 0u64..40_000_000_000_000_000) {
            let d = Duration::from_nanos(ns);
            let text = crate::config::adapt::shown_duration(d);
            prop_assert_eq!(humantime::parse_duration(&text).ok(), Some(d));
            // Days at most: no months or years of a fractional number of days.
            prop_assert!(!text.contains("month") && !text.contains('y'), "{}", text);
        }
    }
}
