//! Transports: TLS with a self-signed certificate reached by a client that trusts it, and
//! HTTP/2 with prior knowledge (what a pooled upstream client may speak).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;

use super::{TestResult, anthropic_request, json_of, parse_sse, start, within};
use crate::mock::{MockServer, Script};

#[tokio::test]
async fn serves_https_with_a_trusted_self_signed_certificate() -> TestResult {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

    let listen: SocketAddr = "127.0.0.1:0".parse()?;
    let script = Script::from_value(json!({"replies": [{"status": 200}]}))?;
    let server = MockServer::start(listen, script, Some(Arc::new(config))).await?;
    let base = server.base_url();
    assert_eq!(base, format!("https://localhost:{}", server.addr().port()));

    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_der(certified.cert.der())?)
        .resolve("localhost", server.addr())
        .build()?;
    let url = format!("{base}/v1/messages");
    let plain = client
        .post(&url)
        .body(anthropic_request(false).to_string())
        .send()
        .await?;
    assert_eq!(plain.status(), 200);
    assert_eq!(json_of(plain).await?["type"], "message");
    let stream = client
        .post(&url)
        .body(anthropic_request(true).to_string())
        .send()
        .await?;
    let events = parse_sse(&stream.text().await?);
    assert_eq!(
        events.last().and_then(|e| e.event.as_deref()),
        Some("message_stop")
    );
    assert_eq!(server.requests().len(), 2);

    let untrusting = reqwest::Client::builder()
        .resolve("localhost", server.addr())
        .build()?;
    assert!(untrusting.post(&url).body("{}").send().await.is_err());
    Ok(())
}

#[tokio::test]
async fn serves_h2_and_counts_a_reset_stream_as_cancelled() -> TestResult {
    let server = start(json!({"replies": [{}, {"hang": true}]})).await?;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = |stream: bool| {
        http::Request::post(format!("{}/v1/messages", server.base_url())).body(Full::new(
            Bytes::from(anthropic_request(stream).to_string()),
        ))
    };
    let response = client.request(request(true)?).await?;
    assert_eq!(response.version(), http::Version::HTTP_2);
    let text = response.into_body().collect().await?.to_bytes();
    let events = parse_sse(&String::from_utf8_lossy(&text));
    assert_eq!(
        events.last().and_then(|e| e.event.as_deref()),
        Some("message_stop")
    );

    let hanging = tokio::spawn(client.request(request(false)?));
    within(server.wait_requests(2)).await?;
    hanging.abort();
    within(server.wait_cancelled(1)).await?;
    assert_eq!(server.stats().completed, 1);
    Ok(())
}

#[tokio::test]
async fn shutdown_closes_open_connections_and_the_listener() -> TestResult {
    let server = start(json!({"replies": [{"hang": true}]})).await?;
    let addr = server.addr();
    let url = format!("{}/v1/messages", server.base_url());
    let hanging = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .body(anthropic_request(false).to_string())
            .send()
            .await
    });
    within(server.wait_requests(1)).await?;
    server.shutdown().await;
    let outcome = within(hanging).await??;
    assert!(
        outcome.is_err(),
        "the hanging request ends with a connection error"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the port is released"
    );
    Ok(())
}
