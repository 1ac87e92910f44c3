//! Real TLS to the upstream: a provider behind a certificate from a private CA is reached
//! through `ca_file`, and refused without it.

use crate::harness;

fn tls_mock_config() -> (std::sync::Arc<rustls::ServerConfig>, String) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = ck.cert.pem();
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key_der)
    .unwrap();
    (std::sync::Arc::new(cfg), cert_pem)
}

#[tokio::test]
async fn provider_behind_a_private_ca_is_reached_with_ca_file() {
    let (server_cfg, cert_pem) = tls_mock_config();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, cert_pem).unwrap();
    let mock = legate::mock::MockServer::start(
        ([127, 0, 0, 1], 0).into(),
        legate::mock::Script::default(),
        Some(server_cfg),
    )
    .await
    .unwrap();
    assert!(mock.base_url().starts_with("https://"));
    let toml = harness::config_toml_with(
        &mock.base_url(),
        "",
        &format!("ca_file = \"{}\"", ca.display()),
        "",
    );
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .messages(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(env.mock.stats().requests, 1);
    let r = env.mock.requests().remove(0);
    assert_eq!(
        harness::header_values(&r.headers, "x-api-key"),
        vec![harness::ANTHROPIC_KEY]
    );
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let (server_cfg, _) = tls_mock_config();
    let mock = legate::mock::MockServer::start(
        ([127, 0, 0, 1], 0).into(),
        legate::mock::Script::default(),
        Some(server_cfg),
    )
    .await
    .unwrap();
    let toml = harness::config_toml(&mock.base_url(), "");
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .messages(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 502);
    assert_eq!(env.mock.stats().completed, 0);
}
