//! What `legate check` shows: the effective configuration as TOML with every default filled in
//! and every secret masked, the warnings that do not make it invalid, and a stable hash of it.
//!
//! The rendering is itself a loadable configuration (key values appear only as comments), so
//! an operator can save it and start from exactly what runs. Client key digests are the one
//! exception: only their first 8 hex digits are shown.

use std::fmt::Write as _;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::config::{
    ApiKind, AuthHeader, ChainStep, Config, KeySource, ProviderConfig, ServerConfig, TlsRoots,
};
use crate::meter::format_usd_per_mtok;

/// The effective config as TOML, secrets masked (variable names and file paths are shown).
pub fn render_masked(cfg: &Config) -> String {
    let mut out = String::from("# legate: effective configuration (secrets masked)\n");
    server(&mut out, &cfg.server);
    for p in cfg.providers.values() {
        provider(&mut out, p);
    }
    for m in &cfg.models {
        out.push_str("\n[[models]]\n");
        line(&mut out, "name", &quote(&m.name));
        out.push_str("chain = [\n");
        for step in &m.chain {
            let _ = writeln!(out, "  {},", chain_step(step));
        }
        out.push_str("]\n");
    }
    policy(&mut out, cfg);
    crate::config::observe::render(&mut out, &cfg.observe);
    out.push_str("\n[routing]\n");
    line(&mut out, "anthropic", &quote(&cfg.routing.anthropic));
    line(&mut out, "openai", &quote(&cfg.routing.openai));
    for c in &cfg.clients {
        out.push_str("\n[[clients]]\n");
        line(&mut out, "tenant", &quote(&c.tenant));
        let digest = hex::encode(c.key_sha256);
        let shown = digest.get(..8).unwrap_or(&digest);
        line(&mut out, "key_sha256", &quote(&format!("{shown}…")));
    }
    for (model, price) in &cfg.prices {
        out.push_str("\n[[prices]]\n");
        line(&mut out, "model", &quote(model));
        line(&mut out, "input", &quote(&format_usd_per_mtok(price.input)));
        line(
            &mut out,
            "output",
            &quote(&format_usd_per_mtok(price.output)),
        );
        line(
            &mut out,
            "cache_write",
            &quote(&format_usd_per_mtok(price.cache_write)),
        );
        line(
            &mut out,
            "cache_read",
            &quote(&format_usd_per_mtok(price.cache_read)),
        );
    }
    for l in &cfg.limits {
        out.push_str("\n[[limits]]\n");
        line(&mut out, "model", &quote(&l.model));
        line(
            &mut out,
            "max_output_tokens",
            &l.max_output_tokens.to_string(),
        );
    }
    out
}

/// Problems that do not make the config invalid but that an operator should know about.
pub fn warnings(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for p in cfg.providers.values() {
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
            _ => {}
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

/// Stable hash (sha256 hex) of [`render_masked`], for `/admin/state`.
pub fn config_hash(cfg: &Config) -> String {
    hex::encode(Sha256::digest(render_masked(cfg).as_bytes()))
}

fn server(out: &mut String, s: &ServerConfig) {
    out.push_str("\n[server]\n");
    line(out, "listen", &quote(&s.listen.to_string()));
    line(out, "admin_listen", &quote(&s.admin_listen.to_string()));
    line(out, "max_body_bytes", &s.max_body_bytes.to_string());
    line(out, "default_deadline", &duration(s.default_deadline));
    line(out, "shutdown_grace", &duration(s.shutdown_grace));
    let l = &s.limits;
    line(out, "header_read_timeout", &duration(l.header_read_timeout));
    line(out, "body_read_timeout", &duration(l.body_read_timeout));
    line(
        out,
        "connection_idle_timeout",
        &duration(l.connection_idle_timeout),
    );
    line(out, "max_connections", &l.max_connections.to_string());
    line(
        out,
        "admin_max_connections",
        &l.admin_max_connections.to_string(),
    );
    line(out, "max_event_bytes", &l.max_event_bytes.to_string());
    line(out, "max_buffered_bytes", &l.max_buffered_bytes.to_string());
}

fn provider(out: &mut String, p: &ProviderConfig) {
    let _ = writeln!(out, "\n[providers.{}]", p.name);
    line(
        out,
        "kind",
        &quote(p.platform.kind_name().unwrap_or(p.kind.as_str())),
    );
    line(out, "base_url", &quote(&p.base_url));
    platform(out, &p.platform);
    match &p.key {
        KeySource::Env { var, value } => {
            let state = if value.is_some() {
                "[redacted]"
            } else {
                "not set"
            };
            let _ = writeln!(out, "api_key_env = {}  # value: {state}", quote(var));
        }
        KeySource::File { path } => {
            line(out, "api_key_file", &quote(&path.display().to_string()));
        }
        KeySource::None if owns_credential(&p.platform) => {}
        KeySource::None => out.push_str("# no provider key\n"),
    }
    let auth = match p.auth_header {
        AuthHeader::XApiKey => "x-api-key",
        AuthHeader::Bearer => "bearer",
        AuthHeader::ApiKey => "api-key",
    };
    line(out, "auth_header", &quote(auth));
    line(out, "connect_timeout", &duration(p.connect_timeout));
    line(out, "first_byte_timeout", &duration(p.first_byte_timeout));
    line(out, "idle_timeout", &duration(p.idle_timeout));
    line(out, "pool_idle_timeout", &duration(p.pool_idle_timeout));
    line(out, "max_concurrency", &p.max_concurrency.to_string());
    if p.kind == ApiKind::OpenAi {
        line(out, "responses", &p.responses.to_string());
    }
    let roots = match p.tls_roots {
        TlsRoots::Webpki => "webpki",
        TlsRoots::Native => "native",
    };
    line(out, "tls_roots", &quote(roots));
    let files = [
        ("ca_file", &p.ca_file),
        ("client_cert_file", &p.client_cert_file),
        ("client_key_file", &p.client_key_file),
    ];
    for (key, file) in files {
        if let Some(path) = file {
            line(out, key, &quote(&path.display().to_string()));
        }
    }
}

/// Whether a provider's credential comes from its platform (pod identity), not a key.
fn owns_credential(p: &crate::config::cloud::Platform) -> bool {
    use crate::config::cloud::{AzureSource, Platform};
    match p {
        Platform::Direct => false,
        Platform::AzureOpenAi(a) => !matches!(a.credentials, AzureSource::ApiKey),
        Platform::Bedrock(_) | Platform::Vertex(_) => true,
    }
}

/// A cloud provider's place names and, as a comment, the credential source it will use.
fn platform(out: &mut String, p: &crate::config::cloud::Platform) {
    use crate::config::cloud::Platform;
    match p {
        Platform::Direct => return,
        Platform::Bedrock(b) => {
            line(out, "region", &quote(&b.region));
            line(out, "anthropic_version", &quote(&b.anthropic_version));
        }
        Platform::Vertex(v) => {
            line(out, "project", &quote(&v.project));
            line(out, "region", &quote(&v.region));
            line(out, "anthropic_version", &quote(&v.anthropic_version));
        }
        Platform::AzureOpenAi(a) => {
            line(out, "api_version", &quote(&a.api_version));
            if !a.deployments.is_empty() {
                let items: Vec<String> = a
                    .deployments
                    .iter()
                    .map(|(m, d)| format!("{{ model = {}, deployment = {} }}", quote(m), quote(d)))
                    .collect();
                line(out, "deployments", &format!("[{}]", items.join(", ")));
            }
        }
    }
    if let Some(source) = p.credential_source() {
        let _ = writeln!(out, "# credentials: {source}");
    }
}

fn policy(out: &mut String, cfg: &Config) {
    let r = &cfg.retry;
    out.push_str("\n[retry]\n");
    line(out, "max_attempts", &r.max_attempts.to_string());
    line(out, "base_delay", &duration(r.base_delay));
    line(out, "max_delay", &duration(r.max_delay));
    line(out, "max_retry_after", &duration(r.max_retry_after));
    line(out, "budget_ratio", &format!("{:?}", r.budget_ratio));
    for (name, t) in &cfg.tenants {
        let _ = writeln!(out, "\n[tenants.{name}]");
        line(out, "priority", &quote(t.priority.as_str()));
        line(
            out,
            "requests_per_minute",
            &t.requests_per_minute.to_string(),
        );
        line(out, "tokens_per_minute", &t.tokens_per_minute.to_string());
        line(
            out,
            "daily_budget_usd",
            &quote(&crate::meter::format_usd(t.daily_budget_pico)),
        );
    }
    let rl = &cfg.ratelimit;
    out.push_str("\n[ratelimit]\n");
    let store = match rl.store {
        crate::config::StoreKind::Memory => "memory",
        crate::config::StoreKind::Redis => "redis",
    };
    line(out, "store", &quote(store));
    if let Some(url) = &rl.redis_url {
        line(out, "redis_url", &quote(&mask_url(url)));
    }
    line(
        out,
        "default_output_reservation",
        &rl.default_output_reservation.to_string(),
    );
    let rs = &cfg.responses;
    out.push_str("\n[responses]\n");
    let store = match rs.store {
        crate::config::StoreKind::Memory => "memory",
        crate::config::StoreKind::Redis => "redis",
    };
    line(out, "store", &quote(store));
    line(out, "max_bytes", &rs.max_bytes.to_string());
    line(out, "ttl", &duration(rs.ttl));
    out.push_str("\n[shedding]\n");
    line(out, "queue_limit", &cfg.shedding.queue_limit.to_string());
    line(out, "pace_below", &format!("{:?}", cfg.shedding.pace_below));
    let b = &cfg.breaker;
    out.push_str("\n[breaker]\n");
    line(out, "window", &duration(b.window));
    line(out, "min_calls", &b.min_calls.to_string());
    line(out, "failure_ratio", &format!("{:?}", b.failure_ratio));
    line(out, "open_for", &duration(b.open_for));
    line(out, "max_open_for", &duration(b.max_open_for));
}

/// A Redis URL may carry a password (`redis://:PASSWORD@host`): it is masked.
fn mask_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}[redacted]{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

fn chain_step(step: &ChainStep) -> String {
    if step.max_tokens.is_none() && !step.drop_thinking {
        return quote(&step.target());
    }
    let mut s = format!("{{ target = {}", quote(&step.target()));
    if let Some(n) = step.max_tokens {
        let _ = write!(s, ", max_tokens = {n}");
    }
    let _ = write!(s, ", drop_thinking = {} }}", step.drop_thinking);
    s
}

pub(crate) fn line(out: &mut String, key: &str, value: &str) {
    let _ = writeln!(out, "{key} = {value}");
}

pub(crate) fn duration(d: Duration) -> String {
    quote(&humantime::format_duration(d).to_string())
}

/// A TOML basic string.
pub(crate) fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            '\r' => q.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(q, "\\u{:04X}", u32::from(c));
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::config::load_str;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const SECRET: &str = "sk-ant-api03-DO-NOT-PRINT";

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn secrets_never_appear_in_the_rendering_or_debug_output() -> TestResult {
        let dir = tempfile::tempdir()?;
        let key_file = dir.path().join("openai-key");
        std::fs::write(&key_file, "sk-file-DO-NOT-PRINT")?;
        let toml = format!(
            "[providers.anthropic]\napi_key_env = \"ANTHROPIC_API_KEY\"\n[providers.openai]\napi_key_file = {:?}\n",
            key_file.display().to_string()
        );
        let cfg = load_str(&toml, &env(&[("ANTHROPIC_API_KEY", SECRET)]))?;
        let shown = [render_masked(&cfg), format!("{cfg:?}"), format!("{cfg:#?}")];
        for text in &shown {
            assert!(!text.contains("DO-NOT-PRINT"), "{text}");
        }
        // The names of the variable and file are shown; the value is masked.
        assert!(shown[0].contains("api_key_env = \"ANTHROPIC_API_KEY\"  # value: [redacted]"));
        assert!(shown[0].contains(&key_file.display().to_string()));
        Ok(())
    }

    #[test]
    fn client_digests_show_only_a_prefix() -> TestResult {
        let digest = "0123456789abcdef".repeat(4);
        let cfg = load_str(
            &format!("[[clients]]\ntenant = \"a\"\nkey_sha256 = \"{digest}\"\n"),
            &env(&[]),
        )?;
        let text = render_masked(&cfg);
        assert!(text.contains("key_sha256 = \"01234567…\""), "{text}");
        assert!(!text.contains(&digest[..9]));
        Ok(())
    }

    #[test]
    fn rendering_fills_defaults_and_loads_back_to_the_same_config() -> TestResult {
        let toml = "[server]\ndefault_deadline = \"90s\"\n[providers.anthropic]\n[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:8000\"\n[[models]]\nname = \"big\"\nchain = [\"anthropic:a\", { target = \"anthropic:b\", max_tokens = 100 }]\n[[prices]]\nmodel = \"anthropic:a\"\ninput = \"0.30\"\noutput = \"1.5\"\n";
        let cfg = load_str(toml, &env(&[]))?;
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
        let again = load_str(&text, &env(&[]))?;
        assert_eq!(render_masked(&again), text);
        assert_eq!(config_hash(&again), config_hash(&cfg));
        Ok(())
    }

    #[test]
    fn the_hash_is_sha256_of_the_rendering_and_tracks_changes() -> TestResult {
        let a = load_str("", &env(&[]))?;
        let b = load_str("[server]\nmax_body_bytes = 10\n", &env(&[]))?;
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
            &env(&[("OPENAI_API_KEY", "sk-x")]),
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
            &env(&[]),
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
            &env(&[("ANTHROPIC_API_KEY", "a"), ("OPENAI_API_KEY", "b")]),
        )?;
        assert!(warnings(&quiet).is_empty());
        Ok(())
    }

    proptest! {
        #[test]
        fn quoted_strings_parse_back_unchanged(s in any::<String>()) {
            let toml = format!("k = {}", quote(&s));
            let parsed = config::Config::builder()
                .add_source(config::File::from_str(&toml, config::FileFormat::Toml))
                .build()
                .and_then(|c| c.get_string("k"));
            prop_assert_eq!(parsed.ok(), Some(s));
        }

        #[test]
        fn rendered_durations_parse_back_unchanged(ms in 1u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            let text = duration(d);
            prop_assert_eq!(humantime::parse_duration(text.trim_matches('"')).ok(), Some(d));
        }
    }
}
