//! A provider reached over HTTP/2 (TLS, ALPN `h2`) that allows few streams per connection:
//! legate puts no more requests on a connection than the provider allows and opens another
//! instead, so a request never waits unsent inside a connection while its
//! `first_byte_timeout` runs. Every call reaches the provider exactly once, in time.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use crate::harness;

/// A server's socket that writes nothing until `until`.
struct Quiet<T> {
    inner: T,
    until: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<T> Quiet<T> {
    fn new(inner: T, quiet: Duration) -> Self {
        Quiet {
            inner,
            until: Box::pin(tokio::time::sleep(quiet)),
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Quiet<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Quiet<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.until.as_mut().poll(cx));
        std::pin::Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.until.as_mut().poll(cx));
        std::pin::Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

const ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}"#;

/// What the provider saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    requests: AtomicUsize,
}

/// An HTTP/2-only provider over TLS for `localhost` that allows `streams` at once per
/// connection and answers each request after `pace` (its own generation time), with
/// `padding` bytes of extra response headers, and writes nothing (its SETTINGS included) for
/// `quiet` after the TLS handshake, as a provider a round trip away. Returns its base URL, the CA to trust, and what
/// it saw.
async fn provider(
    streams: u32,
    pace: Duration,
    padding: usize,
    quiet: Duration,
) -> (String, String, Arc<Seen>) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            counts.connections.fetch_add(1, Ordering::SeqCst);
            let (acceptor, counts) = (acceptor.clone(), counts.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |_req| {
                    let counts = counts.clone();
                    async move {
                        counts.requests.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(pace).await;
                        let mut resp =
                            http::Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
                        resp.headers_mut()
                            .insert("content-type", "application/json".parse().unwrap());
                        // In lines of 1 KiB, as a provider's debug headers come.
                        for i in 0..padding / 1024 {
                            let name = http::HeaderName::try_from(format!("x-pad-{i}")).unwrap();
                            resp.headers_mut()
                                .insert(name, "p".repeat(1024).parse().unwrap());
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(streams)
                    .serve_connection(TokioIo::new(Quiet::new(tls, quiet)), svc)
                    .await;
            });
        }
    });
    (format!("https://localhost:{port}"), ck.cert.pem(), seen)
}

/// legate in front of the provider at `url`, trusting `ca_pem` (its config passed through
/// `edit`).
async fn legate_before(url: &str, ca_pem: &str, edit: impl Fn(String) -> String) -> harness::Env {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml_with(url, "", &format!("ca_file = \"{}\"", ca.display()), "");
    // The CA file is read at start: the directory may go when this returns.
    harness::start_toml(mock, &edit(toml)).await
}

#[tokio::test]
async fn a_provider_allowing_one_stream_gets_each_call_once_on_a_connection_of_its_own() {
    const CALLS: usize = 12;
    // Queued one behind another on one connection, the last would wait 12 × 200 ms, past the
    // 2 s first_byte_timeout.
    let (url, ca_pem, seen) = provider(1, Duration::from_millis(200), 0, Duration::ZERO).await;
    let env = legate_before(&url, &ca_pem, |toml| {
        toml.replace("first_byte_timeout = \"5s\"", "first_byte_timeout = \"2s\"")
    })
    .await;
    // All at once, on a cold pool: the provider's SETTINGS are not known when the burst comes,
    // and a connection carries only its opener's request until they are.
    let calls =
        (0..CALLS).map(|_| env.messages(r#"{"model":"claude-x","max_tokens":1,"messages":[]}"#));
    for resp in futures_util::future::join_all(calls).await {
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-legate-attempts"], "1");
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), CALLS);
    assert!(seen.connections.load(Ordering::SeqCst) > 1);
    assert_eq!(
        env.metric(
            "legate_upstream_attempts_total",
            &[("provider", "anthropic"), ("outcome", "timeout")]
        )
        .await
        .unwrap_or(0.0),
        0.0
    );
}

/// An answer whose head HTTP/1 takes (here 20 KiB of headers) is taken over HTTP/2 too: it
/// was refused by hyper's default 16 KiB bound, reported as "could not connect", and the
/// provider ran the call three times.
#[tokio::test]
async fn an_answer_with_a_large_head_is_taken_over_http2_as_over_http1() {
    let (url, ca_pem, seen) = provider(100, Duration::ZERO, 20 << 10, Duration::ZERO).await;
    let env = legate_before(&url, &ca_pem, |toml| toml).await;
    let resp = env
        .messages(r#"{"model":"claude-x","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    assert_eq!(resp.headers()["x-pad-19"].len(), 1024);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
}

/// A provider whose SETTINGS come a while after the connection opens (here 300 ms): requests
/// that come meanwhile do not pile onto that connection, whose limit is not known yet (the
/// provider would refuse their streams), but get connections of their own.
#[tokio::test]
async fn requests_before_the_providers_settings_do_not_pile_onto_its_connection() {
    let (url, ca_pem, seen) = provider(1, Duration::ZERO, 0, Duration::from_millis(300)).await;
    let env = legate_before(&url, &ca_pem, |toml| toml).await;
    let body = r#"{"model":"claude-x","max_tokens":1,"messages":[]}"#;
    let first = env.messages(body);
    // The rest come once the provider has accepted the first connection, whose SETTINGS it
    // then holds back for 300 ms: they find a connection whose limit is not known yet.
    let rest = async {
        let opened = async {
            while seen.connections.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), opened)
            .await
            .expect("the first connection reaches the provider");
        futures_util::future::join_all((0..6).map(|_| env.messages(body))).await
    };
    let (first, rest) = tokio::join!(first, rest);
    for resp in std::iter::once(first).chain(rest) {
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-legate-attempts"], "1");
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 7);
}
