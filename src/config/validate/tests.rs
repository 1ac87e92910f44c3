//! Every validation rule, each asserted at its exact key path.

use std::collections::HashMap;
use std::time::Duration;

use crate::config::load::env_of;
use crate::config::{ApiKind, AuthHeader, Config, ConfigErrors, KeySource, TlsRoots, load_str};

mod cloud;
mod providers;
mod server;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn no_env() -> HashMap<String, String> {
    HashMap::new()
}

fn errors_of(toml: &str) -> ConfigErrors {
    match load_str(toml, &no_env()) {
        Ok(_) => ConfigErrors(Vec::new()),
        Err(e) => e,
    }
}

/// Asserts that `toml` is refused with a problem at exactly `path`.
#[track_caller]
fn refused_at(toml: &str, path: &str) {
    let errs = errors_of(toml);
    assert!(
        errs.has_path(path),
        "expected a problem at `{path}`, got:\n{errs}\n--- for:\n{toml}"
    );
}

/// The key paths of the problems, sorted.
fn sorted_paths(errs: &ConfigErrors) -> Vec<&str> {
    let mut paths: Vec<&str> = errs.0.iter().map(|e| e.path.as_str()).collect();
    paths.sort_unstable();
    paths
}

fn message_at(errs: &ConfigErrors, path: &str) -> String {
    errs.0
        .iter()
        .filter(|e| e.path == path)
        .map(|e| e.message.clone())
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn empty_config_gets_the_documented_defaults() -> TestResult {
    let cfg = load_str("", &no_env())?;
    assert_eq!(cfg.server.listen.to_string(), "127.0.0.1:8787");
    assert_eq!(cfg.server.admin_listen.to_string(), "127.0.0.1:9787");
    assert_eq!(cfg.server.max_body_bytes, 33_554_432);
    assert_eq!(cfg.server.default_deadline, Duration::from_secs(600));
    assert_eq!(cfg.server.shutdown_grace, Duration::from_secs(30));
    let a = &cfg.providers["anthropic"];
    assert_eq!(a.kind, ApiKind::Anthropic);
    assert_eq!(a.base_url, "https://api.anthropic.com");
    assert_eq!(a.auth_header, AuthHeader::XApiKey);
    assert!(matches!(&a.key, KeySource::Env { var, value: None } if var == "ANTHROPIC_API_KEY"));
    assert_eq!(a.connect_timeout, Duration::from_secs(5));
    assert_eq!(a.first_byte_timeout, Duration::from_secs(60));
    assert_eq!(a.idle_timeout, Duration::from_secs(60));
    assert_eq!(a.pool_idle_timeout, Duration::from_secs(60));
    assert_eq!(a.max_concurrency, 256);
    assert_eq!(a.tls_roots, TlsRoots::Webpki);
    assert!(a.ca_file.is_none() && a.client_cert_file.is_none() && a.client_key_file.is_none());
    let o = &cfg.providers["openai"];
    assert_eq!(o.kind, ApiKind::OpenAi);
    assert_eq!(o.base_url, "https://api.openai.com");
    assert_eq!(o.auth_header, AuthHeader::Bearer);
    assert!(matches!(&o.key, KeySource::Env { var, .. } if var == "OPENAI_API_KEY"));
    assert_eq!(
        (cfg.routing.anthropic.as_str(), cfg.routing.openai.as_str()),
        ("anthropic", "openai")
    );
    assert!(cfg.models.is_empty() && cfg.clients.is_empty() && cfg.prices.is_empty());
    Ok(())
}

#[test]
fn a_listed_providers_section_replaces_the_defaults() -> TestResult {
    let cfg = load_str(
        "[providers.claude]\nkind = \"anthropic\"\n[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:8000/\"\n",
        &no_env(),
    )?;
    assert_eq!(
        cfg.providers.keys().collect::<Vec<_>>(),
        ["claude", "local"]
    );
    // Without [routing], each API goes to its only provider of that kind.
    assert_eq!(cfg.routing.anthropic, "claude");
    assert_eq!(cfg.routing.openai, "local");
    assert_eq!(cfg.providers["local"].base_url, "http://127.0.0.1:8000");
    assert_eq!(cfg.providers["local"].auth_header, AuthHeader::Bearer);
    assert!(matches!(cfg.providers["local"].key, KeySource::None));
    Ok(())
}

#[test]
fn unknown_keys_are_refused_at_every_level() {
    refused_at("serve = 1", "serve");
    refused_at(
        "[server]\nlisten_addr = \"127.0.0.1:1\"",
        "server.listen_addr",
    );
    refused_at(
        "[providers.anthropic]\nbase = \"x\"",
        "providers.anthropic.base",
    );
    refused_at(
        "[[models]]\nname = \"a\"\nchain = [\"anthropic:m\"]\nalias = \"b\"",
        "models[0].alias",
    );
    refused_at(
        "[[models]]\nname = \"a\"\nchain = [\"anthropic:m\", { target = \"anthropic:n\", max_token = 5 }]",
        "models[0].chain[1].max_token",
    );
    refused_at("[routing]\ndefault = \"anthropic\"", "routing.default");
    refused_at(
        "[[clients]]\ntenant = \"a\"\nname = \"x\"\nkey_sha256 = \"\"",
        "clients[0].name",
    );
    refused_at(
        "[[prices]]\nmodel = \"a:b\"\ninput = \"1\"\noutput = \"1\"\ncurrency = \"EUR\"",
        "prices[0].currency",
    );
    let errs = errors_of("[server]\nlisen = 1");
    assert!(
        message_at(&errs, "server.lisen").contains("listen"),
        "{errs}"
    );
}

#[test]
fn wrong_types_are_refused() {
    refused_at("server = 5", "server");
    refused_at(
        "[server]\nmax_body_bytes = \"big\"",
        "server.max_body_bytes",
    );
    refused_at("[server]\nlisten = 8787", "server.listen");
    refused_at("[server]\nlisten = \"localhost:8787\"", "server.listen");
    refused_at(
        "[providers.anthropic]\nmax_concurrency = 1.5",
        "providers.anthropic.max_concurrency",
    );
    refused_at("providers = []", "providers");
    refused_at("[models]\nname = \"x\"", "models");
    refused_at("models = [1]", "models[0]");
    refused_at(
        "[[models]]\nname = \"a\"\nchain = \"anthropic:m\"",
        "models[0].chain",
    );
    refused_at(
        "[[models]]\nname = \"a\"\nchain = [{ target = \"anthropic:m\", drop_thinking = \"yes\" }]",
        "models[0].chain[0].drop_thinking",
    );
    refused_at(
        "[[models]]\nname = \"a\"\nchain = [3]",
        "models[0].chain[0]",
    );
    refused_at("[routing]\nopenai = 42", "routing.openai");
}

#[test]
fn durations_must_parse_and_timeouts_must_be_positive() {
    refused_at(
        "[providers.anthropic]\nconnect_timeout = \"5 parsecs\"",
        "providers.anthropic.connect_timeout",
    );
    refused_at("[server]\ndefault_deadline = 30", "server.default_deadline");
    for key in [
        "connect_timeout",
        "first_byte_timeout",
        "idle_timeout",
        "pool_idle_timeout",
    ] {
        refused_at(
            &format!("[providers.openai]\n{key} = \"0s\""),
            &format!("providers.openai.{key}"),
        );
    }
    refused_at(
        "[server]\ndefault_deadline = \"0ms\"",
        "server.default_deadline",
    );
    // A zero grace period is a valid choice: stop at once.
    assert!(load_str("[server]\nshutdown_grace = \"0s\"", &no_env()).is_ok());
    let cfg = load_str(
        "[providers.anthropic]\n[providers.openai]\nidle_timeout = \"1m 30s\"",
        &no_env(),
    );
    assert_eq!(
        cfg.ok().map(|c| c.providers["openai"].idle_timeout),
        Some(Duration::from_secs(90))
    );
}

#[test]
fn numeric_limits_must_be_positive() {
    refused_at("[server]\nmax_body_bytes = 0", "server.max_body_bytes");
    refused_at("[server]\nmax_body_bytes = -1", "server.max_body_bytes");
    refused_at(
        "[providers.anthropic]\nmax_concurrency = 0",
        "providers.anthropic.max_concurrency",
    );
    refused_at(
        "[[models]]\nname = \"a\"\nchain = [{ target = \"anthropic:m\", max_tokens = 0 }]",
        "models[0].chain[0].max_tokens",
    );
}

const TWO_KINDS: &str = "[providers.anthropic]\n[providers.openai]\n";

#[test]
fn chains_must_name_known_providers() {
    let model = |chain: &str| format!("{TWO_KINDS}[[models]]\nname = \"m\"\nchain = {chain}\n");
    refused_at(
        &model("[\"anthropic:a\", \"mystery:b\"]"),
        "models[0].chain[1]",
    );
    refused_at(
        &model("[\"anthropic:a\", { target = \"mystery:b\" }]"),
        "models[0].chain[1].target",
    );
    refused_at(&model("[\"just-a-model\"]"), "models[0].chain[0]");
    refused_at(&model("[\"anthropic:\"]"), "models[0].chain[0]");
    refused_at(&model("[{ max_tokens = 5 }]"), "models[0].chain[0].target");
    refused_at(&model("[]"), "models[0].chain");
    // Kinds may mix: a step of the other API is served through translation.
    let mixed = load_str(
        &model("[\"anthropic:a\", \"openai:gpt-4o\"]"),
        &std::collections::HashMap::new(),
    );
    assert!(mixed.is_ok(), "{:?}", mixed.err().map(|e| e.to_string()));
    refused_at(
        &format!("{TWO_KINDS}[[models]]\nchain = [\"anthropic:a\"]"),
        "models[0].name",
    );
    refused_at(
        &format!("{TWO_KINDS}[[models]]\nname = \"m\""),
        "models[0].chain",
    );
}

#[test]
fn chain_steps_are_parsed() -> TestResult {
    let cfg = load_str(
        "[providers.anthropic]\n[providers.ollama]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:11434\"\n[[models]]\nname = \"large\"\nchain = [\"anthropic:claude-sonnet-4-5\", { target = \"anthropic:claude-haiku-4-5\", max_tokens = 8192, drop_thinking = true }]\n[[models]]\nname = \"local\"\nchain = [\"ollama:qwen2.5:7b\"]\n[routing]\nopenai = \"ollama\"\n",
        &no_env(),
    )?;
    let large = &cfg.models[0].chain;
    assert_eq!(large[0].target(), "anthropic:claude-sonnet-4-5");
    assert_eq!((large[0].max_tokens, large[0].drop_thinking), (None, false));
    assert_eq!(
        (large[1].max_tokens, large[1].drop_thinking),
        (Some(8192), true)
    );
    // The provider ends at the first colon; the model keeps the rest.
    assert_eq!(cfg.models[1].chain[0].provider(), "ollama");
    assert_eq!(cfg.models[1].chain[0].model(), "qwen2.5:7b");
    Ok(())
}

#[test]
fn duplicate_models_and_prices_are_refused() {
    refused_at(
        "[[models]]\nname = \"m\"\nchain = [\"anthropic:a\"]\n[[models]]\nname = \"m\"\nchain = [\"anthropic:b\"]",
        "models[1].name",
    );
    refused_at(
        "[[prices]]\nmodel = \"anthropic:a\"\ninput = \"1\"\noutput = \"2\"\n[[prices]]\nmodel = \"anthropic:a\"\ninput = \"1\"\noutput = \"2\"",
        "prices[1].model",
    );
}

#[test]
fn routing_must_name_a_provider_of_the_right_kind() -> TestResult {
    refused_at("[routing]\nanthropic = \"nowhere\"", "routing.anthropic");
    refused_at("[routing]\nopenai = \"anthropic\"", "routing.openai");
    refused_at(
        "[providers.a1]\nkind = \"anthropic\"\n[providers.a2]\nkind = \"anthropic\"\n[providers.openai]\n",
        "routing.anthropic",
    );
    // No provider of a kind at all: that API has no default (only [[models]] names), and
    // `check` warns of it.
    let cfg = load_str("[providers.anthropic]\n", &no_env())?;
    assert_eq!(cfg.routing.openai, "");
    let warned = crate::config::render::warnings(&cfg);
    assert!(
        warned
            .iter()
            .any(|w| w.contains("no provider speaks the OpenAI APIs")),
        "{warned:?}"
    );
    Ok(())
}

#[test]
fn public_listen_requires_client_keys() -> TestResult {
    refused_at("[server]\nlisten = \"0.0.0.0:8787\"", "server.listen");
    let digest = "ab".repeat(32);
    let cfg = load_str(
        &format!(
            "[server]\nlisten = \"0.0.0.0:8787\"\n[[clients]]\ntenant = \"team-a\"\nkey_sha256 = \"{digest}\""
        ),
        &no_env(),
    )?;
    assert_eq!(cfg.clients[0].tenant, "team-a");
    assert_eq!(cfg.clients[0].key_sha256, [0xab; 32]);
    refused_at(
        "[server]\nlisten = \"127.0.0.1:8787\"\nadmin_listen = \"127.0.0.1:8787\"",
        "server.admin_listen",
    );
    // An unspecified address takes the port on every address: `serve` could not bind both.
    for admin in ["0.0.0.0:8787", "[::]:8787"] {
        refused_at(
            &format!("[server]\nlisten = \"127.0.0.1:8787\"\nadmin_listen = \"{admin}\""),
            "server.admin_listen",
        );
    }
    assert!(
        load_str(
            "[server]\nlisten = \"127.0.0.1:8787\"\nadmin_listen = \"127.0.0.2:8787\"",
            &no_env()
        )
        .is_ok()
    );
    assert!(
        load_str(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"",
            &no_env()
        )
        .is_ok()
    );
    Ok(())
}

#[test]
fn client_entries_are_checked() {
    let client = |tenant: &str, key: &str| {
        format!("[[clients]]\ntenant = \"{tenant}\"\nkey_sha256 = \"{key}\"\n")
    };
    let good = "0f".repeat(32);
    refused_at(&client("team-a", "abc"), "clients[0].key_sha256");
    refused_at(&client("team-a", &"g".repeat(64)), "clients[0].key_sha256");
    refused_at(&client("team-a", &"a".repeat(63)), "clients[0].key_sha256");
    refused_at(&client("Team A", &good), "clients[0].tenant");
    refused_at(
        &format!("{}{}", client("a", &good), client("b", &good)),
        "clients[1].key_sha256",
    );
    refused_at("[[clients]]\ntenant = \"a\"", "clients[0].key_sha256");
    assert!(load_str(&client("a", &good.to_uppercase()), &no_env()).is_ok());
}

#[test]
fn prices_are_exact_decimals() -> TestResult {
    let price = |body: &str| format!("[[prices]]\nmodel = \"anthropic:m\"\n{body}\n");
    refused_at(&price("input = \"abc\"\noutput = \"1\""), "prices[0].input");
    refused_at(&price("input = \"1e3\"\noutput = \"1\""), "prices[0].input");
    refused_at(&price("input = 0.3\noutput = \"1\""), "prices[0].input");
    refused_at(&price("input = \"1\""), "prices[0].output");
    refused_at(
        &price("input = \"1\"\noutput = \"1\"\ncache_read = \"-1\""),
        "prices[0].cache_read",
    );
    refused_at(
        "[[prices]]\nmodel = \"sonnet\"\ninput = \"1\"\noutput = \"1\"",
        "prices[0].model",
    );
    refused_at(
        "[[prices]]\nmodel = \"Anthropic:m\"\ninput = \"1\"\noutput = \"1\"",
        "prices[0].model",
    );
    let cfg = load_str(
        &price("input = \"3\"\noutput = 15\ncache_write = \"3.75\""),
        &no_env(),
    )?;
    let p = cfg.prices["anthropic:m"];
    assert_eq!(
        (p.input, p.output, p.cache_write, p.cache_read),
        (3_000_000, 15_000_000, 3_750_000, 0)
    );
    Ok(())
}

#[test]
fn admission_sections_are_read_and_checked() {
    let errs = errors_of(
        "[tenants.team-a]\npriority = \"urgent\"\ndaily_budget_usd = \"1.0000000000001\"\nfoo = 1\n[ratelimit]\nstore = \"redis\"\n[shedding]\npace_below = 2\n",
    );
    for path in [
        "tenants.team-a.priority",
        "tenants.team-a.daily_budget_usd",
        "tenants.team-a.foo",
        "ratelimit.redis_url",
        "shedding.pace_below",
    ] {
        assert!(!message_at(&errs, path).is_empty(), "{path}: {errs}");
    }
}

#[test]
fn a_redis_url_without_certificate_verification_is_refused() {
    let errs =
        errors_of("[ratelimit]\nredis_url = \"rediss://:pw@cache.internal:6380/0#insecure\"\n");
    let msg = message_at(&errs, "ratelimit.redis_url");
    assert!(msg.contains("#insecure"), "{errs}");
    assert!(!msg.contains("pw@"), "{msg}");
    let ok = errors_of("[ratelimit]\nredis_url = \"rediss://:pw@cache.internal:6380/0\"\n");
    assert!(message_at(&ok, "ratelimit.redis_url").is_empty(), "{ok}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let errs = errors_of(
        "[retry]\nmax_attempts = 0\n[server]\nlisten = \"0.0.0.0:1\"\nmax_body_bytes = 0\n[providers.anthropic]\nconnect_timeout = \"soon\"\n[providers.openai]\nkind = \"gpt\"\n[[models]]\nname = \"m\"\nchain = [\"nobody:x\"]\n[[prices]]\nmodel = \"anthropic:m\"\ninput = \"x\"\noutput = \"1\"\n",
    );
    assert_eq!(
        sorted_paths(&errs),
        [
            "models[0].chain[0]",
            "prices[0].input",
            "providers.anthropic.connect_timeout",
            "providers.openai.kind",
            "retry.max_attempts",
            "server.listen",
            "server.max_body_bytes",
        ],
        "{errs}"
    );
    // Display: one "path: message" per line.
    assert_eq!(errs.to_string().lines().count(), errs.0.len());
    assert!(errs.to_string().lines().all(|l| l.contains(": ")));
}

#[test]
fn environment_overrides_apply_and_are_validated() -> TestResult {
    let cfg: Config = load_str(
        "[server]\nmax_body_bytes = 5000\n",
        &env_of(&[
            ("LEGATE__SERVER__MAX_BODY_BYTES", "1000"),
            (
                "LEGATE__PROVIDERS__ANTHROPIC__BASE_URL",
                "http://127.0.0.1:8790/",
            ),
            ("LEGATE__PROVIDERS__OPENAI__MAX_CONCURRENCY", " 12"),
            ("LEGATE__SERVER__DEFAULT_DEADLINE", "2m"),
            ("LEGATE_LOG", "debug"),
            ("UNRELATED", "x"),
        ]),
    )?;
    assert_eq!(cfg.server.max_body_bytes, 1000);
    assert_eq!(cfg.providers["anthropic"].base_url, "http://127.0.0.1:8790");
    assert_eq!(cfg.providers["openai"].max_concurrency, 12);
    assert_eq!(cfg.server.default_deadline, Duration::from_secs(120));

    let bad = load_str(
        "",
        &env_of(&[
            ("LEGATE__SERVER__MAX_BODY_BYTES", "lots"),
            ("LEGATE__SERVER__COLOUR", "red"),
        ]),
    );
    let Err(errs) = bad else {
        return Err("bad overrides accepted".into());
    };
    assert!(
        errs.has_path("server.max_body_bytes") && errs.has_path("server.colour"),
        "{errs}"
    );

    // A provider named like a number, chosen through the environment, stays a name.
    let cfg = load_str(
        "[providers.anthropic]\n[providers.42]\nkind = \"openai\"\n[providers.openai]\n",
        &env_of(&[("LEGATE__ROUTING__OPENAI", "42")]),
    )?;
    assert_eq!(cfg.routing.openai, "42");
    Ok(())
}

#[test]
fn a_bad_array_element_keeps_the_indices_of_the_others() {
    let errs = errors_of(
        "models = [1, { name = \"m\", chain = [\"nobody:x\", 3, \"anthropic:a\", { target = \"gone:y\" }] }]",
    );
    assert_eq!(
        sorted_paths(&errs),
        [
            "models[0]",
            "models[1].chain[0]",
            "models[1].chain[1]",
            "models[1].chain[3].target"
        ],
        "{errs}"
    );
    assert_eq!(
        message_at(&errs, "models[0]"),
        "expected a table, found the integer 1"
    );
}

#[test]
fn messages_do_not_quote_string_values() {
    let secret = "sk-proj-CANARY-0042";
    let errs = errors_of(&format!(
        "[server]\nlisten = \"{secret}\"\ndefault_deadline = \"{secret}\"\n[providers.anthropic]\n\
         api_key_env = \"{secret}\"\ntls_roots = \"{secret}\"\n[ratelimit]\nredis_url = \"{secret}\"\n\
         [[prices]]\nmodel = \"anthropic:m\"\ninput = \"{secret}\"\noutput = \"1\"\n"
    ));
    for path in [
        "server.listen",
        "server.default_deadline",
        "providers.anthropic.api_key_env",
        "providers.anthropic.tls_roots",
        "ratelimit.redis_url",
        "prices[0].input",
    ] {
        assert!(errs.has_path(path), "{path}: {errs}");
    }
    assert!(!errs.to_string().contains("CANARY"), "{errs}");
    assert_eq!(
        message_at(&errs, "providers.anthropic.tls_roots"),
        "expected one of: webpki, native"
    );
}

#[test]
fn api_key_env_names_a_variable() -> TestResult {
    for good in ["ANTHROPIC_API_KEY", "_K", "key2"] {
        load_str(
            &format!("[providers.anthropic]\napi_key_env = \"{good}\"\n[providers.openai]\n"),
            &no_env(),
        )?;
    }
    for bad in ["sk-ant-api03-x", "2KEY", "A B", "A=B"] {
        refused_at(
            &format!("[providers.anthropic]\napi_key_env = \"{bad}\""),
            "providers.anthropic.api_key_env",
        );
    }
    Ok(())
}

#[test]
fn durations_beyond_a_year_are_refused_everywhere() {
    for (section, key) in [
        ("server", "shutdown_grace"),
        ("retry", "max_retry_after"),
        ("breaker", "max_open_for"),
        ("responses", "ttl"),
        ("providers.anthropic", "idle_timeout"),
    ] {
        let errs = errors_of(&format!("[{section}]\n{key} = \"500000000000y\""));
        assert_eq!(
            message_at(&errs, &format!("{section}.{key}")),
            "longer than one year, the longest duration legate accepts",
            "{errs}"
        );
    }
    let errs = errors_of("[server]\ndefault_deadline = \"8760h\"\nshutdown_grace = \"1y\"");
    assert!(errs.0.is_empty(), "{errs}");
}

#[test]
fn a_key_pasted_into_a_path_url_name_or_key_is_not_printed_back() {
    const KEY: &str = "sk-ant-api03-PASTEDSECRETXYZ0123456789";
    for toml in [
        format!("[providers.anthropic]\napi_key_file = \"{KEY}\""),
        format!("[providers.anthropic]\nca_file = \"{KEY}\""),
        format!("[providers.anthropic]\nbase_url = \"{KEY}\""),
        format!("[providers.anthropic]\nbase_url = \"https://gw.example/?key={KEY}\""),
        format!("[routing]\nanthropic = \"{KEY}\""),
        format!("[server]\n\"{KEY}\" = 1"),
    ] {
        let errs = errors_of(&toml);
        assert!(!errs.0.is_empty(), "refused: {toml}");
        let text = errs.to_string();
        assert!(!text.contains("PASTEDSECRET"), "{text}");
    }
}

/// A key in the environment is read as a key file is: a Secret mounted as a variable keeps its
/// trailing newline, which was sent as part of the key (every request then failed); a value
/// that is still no key is refused, naming the variable and not the value.
#[test]
fn an_environment_key_loses_its_trailing_newline() -> TestResult {
    let env = |v: &str| HashMap::from([("ANTHROPIC_API_KEY".to_owned(), v.to_owned())]);
    let cfg = load_str("", &env("sk-ant-x\n"))?;
    let key = match &cfg.providers["anthropic"].key {
        KeySource::Env { value, .. } => value.as_ref().map(|k| k.expose().to_owned()),
        _ => None,
    };
    assert_eq!(key.as_deref(), Some("sk-ant-x"));
    let errors = load_str("", &env("sk-ant-x\n\n"))
        .err()
        .map(|e| e.0)
        .unwrap_or_default();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "providers.anthropic.api_key_env");
    assert!(
        errors[0].message.starts_with("$ANTHROPIC_API_KEY: "),
        "{}",
        errors[0].message
    );
    assert!(!errors[0].message.contains("sk-ant-x"));
    Ok(())
}

/// `warning` passed as a log filter, read as the name of a module: every line legate logs,
/// the access log too, was then lost.
#[test]
fn a_word_that_is_no_level_is_refused_as_the_log_level() {
    let pasted = "sk-ant-api03-SECRETSECRETSECRET1234567890abcdefXYZ";
    for bad in [
        "warning",
        "information",
        "info,debgu",
        "warn-only",
        "info,a.b",
        pasted,
    ] {
        let toml = format!("[log]\nlevel = \"{bad}\"\n");
        let errors = load_str(&toml, &no_env())
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
        assert_eq!(errors[0].path, "log.level");
        assert!(
            errors[0].message.contains("is not a level"),
            "{}",
            errors[0].message
        );
        assert!(
            !errors[0].message.contains("SECRETSECRET"),
            "{}",
            errors[0].message
        );
    }
    for good in ["warn", "INFO", "legate=debug,hyper=warn", "legate", "off"] {
        let toml = format!("[log]\nlevel = \"{good}\"\n");
        assert!(load_str(&toml, &no_env()).is_ok(), "{good}");
    }
}

/// Counts past what a plane or the span queue can hold were accepted by check, then made the
/// start panic (or the admin plane die beside a live data plane).
#[test]
fn counts_past_what_serve_can_hold_are_refused() {
    let huge = 1u64 << 61;
    for (toml, path) in [
        (
            format!("[server]\nmax_connections = {huge}\n"),
            "server.max_connections",
        ),
        (
            format!("[server]\nadmin_max_connections = {huge}\n"),
            "server.admin_max_connections",
        ),
        (
            format!("[telemetry]\nqueue_size = {huge}\n"),
            "telemetry.queue_size",
        ),
    ] {
        let errors = load_str(&toml, &no_env())
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert_eq!(errors.len(), 1, "{toml}: {errors:?}");
        assert_eq!(errors[0].path, path);
    }
}

/// A key pasted as a provider's or tenant's table name is not printed back, in the message or
/// in the key path that names the table.
#[test]
fn a_key_pasted_as_a_table_name_is_not_printed_back() {
    let key = "sk-ant-api03-Zx9PastedKeyAbCdEfGh12";
    let toml = format!(
        "[providers.\"{key}\"]\nkind = \"anthropic\"\n[tenants.\"{key}\"]\npriority = \"batch\"\n"
    );
    let errors = load_str(&toml, &no_env())
        .err()
        .map(|e| e.0)
        .unwrap_or_default();
    assert!(errors.len() >= 2, "{errors:?}");
    for e in &errors {
        assert!(!e.to_string().contains(key), "{e}");
    }
    assert!(
        errors
            .iter()
            .any(|e| e.path.starts_with("providers.<35 characters"))
    );
}

/// A budget given in the environment stays the exact decimal it was written as (it went
/// through a float), and takes no form the file refuses.
#[test]
fn a_budget_from_the_environment_stays_exact() -> TestResult {
    let var = "LEGATE__TENANTS__DEFAULT__DAILY_BUDGET_USD";
    let env = |v: &str| HashMap::from([(var.to_owned(), v.to_owned())]);
    let cfg = load_str("", &env("12345678901234.567891"))?;
    let pico = cfg.tenants["default"].daily_budget_pico;
    assert_eq!(pico, 12_345_678_901_234_567_891_000_000);
    assert!(
        load_str("", &env("1e2")).is_err(),
        "the file refuses 1e2 too"
    );
    Ok(())
}

/// A deployment switches a provider to a mounted key file from the environment alone: the
/// file's (or the embedded default's) `api_key_env` gives way, and an empty one unsets it.
#[test]
fn a_key_file_chosen_in_the_environment_replaces_the_files_variable() -> TestResult {
    let (_dir, key) = crate::config::load::temp_file("key", "sk-file\n")?;
    let var = "LEGATE__PROVIDERS__ANTHROPIC__API_KEY_FILE";
    let env = HashMap::from([(var.to_owned(), key.display().to_string())]);
    let cfg = load_str("", &env)?;
    assert!(matches!(&cfg.providers["anthropic"].key, KeySource::File { path } if *path == key));
    let unset = HashMap::from([(
        "LEGATE__PROVIDERS__OPENAI__API_KEY_ENV".to_owned(),
        String::new(),
    )]);
    let cfg = load_str("", &unset)?;
    assert!(matches!(&cfg.providers["openai"].key, KeySource::None));
    // Both named in the environment is still the one conflict.
    let mut both = env.clone();
    both.insert(
        "LEGATE__PROVIDERS__ANTHROPIC__API_KEY_ENV".to_owned(),
        "K".to_owned(),
    );
    assert!(load_str("", &both).is_err());
    Ok(())
}

/// A value refused that came from the environment names its variable: the file shows
/// another, or none.
#[test]
fn a_refused_override_names_its_variable() {
    let var = "LEGATE__SERVER__MAX_BODY_BYTES";
    let env = HashMap::from([(var.to_owned(), "0".to_owned())]);
    let errors = load_str("", &env).err().map(|e| e.0).unwrap_or_default();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "server.max_body_bytes");
    assert!(
        errors[0]
            .message
            .ends_with(&format!("(the value of ${var})")),
        "{}",
        errors[0].message
    );
    let from_file = load_str("[server]\nmax_body_bytes = 0\n", &no_env()).err();
    let message = from_file
        .map(|e| e.0[0].message.clone())
        .unwrap_or_default();
    assert!(!message.contains("the value of $"), "{message}");
}

/// A body larger than every body legate holds at once could never be read: refused 529 with
/// `retry-after` for ever. The two bounds are checked against each other.
#[test]
fn a_body_limit_past_the_buffered_bound_is_refused() {
    let errors = load_str(
        "[server]\nmax_body_bytes = 100000\nmax_buffered_bytes = 1000\n",
        &no_env(),
    )
    .err()
    .map(|e| e.0)
    .unwrap_or_default();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "server.max_body_bytes");
    assert!(
        load_str(
            "[server]\nmax_body_bytes = 1000\nmax_buffered_bytes = 1000\n",
            &no_env()
        )
        .is_ok()
    );
}

/// An empty `[providers]` table replaces the defaults with nothing, and is refused.
#[test]
fn an_empty_providers_table_is_refused() {
    let errors = load_str("[providers]\n", &no_env())
        .err()
        .map(|e| e.0)
        .unwrap_or_default();
    assert!(errors.iter().any(|e| e.path == "providers"), "{errors:?}");
}

/// `[[…]]` entries come from the file alone: an override the `config` crate would take by
/// index (replacing a whole client or model) is refused, naming its variable.
#[test]
fn overrides_of_the_arrays_are_refused_by_name() {
    let file = "[[models]]\nname = \"m\"\nchain = [\"anthropic:claude-x\"]\n";
    for var in [
        "LEGATE__CLIENTS[0]__TENANT",
        "LEGATE__MODELS[0]__NAME",
        "LEGATE__MODELS__0__NAME",
        "legate__prices__model",
    ] {
        let env = crate::config::load::env_of(&[(var, "x")]);
        let errors = load_str(file, &env).err().map(|e| e.0).unwrap_or_default();
        assert_eq!(errors.len(), 1, "{var}: {errors:?}");
        assert!(errors[0].message.contains(var), "{}", errors[0].message);
    }
    let env = crate::config::load::env_of(&[("LEGATE__RETRY__MAX_ATTEMPTS", "5")]);
    assert!(load_str(file, &env).is_ok());
}

/// A key source chosen in the environment replaces the file's either way: a variable named
/// there drops the file's key file, and a key file given there drops the file's variable.
#[test]
fn a_key_source_from_the_environment_replaces_the_files() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("key");
    std::fs::write(&key, "sk-test-key\n")?;
    let with_file = format!(
        "[providers.anthropic]\nkind = \"anthropic\"\napi_key_file = \"{}\"\n",
        key.display()
    );
    let env = crate::config::load::env_of(&[(
        "LEGATE__PROVIDERS__ANTHROPIC__API_KEY_ENV",
        "ANTHROPIC_API_KEY",
    )]);
    let cfg = load_str(&with_file, &env)?;
    assert!(matches!(
        cfg.providers["anthropic"].key,
        crate::config::KeySource::Env { .. }
    ));
    let with_env =
        "[providers.anthropic]\nkind = \"anthropic\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n";
    let path = key.display().to_string();
    let env = crate::config::load::env_of(&[(
        "LEGATE__PROVIDERS__ANTHROPIC__API_KEY_FILE",
        path.as_str(),
    )]);
    let cfg = load_str(with_env, &env)?;
    assert!(matches!(
        cfg.providers["anthropic"].key,
        crate::config::KeySource::File { .. }
    ));
    // Both set in the environment stay both set, and are refused.
    let env = crate::config::load::env_of(&[
        ("LEGATE__PROVIDERS__ANTHROPIC__API_KEY_FILE", path.as_str()),
        (
            "LEGATE__PROVIDERS__ANTHROPIC__API_KEY_ENV",
            "ANTHROPIC_API_KEY",
        ),
    ]);
    assert!(load_str(with_env, &env).is_err());
    Ok(())
}

/// A config file is read only when it is a regular file of at most 16 MiB: `--config
/// /dev/zero` took the process's memory, and a FIFO would hold `serve` for ever.
#[test]
fn a_config_file_is_a_bounded_regular_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let huge = dir.path().join("huge.toml");
    std::fs::write(&huge, vec![b'#'; (16 << 20) + 1])?;
    let message = |path: &std::path::Path| match crate::config::load_with_env(Some(path), &no_env())
    {
        Err(e) => e.0.first().map(|e| e.message.clone()).unwrap_or_default(),
        Ok(_) => String::new(),
    };
    assert!(
        message(&huge).contains("larger than 16 MiB"),
        "{}",
        message(&huge)
    );
    assert!(
        message(std::path::Path::new("/dev/zero")).contains("not a regular file"),
        "{}",
        message(std::path::Path::new("/dev/zero"))
    );
    let fine = dir.path().join("fine.toml");
    std::fs::write(&fine, "# nothing\n")?;
    assert!(crate::config::load_with_env(Some(&fine), &no_env()).is_ok());
    Ok(())
}

/// An override is the string it is unless its key takes a number or a boolean: a string that
/// looks like a number stays as it was written.
#[test]
fn overrides_keep_strings_and_type_numbers_and_booleans() -> TestResult {
    let env = crate::config::load::env_of(&[
        ("LEGATE__TELEMETRY__SERVICE_NAME", "1.50"),
        ("LEGATE__TELEMETRY__HEADERS__X_SCOPE_ORGID", "007"),
        ("LEGATE__RETRY__MAX_ATTEMPTS", "5"),
        ("LEGATE__PROVIDERS__OPENAI__RESPONSES", "false"),
    ]);
    let cfg = load_str("", &env)?;
    assert_eq!(cfg.observe.telemetry.service_name, "1.50");
    assert!(
        cfg.observe
            .telemetry
            .headers
            .iter()
            .any(|(k, v)| k == "x_scope_orgid" && v == "007"),
        "{:?}",
        cfg.observe.telemetry.headers
    );
    assert_eq!(cfg.retry.max_attempts, 5);
    assert!(!cfg.providers["openai"].responses);
    Ok(())
}
