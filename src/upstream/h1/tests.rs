//! legate's HTTP/1 client against a scripted loopback server that writes raw bytes: framings,
//! connection reuse and closing, the keep-alive race, and broken or oversize answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body::Body as _;
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::upstream::pool::{PoolOptions, PooledClient};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// What the server does with the n-th request it reads (in arrival order, over all
/// connections): write these bytes, then close the connection or keep it.
#[derive(Clone)]
struct Reply {
    bytes: &'static [u8],
    close: bool,
}

const fn keep(bytes: &'static [u8]) -> Reply {
    Reply {
        bytes,
        close: false,
    }
}

const fn close(bytes: &'static [u8]) -> Reply {
    Reply { bytes, close: true }
}

struct Server {
    uri: Uri,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    /// Each request's head and body, as read.
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

async fn serve(script: Vec<Reply>) -> std::io::Result<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let uri = format!("http://{}/v1/messages", listener.local_addr()?)
        .parse()
        .map_err(std::io::Error::other)?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(script);
    let (a, r, s) = (accepted.clone(), requests.clone(), seen.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(conn(tcp, script.clone(), r.clone(), s.clone()));
        }
    });
    Ok(Server {
        uri,
        accepted,
        requests,
        seen,
    })
}

/// Serves one connection: reads each request (head, then `content-length` bytes) and answers
/// it from the script.
async fn conn(
    mut tcp: TcpStream,
    script: Arc<Vec<Reply>>,
    requests: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
) {
    let mut buf = Vec::new();
    loop {
        let request = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    break buf.drain(..end + 4 + len).collect::<Vec<u8>>();
                }
            }
            let mut chunk = [0u8; 4096];
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        seen.lock().push(request);
        let n = requests.fetch_add(1, Ordering::SeqCst);
        let Some(reply) = script.get(n) else {
            return;
        };
        if tcp.write_all(reply.bytes).await.is_err() || reply.close {
            return;
        }
    }
}

fn client(idle: Duration) -> PooledClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .build();
    let opts = PoolOptions {
        idle_timeout: idle,
        max_conns: 8,
        lists: 1,
        max_buf: 1024,
        connect_timeout: Duration::from_secs(5),
    };
    PooledClient::new(connector, None, opts)
}

fn post(uri: &Uri) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(Bytes::from_static(b"{\"a\":1}")));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = uri.clone();
    req
}

/// One request: the status and the whole body, or the error text.
async fn call(client: &PooledClient, uri: &Uri) -> Result<(u16, Vec<u8>), String> {
    let resp = client
        .request(post(uri), tokio::time::Instant::now())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes().to_vec()))
}

const HELLO: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
const CHUNKED: &[u8] =
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n";

#[tokio::test]
async fn length_and_chunked_answers_are_read_whole_on_one_connection() -> TestResult {
    let server = serve(vec![keep(HELLO), keep(CHUNKED), keep(HELLO)]).await?;
    let client = client(Duration::from_secs(60));
    for _ in 0..3 {
        assert_eq!(call(&client, &server.uri).await?, (200, b"hello".to_vec()));
    }
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(client.listed(), 1);
    let first = server.seen.lock()[0].clone();
    let host = server.uri.authority().map(|a| a.as_str()).unwrap_or("");
    assert_eq!(
        String::from_utf8(first)?,
        format!(
            "POST /v1/messages HTTP/1.1\r\nhost: {host}\r\ncontent-length: 7\r\n\r\n{{\"a\":1}}"
        )
    );
    Ok(())
}

#[tokio::test]
async fn a_closing_or_close_delimited_answer_is_not_reused() -> TestResult {
    let server = serve(vec![
        keep(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"),
        close(b"HTTP/1.1 200 OK\r\n\r\nuntil the end"),
        keep(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok"),
        keep(HELLO),
    ])
    .await?;
    let client = client(Duration::from_secs(60));
    assert_eq!(call(&client, &server.uri).await?, (200, b"ok".to_vec()));
    assert_eq!(
        call(&client, &server.uri).await?,
        (200, b"until the end".to_vec())
    );
    assert_eq!(call(&client, &server.uri).await?, (200, b"ok".to_vec()));
    assert_eq!(call(&client, &server.uri).await?, (200, b"hello".to_vec()));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 4);
    Ok(())
}

#[tokio::test]
async fn a_reused_connection_closed_without_an_answer_is_sent_once_more() -> TestResult {
    // The second request meets the keep-alive race: read, then the connection closed unanswered.
    let server = serve(vec![keep(HELLO), close(b""), keep(HELLO)]).await?;
    let client = client(Duration::from_secs(60));
    assert_eq!(call(&client, &server.uri).await?, (200, b"hello".to_vec()));
    assert_eq!(call(&client, &server.uri).await?, (200, b"hello".to_vec()));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(server.requests.load(Ordering::SeqCst), 3);
    Ok(())
}

#[tokio::test]
async fn a_request_that_got_part_of_an_answer_is_not_sent_again() -> TestResult {
    let server = serve(vec![keep(HELLO), close(b"HTTP/1.1 200 OK\r\ncontent-le")]).await?;
    let client = client(Duration::from_secs(60));
    assert_eq!(call(&client, &server.uri).await?, (200, b"hello".to_vec()));
    assert!(call(&client, &server.uri).await.is_err());
    assert_eq!(server.requests.load(Ordering::SeqCst), 2);
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_fresh_connection_closed_without_an_answer_is_an_error() -> TestResult {
    let server = serve(vec![close(b"")]).await?;
    let client = client(Duration::from_secs(60));
    assert!(call(&client, &server.uri).await.is_err());
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn cut_broken_and_oversize_answers_are_errors_and_close_the_connection() -> TestResult {
    let big_head: &'static [u8] = Box::leak(
        format!("HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n", "a".repeat(2048))
            .into_bytes()
            .into_boxed_slice(),
    );
    let server = serve(vec![
        close(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello"),
        close(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"),
        close(big_head),
        keep(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA"),
        keep(HELLO),
    ])
    .await?;
    let client = client(Duration::from_secs(60));
    let cut = call(&client, &server.uri).await;
    assert!(cut.is_err(), "{cut:?}");
    assert!(call(&client, &server.uri).await.is_err());
    assert!(
        call(&client, &server.uri).await.is_err(),
        "head over max_buf"
    );
    // Bytes past the body's end: the answer stands, the connection is not trusted again.
    assert_eq!(call(&client, &server.uri).await?, (200, b"ok".to_vec()));
    assert_eq!(call(&client, &server.uri).await?, (200, b"hello".to_vec()));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 5);
    Ok(())
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_the_connection() -> TestResult {
    let server = serve(vec![
        keep(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nhel\r\n"),
        keep(HELLO),
    ])
    .await?;
    let client = client(Duration::from_secs(60));
    let resp = client
        .request(post(&server.uri), tokio::time::Instant::now())
        .await?;
    let mut body = resp.into_body();
    let first = body
        .frame()
        .await
        .ok_or("no frame")??
        .into_data()
        .map_err(|_| "not data")?;
    assert_eq!(&first[..], b"hel");
    drop(body);
    assert_eq!(client.listed(), 0);
    assert_eq!(call(&client, &server.uri).await?, (200, b"hello".to_vec()));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 2);
    Ok(())
}

/// An idle connection and its peer, the connection as legate keeps it.
async fn idle_pair() -> std::io::Result<(super::H1Conn, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let tcp = TcpStream::connect(listener.local_addr()?).await?;
    let (peer, _) = listener.accept().await?;
    Ok((super::H1Conn::new(super::Counted::plain(tcp), 1024), peer))
}

#[tokio::test]
async fn an_idle_connection_that_was_closed_or_spoken_on_is_not_taken() -> TestResult {
    let (mut quiet, _peer) = idle_pair().await?;
    assert!(!quiet.idle_unusable());
    // A 408 sent unasked before closing must not become the next request's answer.
    let (mut spoken, mut peer) = idle_pair().await?;
    peer.write_all(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n")
        .await?;
    spoken.io.tcp().readable().await?;
    assert!(spoken.idle_unusable());
    let (mut closed, peer) = idle_pair().await?;
    drop(peer);
    closed.io.tcp().readable().await?;
    assert!(closed.idle_unusable());
    Ok(())
}

#[tokio::test]
async fn an_answer_sent_before_the_body_was_read_is_the_answer() -> TestResult {
    // The provider reads the head only, answers 413 and closes with the body unread (a reset):
    // the write of the body fails, and the 413 that came before is what the caller gets.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let uri: Uri = format!("http://{}/v1/messages", listener.local_addr()?).parse()?;
    tokio::spawn(async move {
        let Ok((mut tcp, _)) = listener.accept().await else {
            return;
        };
        let mut head = Vec::new();
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        let answer = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\n\r\ntoo large";
        let _ = tcp.write_all(answer).await;
    });
    let client = client(Duration::from_secs(60));
    let mut req = post(&uri);
    *req.body_mut() = Full::new(Bytes::from(vec![b'x'; 32 << 20]));
    let resp = client.request(req, tokio::time::Instant::now()).await?;
    assert_eq!(resp.status(), 413);
    let body = resp.into_body().collect().await?.to_bytes();
    assert_eq!(&body[..], b"too large");
    assert_eq!(client.listed(), 0, "the connection is not kept");
    Ok(())
}

#[tokio::test]
async fn a_cut_body_ends_in_an_error_and_does_not_look_complete() -> TestResult {
    let server = serve(vec![close(
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
    )])
    .await?;
    let client = client(Duration::from_secs(60));
    let mut body = client
        .request(post(&server.uri), tokio::time::Instant::now())
        .await?
        .into_body();
    let mut data = Vec::new();
    let err = loop {
        match body.frame().await {
            Some(Ok(frame)) => data.extend_from_slice(&frame.into_data().map_err(|_| "trailers")?),
            Some(Err(e)) => break e,
            None => return Err("the body ended without an error".into()),
        }
    };
    assert_eq!(data, b"hello");
    assert!(err.to_string().contains("closed before"), "{err}");
    assert!(!body.is_end_stream(), "a cut body is over, not complete");
    assert!(body.frame().await.is_none());
    Ok(())
}
