//! Inbound connections are bounded (SPEC §14): peers that send nothing, only an HTTP/2
//! preface, half a head or half a body are closed within their deadlines; each plane has its
//! own cap, so `/healthz` answers while the data plane is full; `legate_connections` counts
//! them; and under a low descriptor limit the process keeps answering.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{self, Env};

const BODY: &str =
    r#"{"model":"claude-c","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
const STREAMED: &str = r#"{"model":"claude-c","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// `POST /v1/messages` with `body`, for hyper's HTTP/2 client.
fn h2_post(body: &'static str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::post("http://127.0.0.1/v1/messages")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            body.as_bytes(),
        )))
        .unwrap()
}

/// The head of the answer to [`h2_post`] of `body` on `send`: a 200, in time.
async fn answered(
    send: &mut hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    body: &'static str,
) -> http::Response<hyper::body::Incoming> {
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(h2_post(body)))
        .await
        .expect("the answer's head in time")
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

async fn wait_gauge(env: &Env, plane: &str, want: f64) {
    env.wait_metric("legate_connections", &[("plane", plane)], want)
        .await;
}

/// Reads until legate closes the connection; returns what it sent and how long it took.
async fn until_closed(sock: &mut TcpStream) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut got))
        .await
        .expect("legate closes the connection within its deadline")
        .ok();
    (got, start.elapsed())
}

async fn start(server: &str) -> Env {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml_with(&mock.base_url(), server, "", "");
    harness::start_toml(mock, &toml).await
}

#[tokio::test]
async fn silent_preface_only_and_half_head_connections_are_closed_and_probes_still_answer() {
    let env = start(
        "header_read_timeout = \"1s\"\nconnection_idle_timeout = \"30s\"\nmax_connections = 3\nadmin_max_connections = 2\n",
    )
    .await;
    let addr = env.legate.data_addr;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut preface = TcpStream::connect(addr).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut half_head = TcpStream::connect(addr).await.unwrap();
    half_head
        .write_all(b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        .await
        .unwrap();
    wait_gauge(&env, "data", 3.0).await;

    // The data plane is full: a fourth caller takes the place of the connection that has
    // waited longest with nothing pending (`silent`), and the admin plane answers.
    let waiting = tokio::spawn({
        let http = env.http.clone();
        let url = env.url("/v1/messages");
        async move {
            http.post(url)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    let health = env
        .http
        .get(env.admin_url("/healthz"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .expect("/healthz answers while the data plane is full");
    assert_eq!(health.status(), 200);

    for sock in [&mut silent, &mut preface, &mut half_head] {
        let (_, took) = until_closed(sock).await;
        assert!(took < Duration::from_secs(5), "closed after {took:?}");
    }
    let status = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting caller is served once slots free up")
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
}

/// Sends [`BODY`] on `sock` (HTTP/1.1, kept alive) and reads its whole answer.
async fn one_answer(sock: &mut TcpStream) -> String {
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .expect("a content-length")
                .parse()
                .unwrap();
            if body.len() >= len {
                return text;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf))
            .await
            .expect("the answer in time")
            .unwrap();
        assert!(n > 0, "closed before the whole answer: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn a_full_plane_closes_its_longest_idle_connection_for_a_new_one() {
    // Deadlines far away: without room made, the new peers would wait on them.
    let env = start(
        "header_read_timeout = \"60s\"\nconnection_idle_timeout = \"60s\"\nmax_connections = 2\nadmin_max_connections = 2\n",
    )
    .await;
    // Admin: two peers that opened connections and sent nothing hold both slots; a probe on
    // a new connection is answered, and the older of the two is closed for it.
    let mut admin_old = TcpStream::connect(env.legate.admin_addr).await.unwrap();
    wait_gauge(&env, "admin", 1.0).await;
    let admin_new = TcpStream::connect(env.legate.admin_addr).await.unwrap();
    wait_gauge(&env, "admin", 2.0).await;
    let probe = reqwest::Client::builder().no_proxy().build().unwrap();
    let health = probe
        .get(env.admin_url("/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("/healthz answers while idle peers fill the admin plane");
    assert_eq!(health.status(), 200);
    let (got, _) = until_closed(&mut admin_old).await;
    assert!(got.is_empty(), "{got:?}");
    let mut buf = [0u8; 16];
    assert!(
        matches!(admin_new.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "only one connection is closed for the one peer"
    );

    // Data: a keep-alive connection idle since its answer, and a newer silent one, fill the
    // plane; a new caller is served, and the one idle longest is closed after its answer.
    let mut served = TcpStream::connect(env.legate.data_addr).await.unwrap();
    assert!(one_answer(&mut served).await.starts_with("HTTP/1.1 200"));
    let silent = TcpStream::connect(env.legate.data_addr).await.unwrap();
    wait_gauge(&env, "data", 2.0).await;
    let caller = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = caller
        .post(env.url("/v1/messages"))
        .header("content-type", "application/json")
        .body(BODY)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("a new caller is served while idle connections fill the data plane");
    assert_eq!(resp.status(), 200);
    let (got, _) = until_closed(&mut served).await;
    assert!(got.is_empty(), "{got:?}");
    assert!(
        matches!(silent.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    );
    assert_eq!(env.mock.stats().requests, 2);
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408_and_an_idle_connection_is_closed() {
    let env = start("body_read_timeout = \"1s\"\nconnection_idle_timeout = \"1s\"\n").await;
    let mut slow = TcpStream::connect(env.legate.data_addr).await.unwrap();
    slow.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":")
        .await
        .unwrap();
    let (got, took) = until_closed(&mut slow).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_read_timeout"), "{text}");
    // A body too slow to wait for is not read after the answer: the connection ends.
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(env.mock.stats().requests, 0);

    // A keep-alive connection that served a request is closed once idle for too long.
    let mut idle = TcpStream::connect(env.legate.data_addr).await.unwrap();
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    idle.write_all(req.as_bytes()).await.unwrap();
    let (got, took) = until_closed(&mut idle).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    wait_gauge(&env, "data", 0.0).await;
}

#[tokio::test]
async fn http2_connections_that_never_send_a_request_are_closed() {
    let env = start("header_read_timeout = \"1s\"\n").await;
    let mut sock = TcpStream::connect(env.legate.data_addr).await.unwrap();
    // Preface and an empty SETTINGS frame: a valid HTTP/2 start, and then nothing.
    sock.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (_, took) = until_closed(&mut sock).await;
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
}

/// The real binary under `ulimit -n 128`: 150 silent peers must not make it refuse `/healthz`
/// or data-plane callers (the cap follows the descriptor limit, deadlines free the slots).
#[tokio::test]
async fn under_a_low_descriptor_limit_silent_peers_do_not_starve_either_plane() {
    use tokio::io::AsyncBufReadExt;
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legate.toml");
    let toml = harness::config_toml_with(
        &mock.base_url(),
        "header_read_timeout = \"500ms\"\n",
        "",
        "",
    );
    std::fs::write(&path, toml).unwrap();
    let script = format!(
        "ulimit -n 128 && exec '{}' serve --config '{}'",
        env!("CARGO_BIN_EXE_legate"),
        path.display()
    );
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", &script])
        .envs(harness::test_env_vars())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next_line().await.unwrap().expect("a listening line");
    let urls: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter(|w| w.starts_with("http://"))
        .collect();
    let (data, admin) = (urls[0].to_string(), urls[1].to_string());
    let data_addr: std::net::SocketAddr = data.trim_start_matches("http://").parse().unwrap();

    let mut peers = Vec::new();
    for _ in 0..150 {
        peers.push(TcpStream::connect(data_addr).await.unwrap());
    }
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for _ in 0..3 {
        let r = http
            .get(format!("{admin}/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .expect("/healthz answers");
        assert_eq!(r.status(), 200);
    }
    let r = http
        .post(format!("{data}/v1/messages"))
        .header("content-type", "application/json")
        .body(BODY)
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("a data-plane caller is served");
    assert_eq!(r.status(), 200);
    drop(peers);
    child.kill().await.ok();
}

/// Reads a request head off `sock` a byte at a time (nothing past it); false if the peer
/// closed first.
async fn read_head(sock: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if sock.read(&mut byte).await.unwrap_or(0) == 0 {
            return false;
        }
        head.push(byte[0]);
    }
    true
}

/// An upstream that answers the first request with an Anthropic stream that never ends: text
/// deltas of about 1 KiB, written until the connection breaks. Resolves with the bytes it wrote
/// once legate has dropped the connection; from then on it answers each new connection's
/// request with a short message.
async fn endless_stream() -> (String, tokio::task::JoinHandle<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let writer = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        if !read_head(&mut sock).await {
            return 0;
        }
        let start = r#"{"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant","model":"claude-c","content":[],"stop_reason":null,"usage":{"input_tokens":7,"output_tokens":1}}}"#;
        let first = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
             event: message_start\ndata: {start}\n\n\
             event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n"
        );
        let delta = format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n",
            "x".repeat(1000)
        );
        let mut written = 0;
        if sock.write_all(first.as_bytes()).await.is_err() {
            return written;
        }
        // Bounded: far more than the socket buffers on the way hold, far less than memory.
        while written < 1 << 30 {
            if sock.write_all(delta.as_bytes()).await.is_err() {
                break;
            }
            written += delta.len();
        }
        tokio::spawn(async move {
            let reply = r#"{"id":"msg_after","type":"message","role":"assistant","model":"claude-c","content":[{"type":"text","text":"after"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                reply.len()
            );
            while let Ok((mut sock, _)) = listener.accept().await {
                if read_head(&mut sock).await {
                    let _ = sock.write_all(answer.as_bytes()).await;
                }
            }
        });
        written
    });
    (url, writer)
}

/// legate with `server` and `provider` settings in front of a stand-in upstream at `url`.
async fn in_front_of(url: &str, server: &str, provider: &str) -> Env {
    let toml = harness::config_toml_with(url, server, provider, "");
    harness::start_alone(&toml).await
}

/// legate (`connection_idle_timeout` 1 s, one request at a time to the provider) in front of
/// [`endless_stream`], and an unconnected caller socket with a small receive window, so that
/// the caller's side fills soon.
async fn stalling() -> (Env, tokio::task::JoinHandle<usize>, tokio::net::TcpSocket) {
    let (url, upstream) = endless_stream().await;
    let env = in_front_of(
        &url,
        "connection_idle_timeout = \"1s\"\n",
        "max_concurrency = 1\n",
    )
    .await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    (env, upstream, sock)
}

/// Waits for the endless upstream's writes to fail: legate has let its connection go.
async fn released(upstream: tokio::task::JoinHandle<usize>) {
    let written = tokio::time::timeout(Duration::from_secs(20), upstream)
        .await
        .expect("legate drops the upstream stream of a caller that stopped reading")
        .unwrap();
    assert!(written > 0 && written < 1 << 30, "wrote {written} bytes");
}

/// The provider's one concurrency slot was given back with the stalled stream: the next call
/// is served at once.
async fn served_after(env: &Env) {
    let resp = tokio::time::timeout(Duration::from_secs(10), env.messages(BODY))
        .await
        .expect("the next call is not left waiting for the slot");
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("after"));
}

/// Waits until exactly one request is recorded as the caller's leaving (499).
async fn gone_once(env: &Env) {
    env.wait_metric("legate_requests_total", &[("status", "499")], 1.0)
        .await;
}

/// A caller that stops reading a stream is held to `connection_idle_timeout` (SPEC §14): once
/// its socket takes nothing for that long, legate closes the connection, drops the upstream
/// stream and records the request as the caller's leaving — instead of holding both
/// connections for as long as the provider streams.
#[tokio::test]
async fn a_caller_that_stops_reading_a_stream_is_closed_and_the_upstream_released() {
    let (env, upstream, sock) = stalling().await;
    let mut caller = sock.connect(env.legate.data_addr).await.unwrap();
    let body = STREAMED;
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    caller.write_all(req.as_bytes()).await.unwrap();

    // The upstream's writes fail only once legate has let its connection go.
    released(upstream).await;
    gone_once(&env).await;
    assert_eq!(
        env.metric("legate_requests_total", &[("status", "200")])
            .await,
        None
    );
    served_after(&env).await;
    // The caller's connection is closed: what was sent before the stall, then its end.
    let (got, _) = until_closed(&mut caller).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    wait_gauge(&env, "data", 0.0).await;
}

/// A caller that keeps reading, slowly, is not one that stopped (README: "a slow reader that
/// keeps taking bytes is not cut"): it reads an endless stream at about 200 KB/s for twice
/// `connection_idle_timeout` and its connection stays open. The kernel wakes a writer only
/// once much of a full send buffer has drained (megabytes on loopback, seconds of such a
/// reader): without a bound on the unsent bytes, no write moved for the whole idle timeout,
/// and the connection was cut at exactly 2 s. (Over loopback the kernel sends in 64 KiB
/// segments, a third of a second of this reader: well within the timeout.)
#[tokio::test]
async fn a_caller_that_reads_a_stream_slowly_is_not_cut() {
    let (url, _upstream) = endless_stream().await;
    let env = in_front_of(&url, "connection_idle_timeout = \"2s\"\n", "").await;
    let mut caller = TcpStream::connect(env.legate.data_addr).await.unwrap();
    let body = STREAMED;
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    caller.write_all(req.as_bytes()).await.unwrap();
    // 10 KB every 50 ms, for 4 s (the pace of a slow reader, not a wait for legate).
    let mut read = 0;
    let mut buf = vec![0u8; 10_000];
    for _ in 0..80 {
        let n = caller.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream was cut after {read} bytes");
        read += n;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        env.metric("legate_connections", &[("plane", "data")]).await,
        Some(1.0),
        "the slow reader's connection is still open"
    );
    assert_eq!(
        env.metric("legate_requests_total", &[("status", "499")])
            .await,
        None
    );
}

/// A socket whose reads stop for good once `shut` is set, as a caller process that has stopped
/// reading (hung, or stopped) but keeps its connection open.
struct Valve {
    inner: TcpStream,
    shut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl tokio::io::AsyncRead for Valve {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.shut.load(std::sync::atomic::Ordering::SeqCst) {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Valve {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The same over HTTP/2: an HTTP/2 caller that stops reading its socket mid-stream has its
/// connection closed once legate's writes have waited `connection_idle_timeout`, and the
/// upstream stream is released.
#[tokio::test]
async fn an_http2_caller_that_stops_reading_its_socket_is_closed_and_the_upstream_released() {
    let (env, upstream, sock) = stalling().await;
    let shut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let valve = Valve {
        inner: sock.connect(env.legate.data_addr).await.unwrap(),
        shut: shut.clone(),
    };
    // Flow-control windows far larger than the socket buffers: what stops legate's writes is
    // the socket, not HTTP/2's credit (a stream withheld credit is hyper's to hold).
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(1 << 30)
            .initial_connection_window_size(1 << 30)
            .handshake(hyper_util::rt::TokioIo::new(valve))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = answered(&mut send, STREAMED).await;
    // The answer streams; the caller stops reading its socket.
    shut.store(true, std::sync::atomic::Ordering::SeqCst);

    released(upstream).await;
    gone_once(&env).await;
    served_after(&env).await;
    wait_gauge(&env, "data", 0.0).await;
    drop(resp);
}

/// An HTTP/2 connection whose one streamed answer has its head in and will get no credit: the
/// stream's window is the protocol's default and the connection's far larger, so that only
/// that stream runs out. Returns the connection's sender, its task and the answer.
async fn starved_stream(
    env: &Env,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
    http::Response<hyper::body::Incoming>,
) {
    let sock = TcpStream::connect(env.legate.data_addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(1 << 30)
            .handshake(hyper_util::rt::TokioIo::new(sock))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let resp = answered(&mut send, STREAMED).await;
    (send, conn, resp)
}

/// An HTTP/2 caller that keeps reading its socket but gives one stream no flow-control credit:
/// that stream alone is cut once hyper has not asked for its next frame within
/// `connection_idle_timeout`; its upstream stream is released, and the connection's other
/// streams go on.
#[tokio::test]
async fn an_http2_stream_given_no_credit_is_cut_alone_and_the_upstream_released() {
    let (env, upstream, _) = stalling().await;
    let (mut send, _conn, resp) = starved_stream(&env).await;
    // Its body is never read: the stream's window fills and stays full.

    released(upstream).await;
    gone_once(&env).await;
    // The same connection serves the next call, and the provider's slot came back for it.
    let next = tokio::time::timeout(Duration::from_secs(10), send.send_request(h2_post(BODY)))
        .await
        .expect("the connection's other streams go on")
        .unwrap();
    assert_eq!(next.status(), 200);
    let text = http_body_util::BodyExt::collect(next.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&text).contains("after"), "{text:?}");
    assert_eq!(
        env.metric("legate_requests_total", &[("status", "200")])
            .await,
        Some(1.0)
    );
    drop(resp);
}

/// An HTTP/2 connection between requests is held to `connection_idle_timeout`, not to the
/// header read timeout: the frames its caller sends meanwhile (pings here, window updates)
/// are not the head of a request. At its deadline it is ended with GOAWAY, which tells the
/// caller that no stream it may be sending was taken, rather than dropped under it.
#[tokio::test]
async fn an_idle_http2_connection_is_held_to_the_idle_timeout_and_ended_with_goaway() {
    let env = start("header_read_timeout = \"1s\"\nconnection_idle_timeout = \"3s\"\n").await;
    let sock = TcpStream::connect(env.legate.data_addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(Duration::from_millis(300))
            .keep_alive_while_idle(true)
            .handshake(hyper_util::rt::TokioIo::new(sock))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = h2_post(BODY);
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    let answered = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("legate ends the idle connection")
        .unwrap();
    let idle = answered.elapsed();
    // Pings every 300 ms: a header read deadline would have ended it after about 1.3 s.
    assert!(idle >= Duration::from_millis(2500), "ended after {idle:?}");
    assert!(ended.is_ok(), "ended without GOAWAY: {ended:?}");
    assert!(send.is_closed());
}

/// An HTTP/2 connection to legate whose caller gives its streams no credit at all (an
/// initial stream window of 0): the answers' heads come, their bodies never do.
async fn creditless(
    env: &Env,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let sock = TcpStream::connect(env.legate.data_addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake(hyper_util::rt::TokioIo::new(sock))
            .await
            .unwrap();
    (send, tokio::spawn(conn))
}

/// A whole (not streamed) answer whose stream the caller never gives credit: hyper holds the
/// answer, waiting to send it, and with it the request's count in flight. Past
/// `connection_idle_timeout` that count goes, and the connection, with nothing else to do, is
/// closed after its idle deadline, freeing what hyper held, instead of living as long as the
/// caller likes.
#[tokio::test]
async fn an_http2_whole_answer_never_given_credit_lets_its_connection_close() {
    let env = start("connection_idle_timeout = \"1s\"\n").await;
    let (mut send, conn) = creditless(&env).await;
    // The head needs no credit; the body does, and none is ever given.
    let resp = answered(&mut send, BODY).await;
    wait_gauge(&env, "data", 0.0).await;
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("legate ended the connection")
        .unwrap()
        .ok();
    assert_eq!(env.mock.stats().requests, 1);
    drop(resp);
}

/// The stream cut for want of credit no longer counts in flight: hyper keeps its shell until
/// credit comes, which may be never, and a connection with nothing else to do must still fall
/// under `connection_idle_timeout` instead of being held for as long as the caller likes.
#[tokio::test]
async fn an_http2_connection_whose_only_stream_was_cut_is_closed_when_idle() {
    let (env, upstream, _) = stalling().await;
    let (_send, conn, resp) = starved_stream(&env).await;
    // Nothing more is read or sent on this connection.
    released(upstream).await;
    gone_once(&env).await;
    wait_gauge(&env, "data", 0.0).await;
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("legate ended the connection")
        .unwrap()
        .ok();
    assert_eq!(
        env.metric("legate_requests_total", &[("status", "499")])
            .await,
        Some(1.0)
    );
    drop(resp);
}

const BIG: &str =
    r#"{"model":"claude-c","max_tokens":8,"messages":[{"role":"user","content":"big"}]}"#;
const HOLD: &str =
    r#"{"model":"claude-c","max_tokens":8,"messages":[{"role":"user","content":"hold"}]}"#;

/// An upstream that answers a request whose prompt is `big` with a 9 MiB message, holds one
/// whose prompt is `hold` until `release` is notified, and answers any other with a short
/// message; one request per connection.
async fn sized_upstream() -> (String, std::sync::Arc<tokio::sync::Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let held = held.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                // The head and the body, which is JSON and ends the request.
                let text = loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                    let text = String::from_utf8_lossy(&got).into_owned();
                    if text.contains("\r\n\r\n") && text.ends_with('}') {
                        break text;
                    }
                };
                let said = if text.contains("\"big\"") {
                    "x".repeat(9 << 20)
                } else {
                    if text.contains("\"hold\"") {
                        held.notified().await;
                    }
                    "short".to_string()
                };
                let reply = format!(
                    r#"{{"id":"msg_s","type":"message","role":"assistant","model":"claude-c","content":[{{"type":"text","text":"{said}"}}],"stop_reason":"end_turn","stop_sequence":null,"usage":{{"input_tokens":3,"output_tokens":1}}}}"#
                );
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                    reply.len()
                );
                let _ = sock.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, release)
}

/// A caller that keeps a request in flight keeps its connection out of the idle deadline,
/// and could so keep hyper holding the answers of every stream it starved of credit. What cut
/// streams leave with hyper is bounded per connection: past 16 MiB (here two 9 MiB answers)
/// the connection is ended with GOAWAY. New streams are then refused, the one in flight is
/// still answered, and the connection ends after it.
#[tokio::test]
async fn an_http2_caller_starving_streams_of_large_answers_gets_goaway() {
    let (url, release) = sized_upstream().await;
    let server = "connection_idle_timeout = \"1s\"\nheader_read_timeout = \"1s\"\n";
    let env = in_front_of(&url, server, "").await;
    let (mut send, conn) = creditless(&env).await;
    let busy = tokio::spawn(send.send_request(h2_post(HOLD)));
    // Two whole answers whose heads come and whose bodies never get credit.
    let first = answered(&mut send, BIG).await;
    let second = answered(&mut send, BIG).await;
    // Both are cut 1 s later, which takes what they hold past the cap. Until then the caller
    // goes on using the connection (a poll every 100 ms, each a short starved answer).
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(resp) = send.send_request(h2_post(BODY)).await {
            assert_eq!(resp.status(), 200);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("legate ends the connection with GOAWAY once cut streams hold over 16 MiB");
    // The request in flight when the GOAWAY went out is still served.
    release.notify_one();
    let busy = tokio::time::timeout(Duration::from_secs(10), busy)
        .await
        .expect("the busy stream's answer in time")
        .unwrap()
        .unwrap();
    assert_eq!(busy.status(), 200);
    // Then nothing is in flight, and the connection, still holding the cut streams, ends.
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("legate ended the connection")
        .unwrap()
        .ok();
    wait_gauge(&env, "data", 0.0).await;
    drop((first, second));
}

/// Blank lines after a request (some clients send a CRLF after a body; RFC 9112 §2.2 has them
/// skipped) are no head begun: the connection stays idle, held to the idle timeout, not to
/// the header read timeout, whether they came with the request or after its answer.
#[tokio::test]
async fn blank_lines_after_a_request_leave_the_connection_idle() {
    let env = start("header_read_timeout = \"300ms\"\nconnection_idle_timeout = \"2s\"\n").await;
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let mut with = TcpStream::connect(env.legate.data_addr).await.unwrap();
    with.write_all(format!("{req}\r\n").as_bytes())
        .await
        .unwrap();
    let (got, took) = until_closed(&mut with).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert!(took >= Duration::from_millis(1500), "closed after {took:?}");

    let mut after = TcpStream::connect(env.legate.data_addr).await.unwrap();
    assert!(one_answer(&mut after).await.starts_with("HTTP/1.1 200"));
    after.write_all(b"\r\n\r\n").await.unwrap();
    // Past the header read timeout, the connection still carries the next request.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(one_answer(&mut after).await.starts_with("HTTP/1.1 200"));
    after.write_all(b"\r\n").await.unwrap();
    let (got, took) = until_closed(&mut after).await;
    assert!(got.is_empty());
    assert!(took >= Duration::from_millis(1200), "closed after {took:?}");
    assert_eq!(env.mock.stats().requests, 3);
}
