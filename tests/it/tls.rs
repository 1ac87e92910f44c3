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
    // A refused certificate is refused again at once: the step is left without its retries,
    // and the caller is told what failed.
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    let rid = resp.headers()["x-legate-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let body: serde_json::Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("TLS certificate"), "{message}");
    assert!(message.contains("certificate"), "{message}");
    assert_eq!(env.mock.stats().completed, 0);
    // Nothing was sent, and the journal says so.
    let doc = env.admin_json(&format!("/admin/requests/{rid}")).await;
    assert_eq!(doc["attempts_detail"][0]["sent"], false, "{doc}");
}

/// A provider that takes the connection and never finishes the TLS handshake is given up on
/// at `connect_timeout`, as "could not connect", not held to the first-byte timeout.
#[tokio::test]
async fn a_handshake_that_never_finishes_is_bounded_by_connect_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts, reads the ClientHello, answers nothing; keeps the sockets open.
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml_with(
        &format!("https://localhost:{port}"),
        "",
        "connect_timeout = \"200ms\"",
        "[retry]\nmax_attempts = 1\n",
    )
    .replace(
        "first_byte_timeout = \"5s\"",
        "first_byte_timeout = \"30s\"",
    );
    let env = harness::start_toml(mock, &toml).await;
    let resp = env
        .messages(r#"{"model":"m","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 502);
    let body: serde_json::Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("could not connect"), "{message}");
}

/// A private CA issuing a server certificate for `localhost` and a client certificate.
struct Pki {
    ca_pem: String,
    server_der: rustls::pki_types::CertificateDer<'static>,
    server_key: rustls::pki_types::PrivateKeyDer<'static>,
    client_pem: String,
    client_key_pem: String,
    ca_der: rustls::pki_types::CertificateDer<'static>,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["legate-client".to_string()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        ca_der: ca.der().clone(),
        server_der: server.der().clone(),
        server_key: rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        client_pem: client.pem(),
        client_key_pem: client_key.serialize_pem(),
    }
}

#[tokio::test]
async fn mutual_tls_presents_the_configured_client_certificate() {
    let pki = pki();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![pki.server_der.clone()], pki.server_key.clone_key())
        .unwrap();
    let mock = legate::mock::MockServer::start(
        ([127, 0, 0, 1], 0).into(),
        legate::mock::Script::default(),
        Some(std::sync::Arc::new(server_cfg)),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let ca = write("ca.pem", &pki.ca_pem);
    let cert = write("client.pem", &pki.client_pem);
    let key = write("client.key", &pki.client_key_pem);
    let body = r#"{"model":"m","max_tokens":1,"messages":[]}"#;

    // Without the client certificate the handshake is refused.
    let toml = harness::config_toml_with(&mock.base_url(), "", &format!("ca_file = \"{ca}\""), "");
    let env = harness::start_toml(mock, &toml).await;
    assert_eq!(env.messages(body).await.status(), 502);
    assert_eq!(env.mock.stats().requests, 0);

    // With it, the call goes through.
    let toml = harness::config_toml_with(
        &env.mock.base_url(),
        "",
        &format!("ca_file = \"{ca}\"\nclient_cert_file = \"{cert}\"\nclient_key_file = \"{key}\""),
        "",
    );
    let env = harness::start_toml(env.mock, &toml).await;
    assert_eq!(env.messages(body).await.status(), 200);
    assert_eq!(env.mock.stats().requests, 1);
}
