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
    /// Requests a GOAWAY told legate were not processed.
    unprocessed: AtomicUsize,
    /// legate closed the connection that was turned away from (not the provider's timeout).
    let_go: std::sync::atomic::AtomicBool,
    /// The GOAWAY was written.
    goaway_sent: std::sync::atomic::AtomicBool,
    /// The header lines of each request answered.
    heads: std::sync::Mutex<Vec<http::HeaderMap>>,
}

/// A TLS acceptor for `localhost` that offers only `h2`, and the CA to trust.
fn h2_acceptor() -> (tokio_rustls::TlsAcceptor, String) {
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
    (
        tokio_rustls::TlsAcceptor::from(Arc::new(cfg)),
        ck.cert.pem(),
    )
}

/// How a provider's connection behaves.
#[derive(Clone, Copy)]
struct Shape {
    /// Streams allowed at once.
    streams: u32,
    /// Its own generation time per answer.
    pace: Duration,
    /// Bytes of extra response headers.
    padding: usize,
    /// How long it writes nothing (its SETTINGS included) after the TLS handshake, as a
    /// provider a round trip away.
    quiet: Duration,
}

impl Shape {
    /// 100 streams, answered at once, with no extra headers and no quiet spell.
    const PLAIN: Shape = Shape {
        streams: 100,
        pace: Duration::ZERO,
        padding: 0,
        quiet: Duration::ZERO,
    };
}

/// legate's attempts at the provider with `outcome`, in the scrape `text`.
fn attempts(text: &str, outcome: &str) -> Option<f64> {
    harness::metric_value(
        text,
        "legate_upstream_attempts_total",
        &[("provider", "anthropic"), ("outcome", outcome)],
    )
}

/// One `/v1/messages` call through legate (its config passed through `edit`) to a provider
/// whose first connection turns its first request away `how`; the answer, what the provider
/// saw, and the scrape after it.
async fn one_call(
    how: TurnAway,
    edit: impl Fn(String) -> String,
) -> (reqwest::Response, Arc<Seen>, String, harness::Env) {
    let (url, ca_pem, seen) = provider_with(Shape::PLAIN, Some(how)).await;
    let env = legate_before(&url, &ca_pem, edit).await;
    let resp = env
        .messages(r#"{"model":"claude-x","max_tokens":1,"messages":[]}"#)
        .await;
    let text = env.metrics_text().await;
    (resp, seen, text, env)
}

/// Whether `cond` came true within 10 s: a poll of the condition itself, 10 ms between looks.
async fn within_10s(cond: impl Fn() -> bool) -> bool {
    let poll = async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .is_ok()
}

/// Waits (up to 10 s) until legate closes the connection the provider turned away from.
async fn let_go(seen: &Seen) {
    let closed = within_10s(|| seen.let_go.load(Ordering::SeqCst)).await;
    assert!(closed, "legate closes the connection it no longer uses");
}

/// Serves one connection with hyper's HTTP/2 server, answering every request with `ANSWER`.
async fn serve_h2<T>(io: T, shape: Shape, counts: Arc<Seen>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let counts = counts.clone();
        async move {
            counts.heads.lock().unwrap().push(req.headers().clone());
            counts.requests.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(shape.pace).await;
            let mut resp = http::Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            // In lines of 1 KiB, as a provider's debug headers come.
            for i in 0..shape.padding / 1024 {
                let name = http::HeaderName::try_from(format!("x-pad-{i}")).unwrap();
                resp.headers_mut()
                    .insert(name, "p".repeat(1024).parse().unwrap());
            }
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_concurrent_streams(shape.streams)
        .serve_connection(TokioIo::new(Quiet::new(io, shape.quiet)), svc)
        .await;
}

/// How a provider's first connection turns its first request away, frame by frame.
#[derive(Clone, Copy)]
enum TurnAway {
    /// RST_STREAM(REFUSED_STREAM) on the request's stream (RFC 9113 §8.7).
    Refuse,
    /// GOAWAY(NO_ERROR) naming this as the last stream processed (RFC 9113 §6.8), then the
    /// end of the connection.
    GoAway(u32),
    /// Nothing: the request's stream is never answered (a peer gone without a FIN, a backend
    /// that hung), while the connection stays open.
    Silent,
    /// GOAWAY(NO_ERROR) naming no stream, right after its SETTINGS, before any request is
    /// read (a front end that is shutting down).
    GoAwayAtOnce,
    /// GOAWAY(NO_ERROR) naming the request's stream as the last, the connection left open
    /// (as a front end retiring it lets its streams finish); the request answered once a
    /// second one reached the provider.
    GoAwayThenAnswer,
    /// The answer's head (200, JSON), and then nothing: its body never comes, while the
    /// connection stays open.
    HeadOnly,
    /// A stream's head and first events (200, SSE), and then nothing, the connection left
    /// open.
    StreamThenStall,
}

/// An HTTP/2-only provider over TLS for `localhost` shaped by `shape`, whose first connection,
/// with `first`, turns its first request away ([`turn_away`]). Returns its base URL, the CA to
/// trust, and what it saw.
async fn provider_with(shape: Shape, first: Option<TurnAway>) -> (String, String, Arc<Seen>) {
    let (acceptor, ca) = h2_acceptor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let nth = counts.connections.fetch_add(1, Ordering::SeqCst);
            let (acceptor, counts) = (acceptor.clone(), counts.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                match first.filter(|_| nth == 0) {
                    Some(how) => turn_away(tls, how, &counts).await,
                    None => serve_h2(tls, shape, counts).await,
                }
            });
        }
    });
    (format!("https://localhost:{port}"), ca, seen)
}

/// [`provider_with`] without a GOAWAY.
async fn provider(
    streams: u32,
    pace: Duration,
    padding: usize,
    quiet: Duration,
) -> (String, String, Arc<Seen>) {
    let shape = Shape {
        streams,
        pace,
        padding,
        quiet,
    };
    provider_with(shape, None).await
}

/// Speaks HTTP/2 frame by frame (RFC 9113 §4, §6): its SETTINGS, an ack of the client's, and
/// at the first request's HEADERS the turning away `how`; after a GOAWAY it closes its side.
/// Then it reads until the client closes (at most 10 s). The request is counted in
/// `seen.requests` when a GOAWAY keeps it (the provider may have run it), and in
/// `seen.unprocessed` when it was refused or left past the GOAWAY's last stream.
async fn turn_away<T>(mut io: T, how: TurnAway, seen: &Seen)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let frame = |kind: u8, flags: u8, payload: &[u8]| {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    };
    let mut preface = [0u8; 24];
    io.read_exact(&mut preface).await.unwrap();
    assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    io.write_all(&frame(0x4, 0, &[])).await.unwrap();
    if let TurnAway::GoAwayAtOnce = how {
        io.write_all(&frame(0x7, 0, &[0; 8])).await.unwrap();
    }
    io.flush().await.unwrap();
    loop {
        let mut head = [0u8; 9];
        io.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await.unwrap();
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if kind == 0x4 && flags & 0x1 == 0 {
            io.write_all(&frame(0x4, 0x1, &[])).await.unwrap();
            io.flush().await.unwrap();
        }
        if kind == 0x1 {
            let kept = match how {
                TurnAway::GoAway(last) => stream <= last,
                TurnAway::GoAwayThenAnswer => true,
                TurnAway::GoAwayAtOnce => false,
                TurnAway::Silent | TurnAway::HeadOnly | TurnAway::StreamThenStall => true,
                TurnAway::Refuse => false,
            };
            let counter = if kept {
                &seen.requests
            } else {
                &seen.unprocessed
            };
            counter.fetch_add(1, Ordering::SeqCst);
            match how {
                TurnAway::GoAwayAtOnce => {
                    let _ = io.shutdown().await;
                }
                TurnAway::Silent => {}
                TurnAway::HeadOnly => {
                    let mut headers = frame(0x1, 0x4, &ok_head("application/json"));
                    headers[5..9].copy_from_slice(&stream.to_be_bytes());
                    io.write_all(&headers).await.unwrap();
                    io.flush().await.unwrap();
                }
                TurnAway::StreamThenStall => {
                    let mut headers = frame(0x1, 0x4, &ok_head("text/event-stream"));
                    let mut data = frame(0x0, 0x0, FIRST_EVENTS.as_bytes());
                    headers[5..9].copy_from_slice(&stream.to_be_bytes());
                    data[5..9].copy_from_slice(&stream.to_be_bytes());
                    io.write_all(&[headers, data].concat()).await.unwrap();
                    io.flush().await.unwrap();
                }
                TurnAway::Refuse => {
                    let mut reset = frame(0x3, 0, &7u32.to_be_bytes());
                    reset[5..9].copy_from_slice(&stream.to_be_bytes());
                    io.write_all(&reset).await.unwrap();
                    io.flush().await.unwrap();
                }
                TurnAway::GoAway(last) => {
                    let mut goaway = last.to_be_bytes().to_vec();
                    goaway.extend_from_slice(&0u32.to_be_bytes());
                    io.write_all(&frame(0x7, 0, &goaway)).await.unwrap();
                    io.flush().await.unwrap();
                    let _ = io.shutdown().await;
                }
                TurnAway::GoAwayThenAnswer => {
                    let mut goaway = stream.to_be_bytes().to_vec();
                    goaway.extend_from_slice(&0u32.to_be_bytes());
                    io.write_all(&frame(0x7, 0, &goaway)).await.unwrap();
                    io.flush().await.unwrap();
                    seen.goaway_sent.store(true, Ordering::SeqCst);
                    within_10s(|| seen.requests.load(Ordering::SeqCst) >= 2).await;
                    let mut headers = frame(0x1, 0x4, &ok_head("application/json"));
                    let mut data = frame(0x0, 0x1, ANSWER.as_bytes());
                    headers[5..9].copy_from_slice(&stream.to_be_bytes());
                    data[5..9].copy_from_slice(&stream.to_be_bytes());
                    io.write_all(&[headers, data].concat()).await.unwrap();
                    io.flush().await.unwrap();
                }
            }
            break;
        }
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_ok()
    {
        seen.let_go.store(true, Ordering::SeqCst);
    }
}

/// A header block of `:status: 200` (static table entry 8) and `content-type` (entry 31, as a
/// literal without indexing; RFC 7541 §6.1, §6.2.2).
fn ok_head(content_type: &str) -> Vec<u8> {
    let mut block = vec![0x88, 0x0f, 0x10, content_type.len() as u8];
    block.extend_from_slice(content_type.as_bytes());
    block
}

/// A stream's first events, up to its first content.
const FIRST_EVENTS: &str = concat!(
    "event: message_start\n",
    r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":0}}}"#,
    "\n\nevent: content_block_start\n",
    r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    "\n\nevent: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
    "\n\n"
);

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

/// A provider that turns a request away unprocessed is asked once more on a fresh connection
/// at once, as one attempt, with no failure for the breaker.
async fn sent_once_more_as_one_attempt(how: TurnAway) {
    let (resp, seen, text, _env) = one_call(how, |toml| toml).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    once_each(&seen);
    assert_eq!(seen.unprocessed.load(Ordering::SeqCst), 1);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert_eq!(attempts(&text, "ok"), Some(1.0));
    assert_eq!(attempts(&text, "connect_error").unwrap_or(0.0), 0.0);
    assert_eq!(attempts(&text, "retryable").unwrap_or(0.0), 0.0);
}

/// The request the provider answered, sent again after it was turned away, carries each of
/// the caller's lines once (they are added to the request's map before its first send, never
/// again), and one credential.
fn once_each(seen: &Seen) {
    let heads = seen.heads.lock().unwrap();
    assert_eq!(heads.len(), 1);
    for name in ["anthropic-version", "content-type", "x-api-key"] {
        assert_eq!(heads[0].get_all(name).iter().count(), 1, "{name}");
    }
    assert_eq!(heads[0]["x-api-key"], harness::ANTHROPIC_KEY);
}

/// A stream past a GOAWAY's last one (a front end retiring a connection): it was counted a
/// failed attempt, a failure for the breaker, and sent again after a backoff.
#[tokio::test]
async fn a_stream_past_a_goaway_is_sent_once_more_as_one_attempt() {
    sent_once_more_as_one_attempt(TurnAway::GoAway(0)).await;
}

#[tokio::test]
async fn a_refused_stream_is_sent_once_more_as_one_attempt() {
    sent_once_more_as_one_attempt(TurnAway::Refuse).await;
}

/// A GOAWAY that comes with the provider's SETTINGS, before legate's request went out: the
/// request is sent on a fresh connection, as one attempt, whether h2 had opened its stream (past
/// the GOAWAY's last) or hyper hands it back unwritten.
#[tokio::test]
async fn a_goaway_before_the_first_request_is_sent_on_a_fresh_connection() {
    let (resp, seen, _text, _env) = one_call(TurnAway::GoAwayAtOnce, |toml| toml).await;
    assert_eq!(resp.status(), 200);
    once_each(&seen);
    assert_eq!(resp.headers()["x-legate-attempts"], "1");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
}

/// A stream the GOAWAY kept (its id at or below the last one named) may have been run by the
/// provider: when the connection then ends without its answer, that is an ordinary failed
/// attempt, retried by the policy and counted, never sent again unseen.
#[tokio::test]
async fn a_stream_a_goaway_kept_that_then_fails_is_an_ordinary_attempt() {
    let (resp, seen, text, _env) = one_call(TurnAway::GoAway(1), |toml| toml).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "2");
    assert_eq!(seen.unprocessed.load(Ordering::SeqCst), 0);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert_eq!(attempts(&text, "connect_error"), Some(1.0));
    assert_eq!(attempts(&text, "ok"), Some(1.0));
}

/// A connection whose provider said GOAWAY while a stream it kept runs (a front end retiring
/// it) takes no new request: the next goes to a new connection at once, and legate lets the old
/// one go once the kept stream is done (hyper closes such a connection to new requests once it
/// has handled the frame; legate notes the frame as it arrives, for the moment before).
#[tokio::test]
async fn a_connection_that_said_goaway_takes_no_new_request_and_is_let_go() {
    let (url, ca_pem, seen) = provider_with(Shape::PLAIN, Some(TurnAway::GoAwayThenAnswer)).await;
    let env = legate_before(&url, &ca_pem, |toml| toml).await;
    let body = r#"{"model":"claude-x","max_tokens":1,"messages":[]}"#;
    let kept = env.messages(body);
    let next = async {
        let sent = within_10s(|| seen.goaway_sent.load(Ordering::SeqCst)).await;
        assert!(sent, "the provider says GOAWAY");
        env.messages(body).await
    };
    let (kept, next) = tokio::join!(kept, next);
    for resp in [kept, next] {
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-legate-attempts"], "1");
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert_eq!(seen.unprocessed.load(Ordering::SeqCst), 0);
    let_go(&seen).await;
}

/// A connection on which a request got no answer within `first_byte_timeout` takes no new
/// request: the retry goes to a fresh connection and is answered, and legate lets the silent
/// one go. The retry went on the same connection, and so did every later request, each
/// timing out in turn (here: 504 after three attempts).
#[tokio::test]
async fn a_connection_that_left_a_request_unanswered_in_time_takes_no_new_request() {
    let (resp, seen, text, _env) = one_call(TurnAway::Silent, |toml| {
        toml.replace("first_byte_timeout = \"5s\"", "first_byte_timeout = \"1s\"")
    })
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "2");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert_eq!(attempts(&text, "timeout"), Some(1.0));
    assert_eq!(attempts(&text, "ok"), Some(1.0));
    let_go(&seen).await;
}

/// A connection on which an answer's body stalled past `idle_timeout` takes no new request:
/// the retry goes to a fresh connection and is answered, and legate lets the stalled one go.
/// The retry went on the same connection (what stalled the body stalls the next stream too),
/// and so did every later request.
#[tokio::test]
async fn a_connection_whose_answer_stalled_takes_no_new_request() {
    let (resp, seen, text, _env) = one_call(TurnAway::HeadOnly, |toml| {
        toml.replace("idle_timeout = \"5s\"", "idle_timeout = \"1s\"")
    })
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-legate-attempts"], "2");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    assert_eq!(attempts(&text, "ok"), Some(1.0));
    assert_eq!(attempts(&text, "retryable"), Some(1.0));
    let_go(&seen).await;
}

/// The same once a stream has reached the caller: it ends with the error event after
/// `idle_timeout`, and the next request goes to a fresh connection at once. It went on the
/// stalled connection and waited out its `first_byte_timeout` there.
#[tokio::test]
async fn a_connection_whose_stream_stalled_takes_no_new_request() {
    let (url, ca_pem, seen) = provider_with(Shape::PLAIN, Some(TurnAway::StreamThenStall)).await;
    let env = legate_before(&url, &ca_pem, |toml| {
        toml.replace("idle_timeout = \"5s\"", "idle_timeout = \"1s\"")
    })
    .await;
    let stream = env
        .messages(r#"{"model":"claude-x","max_tokens":1,"stream":true,"messages":[]}"#)
        .await;
    assert_eq!(stream.status(), 200);
    let events = stream.text().await.unwrap();
    assert!(events.contains("\"text\":\"hi\""), "{events}");
    assert!(events.contains("event: error"), "{events}");
    let next = env
        .messages(r#"{"model":"claude-x","max_tokens":1,"messages":[]}"#)
        .await;
    assert_eq!(next.status(), 200);
    assert_eq!(next.headers()["x-legate-attempts"], "1");
    assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    let_go(&seen).await;
}

#[tokio::test]
async fn a_callers_lines_go_on_over_http2_with_one_credential() {
    let (url, ca_pem, seen) = provider(100, Duration::ZERO, 0, Duration::ZERO).await;
    let env = legate_before(&url, &ca_pem, |toml| toml).await;
    let resp = env
        .http
        .post(env.url("/v1/messages"))
        .header("x-api-key", "client-dummy-key")
        .header("authorization", "Bearer client-dummy-token")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "feature-a")
        .header("x-stainless-lang", "python")
        .header("user-agent", "Anthropic/Python 2.14.0")
        .header("x-legate-priority", "batch")
        .body(r#"{"model":"claude-x","max_tokens":1,"messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let heads = seen.heads.lock().unwrap();
    assert_eq!(heads.len(), 1);
    let h = &heads[0];
    let all = |name: &str| -> Vec<&str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    };
    assert_eq!(all("x-api-key"), vec![harness::ANTHROPIC_KEY]);
    assert!(all("authorization").is_empty());
    assert!(all("x-legate-priority").is_empty());
    assert_eq!(all("anthropic-version"), vec!["2023-06-01"]);
    assert_eq!(all("anthropic-beta"), vec!["feature-a"]);
    assert_eq!(all("x-stainless-lang"), vec!["python"]);
    assert_eq!(all("user-agent"), vec!["Anthropic/Python 2.14.0"]);
    assert_eq!(all("accept-encoding"), vec!["identity"]);
    assert!(!format!("{h:?}").contains("client-dummy"));
}
