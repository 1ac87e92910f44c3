//! The pool against a real loopback server that counts its connections: reuse, the bound,
//! the idle timeout, the `host` header, and a shared HTTP/2 connection over TLS.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use super::{MAX_RACE_WINDOW, PoolOptions, PooledClient, RACE_WINDOW, host_value, race_window};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A loopback server answering each request with its HTTP version and `host` header, once
/// `together` requests have arrived (1: at once).
struct Server {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

async fn serve(tls: Option<Arc<rustls::ServerConfig>>, together: usize) -> std::io::Result<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(together));
    let (a, o) = (accepted.clone(), open.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            o.fetch_add(1, Ordering::SeqCst);
            let (o, barrier, tls) = (o.clone(), barrier.clone(), tls.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let barrier = barrier.clone();
                    async move {
                        barrier.wait().await;
                        let host = req
                            .headers()
                            .get(http::header::HOST)
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("-");
                        let text = format!("{:?} {host}", req.version());
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(text))))
                    }
                });
                let builder = auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(cfg) => {
                        if let Ok(io) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await {
                            let _ = builder.serve_connection(TokioIo::new(io), svc).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Ok(Server {
        addr,
        accepted,
        open,
    })
}

fn options(idle: Duration, max_conns: usize) -> PoolOptions {
    PoolOptions {
        idle_timeout: idle,
        max_conns,
        lists: 1,
        max_buf: 64 << 10,
        connect_timeout: Duration::from_secs(5),
    }
}

fn plain_client(base: &Uri, opts: PoolOptions) -> PooledClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build();
    PooledClient::new(connector, Some(base), opts)
}

/// Sends one POST to `url` and reads the answer's text.
async fn text_of(
    client: &PooledClient,
    url: &str,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let mut req = Request::new(Full::new(Bytes::from_static(b"{}")));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = url.parse()?;
    let resp = client.request(req, tokio::time::Instant::now()).await?;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(body.to_vec())?)
}

#[tokio::test]
async fn sequential_requests_share_one_connection_and_carry_the_host() -> TestResult {
    let server = serve(None, 1).await?;
    let base: Uri = format!("http://{}/v1", server.addr).parse()?;
    let client = plain_client(&base, options(Duration::from_secs(60), 8));
    let url = format!("http://{}/v1/messages", server.addr);
    one_http1_connection(&server, &client, &url, 5).await
}

/// `n` requests one after the other go out as HTTP/1.1 with the `host` header, all on one
/// connection, which stays listed.
async fn one_http1_connection(
    server: &Server,
    client: &PooledClient,
    url: &str,
    n: usize,
) -> TestResult {
    for _ in 0..n {
        assert_eq!(
            text_of(client, url).await?,
            format!("HTTP/1.1 {}", server.addr)
        );
    }
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(client.listed(), 1);
    Ok(())
}

#[tokio::test]
async fn concurrent_requests_open_one_connection_each_and_the_list_is_bounded() -> TestResult {
    let server = serve(None, 4).await?;
    let base: Uri = format!("http://{}", server.addr).parse()?;
    let client = plain_client(&base, options(Duration::from_secs(60), 2));
    let url = format!("http://{}/v1/messages", server.addr);
    // The server answers none of the four until all four arrived: four connections at once.
    let (a, b, c, d) = tokio::join!(
        text_of(&client, &url),
        text_of(&client, &url),
        text_of(&client, &url),
        text_of(&client, &url)
    );
    for t in [a, b, c, d] {
        assert!(t?.starts_with("HTTP/1.1 "));
    }
    assert_eq!(server.accepted.load(Ordering::SeqCst), 4);
    assert_eq!(
        client.listed(),
        2,
        "two of them are kept, the others closed"
    );
    Ok(())
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() -> TestResult {
    let server = serve(None, 1).await?;
    let base: Uri = format!("http://{}", server.addr).parse()?;
    let client = plain_client(&base, options(Duration::from_millis(300), 8));
    let url = format!("http://{}/v1/messages", server.addr);
    text_of(&client, &url).await?;
    assert_eq!(client.listed(), 1);
    let give_up = Instant::now() + Duration::from_secs(10);
    while server.open.load(Ordering::SeqCst) > 0 && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.open.load(Ordering::SeqCst),
        0,
        "the server saw it closed"
    );
    assert_eq!(client.listed(), 0);
    // The next request opens a new one.
    text_of(&client, &url).await?;
    assert_eq!(server.accepted.load(Ordering::SeqCst), 2);
    Ok(())
}

/// A TLS server offering `alpn`, and a client trusting its certificate.
async fn over_tls(
    alpn: &[&[u8]],
) -> Result<(Server, PooledClient, String), Box<dyn std::error::Error + Send + Sync>> {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)?;
    server_cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let server = serve(Some(Arc::new(server_cfg)), 1).await?;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone())?;
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_cfg)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build();
    let base: Uri = format!("https://{}", server.addr).parse()?;
    let client = PooledClient::new(connector, Some(&base), options(Duration::from_secs(60), 8));
    let url = format!("https://{}/v1/messages", server.addr);
    Ok((server, client, url))
}

#[tokio::test]
async fn an_h2_connection_over_tls_is_shared_by_concurrent_requests() -> TestResult {
    let (server, client, url) = over_tls(&[b"h2", b"http/1.1"]).await?;
    // The first request lists the connection; the next three go out on it together.
    assert_eq!(text_of(&client, &url).await?, "HTTP/2.0 -");
    let (a, b, c) = tokio::join!(
        text_of(&client, &url),
        text_of(&client, &url),
        text_of(&client, &url)
    );
    for t in [a, b, c] {
        assert_eq!(
            t?, "HTTP/2.0 -",
            "HTTP/2 carries :authority, no host header"
        );
    }
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(client.listed(), 1);
    Ok(())
}

#[tokio::test]
async fn an_http1_connection_over_tls_is_reused() -> TestResult {
    // legate's own HTTP/1 client through rustls: the session tickets the server sends after
    // the handshake must not make the idle connection look spoken on.
    let (server, client, url) = over_tls(&[b"http/1.1"]).await?;
    one_http1_connection(&server, &client, &url, 4).await
}

#[test]
fn the_host_header_leaves_out_the_default_port() {
    let host = |u: &str| {
        let uri: Uri = u.parse().unwrap_or_else(|e| panic!("{u}: {e}"));
        host_value(&uri).and_then(|v| v.to_str().ok().map(str::to_owned))
    };
    assert_eq!(
        host("http://127.0.0.1:8080/v1"),
        Some("127.0.0.1:8080".into())
    );
    assert_eq!(host("http://example.com:80"), Some("example.com".into()));
    assert_eq!(
        host("https://example.com:443/x"),
        Some("example.com".into())
    );
    assert_eq!(
        host("https://example.com:80"),
        Some("example.com:80".into())
    );
    assert_eq!(
        host("http://example.com:443"),
        Some("example.com:443".into())
    );
    assert_eq!(host("https://[::1]:8443"), Some("[::1]:8443".into()));
    assert_eq!(
        host("https://api.example.com"),
        Some("api.example.com".into())
    );
    assert_eq!(
        host_value(&"https://api.example.com".parse::<Uri>().unwrap_or_default()),
        Some(HeaderValue::from_static("api.example.com"))
    );
}

#[test]
fn the_race_window_grows_with_a_slow_opening_within_bounds() {
    // A nearby provider (loopback, a region away) keeps the floor.
    assert_eq!(race_window(Duration::ZERO), RACE_WINDOW);
    assert_eq!(race_window(Duration::from_millis(100)), RACE_WINDOW);
    // A provider 300 ms away takes at least that to open: its race's close can come that late.
    assert_eq!(
        race_window(Duration::from_millis(400)),
        Duration::from_millis(600)
    );
    // A resolver that hung is not a far provider.
    assert_eq!(race_window(Duration::from_secs(5)), MAX_RACE_WINDOW);
}
