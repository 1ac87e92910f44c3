//! `[providers.*]` rules: kinds, names, key sources and TLS files.

use super::{TestResult, no_env, refused_at};
use crate::config::load::{env_of, temp_file};
use crate::config::{KeySource, load_str};

#[test]
fn provider_kinds_and_names_are_checked() {
    refused_at("[providers.gem]\nkind = \"gemini\"", "providers.gem.kind");
    refused_at(
        "[providers.anthropic]\n[providers.gem]\nbase_url = \"https://x.example\"",
        "providers.gem.kind",
    );
    refused_at(
        "[providers.Claude]\nkind = \"anthropic\"",
        "providers.Claude",
    );
    refused_at(
        "[providers.anthropic]\nauth_header = \"basic\"",
        "providers.anthropic.auth_header",
    );
    refused_at(
        "[providers.anthropic]\ntls_roots = \"system\"",
        "providers.anthropic.tls_roots",
    );
    refused_at(
        "[providers.anthropic]\nbase_url = \"ftp://x.example\"",
        "providers.anthropic.base_url",
    );
    refused_at(
        "[providers.anthropic]\nbase_url = \"https://x.example/?beta=1\"",
        "providers.anthropic.base_url",
    );
}

#[test]
fn key_sources_are_checked() -> TestResult {
    refused_at(
        "[providers.anthropic]\napi_key_env = \"A\"\napi_key_file = \"/k\"",
        "providers.anthropic.api_key_file",
    );
    refused_at(
        "[providers.anthropic]\napi_key_file = \"/nonexistent/legate/key\"",
        "providers.anthropic.api_key_file",
    );
    refused_at(
        "[providers.anthropic]\napi_key_env = \"\"",
        "providers.anthropic.api_key_env",
    );

    let (dir, key) = temp_file("key", "sk-file\n")?;
    let toml = format!(
        "[providers.openai]\n[providers.anthropic]\napi_key_file = {:?}",
        key.display().to_string()
    );
    let cfg = load_str(&toml, &no_env())?;
    assert!(matches!(&cfg.providers["anthropic"].key, KeySource::File { path } if *path == key));
    refused_at(
        &format!(
            "[providers.anthropic]\napi_key_file = {:?}",
            dir.path().display().to_string()
        ),
        "providers.anthropic.api_key_file",
    );

    // Keys are read from the injected environment; unset and empty both mean "no key".
    let with_key = load_str(
        "",
        &env_of(&[("ANTHROPIC_API_KEY", "sk-ant"), ("OPENAI_API_KEY", "")]),
    )?;
    let KeySource::Env { value: Some(v), .. } = &with_key.providers["anthropic"].key else {
        return Err("key not read from the environment".into());
    };
    assert_eq!(v.expose(), "sk-ant");
    assert!(matches!(
        with_key.providers["openai"].key,
        KeySource::Env { value: None, .. }
    ));
    Ok(())
}

#[test]
fn tls_files_must_exist_and_come_in_pairs() -> TestResult {
    refused_at(
        "[providers.anthropic]\nca_file = \"/nonexistent/ca.pem\"",
        "providers.anthropic.ca_file",
    );
    let (_dir, cert) = temp_file("c.pem", "x")?;
    let cert = cert.display().to_string();
    refused_at(
        &format!("[providers.anthropic]\nclient_cert_file = {cert:?}"),
        "providers.anthropic.client_cert_file",
    );
    refused_at(
        &format!("[providers.anthropic]\nclient_key_file = {cert:?}"),
        "providers.anthropic.client_key_file",
    );
    // Files that exist are read as the upstream client reads them.
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    let (_d1, good_cert) = temp_file("cert.pem", &made.cert.pem())?;
    let (_d2, good_key) = temp_file("key.pem", &made.signing_key.serialize_pem())?;
    let (_d3, other_key) = temp_file("other.pem", &other.signing_key.serialize_pem())?;
    let tls = |ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "[providers.openai]\n[providers.anthropic]\nca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}",
            ca.display().to_string(),
            cert.display().to_string(),
            key.display().to_string()
        )
    };
    let cfg = load_str(&tls(&good_cert, &good_cert, &good_key), &no_env())?;
    assert_eq!(
        cfg.providers["anthropic"].client_key_file.as_deref(),
        Some(good_key.as_path())
    );
    let text = std::path::Path::new(&cert);
    // Not PEM where a CA is named; a certificate and a key that do not belong together; a key
    // where the certificate goes.
    refused_at(
        &tls(text, &good_cert, &good_key),
        "providers.anthropic.ca_file",
    );
    refused_at(
        &tls(&good_cert, &good_cert, &other_key),
        "providers.anthropic.client_cert_file",
    );
    refused_at(
        &tls(&good_cert, &good_key, &good_key),
        "providers.anthropic.client_cert_file",
    );
    refused_at(
        &tls(&good_cert, &good_cert, &good_cert),
        "providers.anthropic.client_key_file",
    );
    Ok(())
}
