//! The connection driven through an in-memory socket by a test handler: exact bytes on the
//! wire, what the handler saw, and when the request is cancelled.

use std::sync::Mutex;
use std::time::Duration;

use http_body_util::{BodyExt, Full, StreamBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::server::conn::ConnLimits;

type TestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

#[derive(Default)]
struct Seen {
    /// Method, path and body of each request the handler read.
    requests: Mutex<Vec<(String, String, String)>>,
    /// The stream a `/stream` answer sends.
    stream: Mutex<Option<mpsc::Receiver<Bytes>>>,
    /// Told when a `/hang` request is dropped.
    dropped: Mutex<Option<oneshot::Sender<()>>>,
    /// Told what a `/handoff` body's reader on another task got.
    handoff: Mutex<Option<oneshot::Sender<Result<Bytes, BoxError>>>>,
}

struct OnDrop(Option<oneshot::Sender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

fn full(s: &str) -> TestBody {
    Full::new(Bytes::from(s.to_string()))
        .map_err(|never| match never {})
        .boxed_unsync()
}

async fn handle(seen: Arc<Seen>, req: Request<CallerBody>) -> Response<TestBody> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    match path.as_str() {
        "/refuse" => Response::builder().status(413).body(full("no")).unwrap(),
        "/close" => Response::builder()
            .header("connection", "x-other, Close")
            .body(full("bye"))
            .unwrap(),
        "/handoff" => {
            let tx = seen.handoff.lock().unwrap().take().unwrap();
            tokio::spawn(async move {
                let _ = tx.send(body.collect().await.map(|b| b.to_bytes()));
            });
            Response::new(full("handed off"))
        }
        "/hang" => {
            let _guard = OnDrop(seen.dropped.lock().unwrap().take());
            std::future::pending::<()>().await;
            unreachable!()
        }
        "/stream" => {
            let rx = seen.stream.lock().unwrap().take().unwrap();
            let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, BoxError>(http_body::Frame::data(b)), rx))
            });
            Response::new(StreamBody::new(frames).boxed_unsync())
        }
        _ => {
            let text = match body.collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                Err(e) => format!("error: {e}"),
            };
            let answer = format!("{} {}", parts.method, text);
            seen.requests
                .lock()
                .unwrap()
                .push((parts.method.to_string(), path, text));
            Response::new(full(&answer))
        }
    }
}

/// Starts a connection; returns the caller's end, what the handler saw, the stop token and
/// the connection's task.
fn open() -> (
    DuplexStream,
    Arc<Seen>,
    CancellationToken,
    tokio::task::JoinHandle<io::Result<()>>,
) {
    open_with(1 << 20)
}

/// [`open`] with the in-memory socket holding at most `window` bytes each way.
fn open_with(
    window: usize,
) -> (
    DuplexStream,
    Arc<Seen>,
    CancellationToken,
    tokio::task::JoinHandle<io::Result<()>>,
) {
    let (caller, server) = tokio::io::duplex(window);
    let seen = Arc::new(Seen::default());
    let stop = CancellationToken::new();
    let (s, st) = (seen.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let watch = ConnWatch::new(ConnLimits {
            header_read_timeout: Duration::from_secs(10),
            connection_idle_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
        });
        let handler = move |req, _peer| handle(s.clone(), req).map(Ok::<_, Infallible>);
        let peer: SocketAddr = ([127, 0, 0, 1], 1).into();
        serve(
            server,
            BytesMut::new(),
            (&handler, None),
            peer,
            &watch,
            &st,
            64 << 10,
        )
        .await
    });
    (caller, seen, stop, task)
}

use futures_util::FutureExt;

/// Reads until `n` complete responses (by their heads' framing) are in; returns the text.
async fn read_answers(caller: &mut DuplexStream, n: usize) -> String {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if count_answers(&got) >= n {
            return String::from_utf8(got).unwrap();
        }
        let k = tokio::time::timeout(Duration::from_secs(10), caller.read(&mut chunk))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(k > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..k]);
    }
}

/// Complete responses with a content-length at the front of `raw`.
fn count_answers(raw: &[u8]) -> usize {
    let text = String::from_utf8_lossy(raw);
    let mut rest: &str = &text;
    let mut n = 0;
    while let Some(end) = rest.find("\r\n\r\n") {
        let head = &rest[..end];
        if head.starts_with("HTTP/1.1 100 ") {
            rest = &rest[end + 4..];
            continue;
        }
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.parse().unwrap());
        if rest.len() < end + 4 + len {
            break;
        }
        rest = &rest[end + 4 + len..];
        n += 1;
    }
    n
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (mut caller, seen, _stop, task) = open();
    caller
        .write_all(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let text = read_answers(&mut caller, 2).await;
    let answers: Vec<&str> = text.split("HTTP/1.1 ").filter(|s| !s.is_empty()).collect();
    assert_eq!(answers.len(), 2, "{text}");
    assert!(
        answers[0].starts_with("200 OK\r\ncontent-length: 10\r\ndate: "),
        "{text}"
    );
    assert!(answers[0].ends_with("\r\n\r\nPOST hello"), "{text}");
    assert!(answers[1].ends_with("\r\n\r\nGET "), "{text}");
    assert!(!text.contains("connection:"), "{text}");
    assert_eq!(seen.requests.lock().unwrap().len(), 2);
    // The caller closing between requests ends the connection cleanly.
    drop(caller);
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_chunked_body_in_pieces_is_read_whole_after_a_100_continue() {
    let (mut caller, seen, _stop, _task) = open();
    caller
        .write_all(b"POST /up HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let mut interim = [0u8; 25];
    caller.read_exact(&mut interim).await.unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    for piece in [
        "3\r\nabc\r\n",
        "4;ext=1\r\ndefg",
        "\r\n0\r\n",
        "x-trailer: 1\r\n\r\n",
    ] {
        caller.write_all(piece.as_bytes()).await.unwrap();
        tokio::task::yield_now().await;
    }
    let text = read_answers(&mut caller, 1).await;
    assert!(text.ends_with("\r\n\r\nPOST abcdefg"), "{text}");
    assert_eq!(
        seen.requests.lock().unwrap()[0],
        ("POST".into(), "/up".into(), "abcdefg".into())
    );
}

#[tokio::test]
async fn a_body_that_breaks_off_is_an_error_to_the_handler() {
    let (mut caller, seen, _stop, task) = open();
    caller
        .write_all(b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        .await
        .unwrap();
    caller.shutdown().await.unwrap();
    let mut rest = String::new();
    caller.read_to_string(&mut rest).await.unwrap();
    assert!(rest.contains("connection: close\r\n"), "{rest}");
    task.await.unwrap().unwrap();
    let (_, _, body) = seen.requests.lock().unwrap()[0].clone();
    assert!(body.starts_with("error: "), "{body}");
}

/// After `answer`, to a request whose body the handler left unread: the connection stays open,
/// takes `rest` (the body's remaining bytes) and answers a `GET /after` sent behind it.
async fn goes_on_after(caller: &mut DuplexStream, answer: &str, rest: &[u8]) {
    assert!(!answer.contains("connection:"), "{answer}");
    caller.write_all(rest).await.unwrap();
    caller
        .write_all(b"GET /after HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let text = read_answers(caller, 1).await;
    assert!(text.ends_with("\r\n\r\nGET "), "{text}");
}

#[tokio::test]
async fn the_rest_of_a_body_left_unread_is_read_and_dropped_and_the_connection_goes_on() {
    // A socket window smaller than the body: the caller can only finish writing it if the
    // connection reads it after the answer.
    let (mut caller, seen, _stop, _task) = open_with(16 << 10);
    caller
        .write_all(b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n")
        .await
        .unwrap();
    let text = read_answers(&mut caller, 1).await;
    assert!(
        text.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
        "{text}"
    );
    goes_on_after(&mut caller, &text, &[b'x'; 100_000]).await;
    assert_eq!(
        *seen.requests.lock().unwrap(),
        [("GET".into(), "/after".into(), "".into())]
    );
}

#[tokio::test]
async fn a_chunked_body_left_unread_is_read_to_its_end_and_the_connection_goes_on() {
    let (mut caller, seen, _stop, _task) = open();
    caller
        .write_all(
            b"POST /refuse HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
        )
        .await
        .unwrap();
    let text = read_answers(&mut caller, 1).await;
    goes_on_after(
        &mut caller,
        &text,
        b"lo\r\n3\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n",
    )
    .await;
    assert_eq!(seen.requests.lock().unwrap()[0].1, "/after");
}

#[tokio::test]
async fn a_body_left_unread_beyond_what_is_drained_or_never_asked_for_closes_the_connection() {
    for head in [
        format!(
            "POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
            crate::server::REFUSED_BODY_MAX + 1
        ),
        // The body waits for a `100 Continue` that never came: it may never be sent.
        "POST /refuse HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 10\r\n\r\n"
            .to_string(),
    ] {
        let (mut caller, _seen, _stop, task) = open();
        caller.write_all(head.as_bytes()).await.unwrap();
        let text = read_answers(&mut caller, 1).await;
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
        assert!(!text.contains("100 Continue"), "{text}");
        // What the caller still sends is read and dropped for a moment, then the connection
        // ends.
        caller.write_all(&[b'x'; 1000]).await.unwrap();
        drop(caller);
        task.await.unwrap().unwrap();
    }
}

/// The bound on a refused chunked rest counts the bytes read, not the data they carry: size
/// lines and their padding cost the connection as much to read.
#[tokio::test]
async fn a_chunked_rest_left_unread_is_bounded_by_its_bytes_on_the_wire() {
    let (mut caller, seen, _stop, task) = open();
    caller
        .write_all(b"POST /refuse HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let text = read_answers(&mut caller, 1).await;
    assert!(!text.contains("connection:"), "{text}");
    // 64 bytes of data in 84 on the wire (a size written at a fixed width of 16 digits): 160
    // MiB on the wire is past the bound, while its 122 MiB of data are not.
    let mut chunk = b"0000000000000040\r\n".to_vec();
    chunk.extend_from_slice(&[b'y'; 64]);
    chunk.extend_from_slice(b"\r\n");
    let block = chunk.repeat((64 << 10) / chunk.len());
    let wire: usize = 160 << 20;
    assert!(wire as u64 > crate::server::REFUSED_BODY_MAX);
    assert!(((wire / chunk.len()) * 64) as u64 <= crate::server::REFUSED_BODY_MAX);
    let (mut rd, mut wr) = tokio::io::split(caller);
    let writer = tokio::spawn(async move {
        let mut sent = 0;
        while sent < wire {
            if wr.write_all(&block).await.is_err() {
                return sent;
            }
            sent += block.len();
        }
        let _ = wr
            .write_all(b"0\r\n\r\nGET /after HTTP/1.1\r\nhost: x\r\n\r\n")
            .await;
        sent
    });
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), rd.read_to_end(&mut rest))
        .await
        .expect("the connection closes")
        .unwrap();
    assert_eq!(rest, b"", "nothing after the refusal");
    task.await.unwrap().unwrap();
    drop(rd);
    let sent = writer.await.unwrap();
    assert!(
        sent < wire,
        "the connection closed under the rest ({sent} bytes sent)"
    );
    assert!(seen.requests.lock().unwrap().is_empty());
}

/// A shutdown that comes while a refused rest is read does not cut the read short: the answer
/// went out without `connection: close`, so the caller is still writing, and a close under it
/// would reset the answer away. The connection ends once the rest is in.
#[tokio::test]
async fn a_stop_during_the_read_of_a_refused_rest_lets_it_finish_then_closes() {
    let rest = 4usize << 20;
    let (mut caller, seen, stop, task) = open_with(16 << 10);
    let head = format!("POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: {rest}\r\n\r\n");
    caller.write_all(head.as_bytes()).await.unwrap();
    let text = read_answers(&mut caller, 1).await;
    assert!(!text.contains("connection:"), "{text}");
    stop.cancel();
    // Four times what a close would still have read after the answer.
    caller.write_all(&vec![b'z'; rest]).await.unwrap();
    let mut after = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), caller.read_to_end(&mut after))
        .await
        .expect("the connection ends once the rest is in")
        .unwrap();
    assert_eq!(after, b"");
    task.await.unwrap().unwrap();
    assert!(seen.requests.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_stops_sending_a_body_left_unread_is_closed_after_the_body_read_timeout() {
    let (mut caller, seen, _stop, task) = open();
    caller
        .write_all(b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\nabc")
        .await
        .unwrap();
    let text = read_answers(&mut caller, 1).await;
    assert!(!text.contains("connection:"), "{text}");
    let answered = tokio::time::Instant::now();
    // The caller sends no more; the connection waits for the rest for `body_read_timeout`.
    let mut rest = Vec::new();
    caller.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"");
    assert!(answered.elapsed() >= Duration::from_secs(60));
    assert!(answered.elapsed() < Duration::from_secs(62));
    task.await.unwrap().unwrap();
    assert!(seen.requests.lock().unwrap().is_empty());
}

/// Everything the connection writes until it closes (within 10 s).
async fn read_to_close(caller: &mut DuplexStream) -> String {
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), caller.read_to_string(&mut text))
        .await
        .expect("the connection ends after the answer")
        .unwrap();
    text
}

#[tokio::test]
async fn a_handler_that_says_connection_close_ends_the_connection() {
    let (mut caller, _seen, _stop, task) = open();
    caller
        .write_all(b"GET /close HTTP/1.1\r\nhost: x\r\n\r\nGET /never HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let text = read_to_close(&mut caller).await;
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n"),
        "{text}"
    );
    assert_eq!(text.matches("connection:").count(), 1, "{text}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nbye"), "{text}");
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn what_follows_a_connect_is_never_read_as_a_request() {
    let (mut caller, seen, _stop, task) = open();
    caller
        .write_all(
            b"CONNECT x:443 HTTP/1.1\r\nhost: x:443\r\n\r\nGET /never HTTP/1.1\r\nhost: x\r\n\r\n",
        )
        .await
        .unwrap();
    let text = read_to_close(&mut caller).await;
    assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    let requests = seen.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].0, "CONNECT");
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_streamed_answer_goes_out_chunk_by_chunk_as_it_comes() {
    let (mut caller, seen, _stop, _task) = open();
    let (tx, rx) = mpsc::channel(4);
    *seen.stream.lock().unwrap() = Some(rx);
    caller
        .write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tx.send(Bytes::from_static(b"data: 1\n\n")).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    while !got.ends_with(b"9\r\ndata: 1\n\n\r\n") {
        let k = caller.read(&mut chunk).await.unwrap();
        assert!(k > 0);
        got.extend_from_slice(&chunk[..k]);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ndate: "),
        "{text}"
    );
    // A chunk larger than the copy limit goes out from where it is, framed the same.
    tx.send(Bytes::from(vec![b'y'; 20_000])).await.unwrap();
    drop(tx);
    let mut rest = Vec::new();
    while !rest.ends_with(b"0\r\n\r\n") {
        let k = caller.read(&mut chunk).await.unwrap();
        assert!(k > 0);
        rest.extend_from_slice(&chunk[..k]);
    }
    let mut want = b"4e20\r\n".to_vec();
    want.extend_from_slice(&[b'y'; 20_000]);
    want.extend_from_slice(b"\r\n0\r\n\r\n");
    assert_eq!(rest, want);
}

#[tokio::test]
async fn the_caller_leaving_cancels_the_request_at_once() {
    let (mut caller, seen, _stop, task) = open();
    let (tx, rx) = oneshot::channel();
    *seen.dropped.lock().unwrap() = Some(tx);
    caller
        .write_all(b"POST /hang HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    // Let the handler start, then leave.
    tokio::task::yield_now().await;
    drop(caller);
    tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("the handler is dropped")
        .unwrap();
    task.await.unwrap().unwrap();
}

/// A head legate cannot read is refused with its status, in the caller's API shape read off
/// what there is of the head (SPEC §5), and the connection closes.
#[tokio::test]
async fn a_bad_or_oversize_head_gets_its_status_in_the_callers_shape_and_the_connection_closes() {
    for (raw, status, anthropic) in [
        (b"GARBAGE\r\n\r\n".to_vec(), "400 Bad Request", false),
        (
            b"POST /v1/messages HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n"
                .to_vec(),
            "400 Bad Request",
            true,
        ),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n"
                .to_vec(),
            "400 Bad Request",
            false,
        ),
        (
            format!(
                "POST /v2/x HTTP/1.1\r\nAnthropic-Version: 2023-06-01\r\nx: {}\r\n\r\n",
                "a".repeat(70_000)
            )
            .into_bytes(),
            "431 Request Header Fields Too Large",
            true,
        ),
        (b"GET / HTTP/3.0\r\n\r\n".to_vec(), "505 HTTP Version Not Supported", false),
        // A later HTTP/1 minor version is refused as a version, not as a malformed line.
        (b"GET / HTTP/1.2\r\n\r\n".to_vec(), "505 HTTP Version Not Supported", false),
        (
            b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
                .to_vec(),
            "501 Not Implemented",
            true,
        ),
    ] {
        let (mut caller, seen, _stop, task) = open();
        caller.write_all(&raw).await.unwrap();
        let mut text = String::new();
        caller.read_to_string(&mut text).await.unwrap();
        assert!(
            text.starts_with(&format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: "
            )),
            "{text}"
        );
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        let message = if anthropic {
            assert_eq!(v["type"], "error", "{body}");
            &v["error"]["message"]
        } else {
            assert!(v["error"]["type"].is_string(), "{body}");
            &v["error"]["message"]
        };
        assert!(message.as_str().unwrap().contains("connection is closed"), "{body}");
        // The connection reads what the caller still sends until it closes too.
        drop(caller);
        task.await.unwrap().unwrap();
        assert!(seen.requests.lock().unwrap().is_empty());
    }
}

#[tokio::test]
async fn http10_without_keep_alive_is_answered_and_closed() {
    let (mut caller, _seen, _stop, task) = open();
    caller.write_all(b"GET /x HTTP/1.0\r\n\r\n").await.unwrap();
    let mut text = String::new();
    caller.read_to_string(&mut text).await.unwrap();
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\ncontent-length: 4\r\n"),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\nGET "), "{text}");
    assert!(!text.contains("connection:"), "{text}");
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn stop_closes_an_idle_connection_and_lets_a_busy_one_finish_with_close() {
    let (mut caller, _seen, stop, task) = open();
    caller
        .write_all(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello")
        .await
        .unwrap();
    tokio::task::yield_now().await;
    stop.cancel();
    caller.write_all(b"world").await.unwrap();
    let mut text = String::new();
    caller.read_to_string(&mut text).await.unwrap();
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(text.ends_with("POST helloworld"), "{text}");
    task.await.unwrap().unwrap();

    let (mut idle, _seen, stop, task) = open();
    stop.cancel();
    let mut text = String::new();
    idle.read_to_string(&mut text).await.unwrap();
    assert_eq!(text, "");
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_body_read_on_another_task_ends_in_an_error_once_the_connection_moves_on() {
    let (mut caller, seen, _stop, _task) = open();
    let (tx, rx) = oneshot::channel();
    *seen.handoff.lock().unwrap() = Some(tx);
    caller
        .write_all(b"POST /handoff HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let text = read_answers(&mut caller, 1).await;
    let got = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("the reader is not left waiting")
        .unwrap();
    assert!(got.is_err(), "{got:?}");
    // The rest of the body is read and dropped, and the connection goes on.
    goes_on_after(&mut caller, &text, b"defghij").await;
}

#[tokio::test]
async fn a_connection_that_sent_nothing_is_done_when_stop_fires() {
    let (_caller, mut server) = tokio::io::duplex(64);
    let stop = CancellationToken::new();
    stop.cancel();
    let mut buf = BytesMut::new();
    assert!(matches!(
        super::start(&mut server, &mut buf, &stop).await,
        Start::Gone
    ));
    let (mut caller, mut server) = tokio::io::duplex(64);
    caller.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    caller.write_all(b"\r\nSM\r\n\r\n").await.unwrap();
    let mut buf = BytesMut::new();
    assert!(matches!(
        super::start(&mut server, &mut buf, &CancellationToken::new()).await,
        Start::H2
    ));
    assert_eq!(&buf[..], PREFACE);
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_read_once_it_is_whole() {
    let (mut caller, seen, _stop, _task) = open();
    let raw = b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok";
    for b in raw {
        caller.write_all(&[*b]).await.unwrap();
        tokio::task::yield_now().await;
    }
    let text = read_answers(&mut caller, 1).await;
    assert!(text.ends_with("\r\n\r\nPOST ok"), "{text}");
    assert_eq!(
        seen.requests.lock().unwrap()[0],
        ("POST".into(), "/slow".into(), "ok".into())
    );
}

#[test]
fn the_end_of_a_head_is_found_across_reads() {
    assert!(ends_head(b"x: y\r\n\r\n"));
    assert!(ends_head(b"x: y\n\n"));
    assert!(!ends_head(b"x: y\r\nz: w\r\n"));
}
