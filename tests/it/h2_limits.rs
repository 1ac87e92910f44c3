//! Over HTTP/2 a body over `server.max_body_bytes` gets the same readable 413 as over HTTP/1
//! (SPEC §14), in the caller's API shape, and only its own stream ends: the connection and the
//! other streams on it keep working.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;

use crate::harness::{self, Env};

const BODY: &str =
    r#"{"model":"claude-x","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;
const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
const LIMIT: usize = 1 << 20;

/// A request body fed chunk by chunk from the test; it ends when the sender is dropped.
struct Fed(mpsc::Receiver<Bytes>);

impl Body for Fed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

type Sender = SendRequest<http_body_util::Either<Fed, Full<Bytes>>>;

async fn start() -> Env {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let server = format!("max_body_bytes = {LIMIT}\n");
    let toml = harness::config_toml_with(&mock.base_url(), &server, "", "");
    harness::start_toml(mock, &toml).await
}

/// One HTTP/2 connection (prior knowledge, no TLS) to legate's data plane.
async fn h2_connect(env: &Env) -> Sender {
    let tcp = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

fn request(
    path: &str,
    declared: Option<u64>,
    body: http_body_util::Either<Fed, Full<Bytes>>,
) -> http::Request<http_body_util::Either<Fed, Full<Bytes>>> {
    let mut b = http::Request::post(format!("http://127.0.0.1{path}"))
        .header("x-api-key", "dummy-client-key")
        .header("authorization", "Bearer dummy-client-key")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json");
    if let Some(n) = declared {
        b = b.header("content-length", n);
    }
    b.body(body).unwrap()
}

async fn answer(
    send: &mut Sender,
    req: http::Request<http_body_util::Either<Fed, Full<Bytes>>>,
) -> (u16, String) {
    send.ready().await.unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("an answer, not a hang")
        .expect("a response, not a stream reset");
    let status = resp.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("the body in time")
        .expect("a readable body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Feeds `total` bytes in 64 KiB chunks, or until the stream stops taking them; the task
/// returns how many it handed over.
fn feed(total: usize) -> (Fed, tokio::task::JoinHandle<usize>) {
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 64 << 10]);
        let mut sent = 0;
        while sent < total {
            if tx.send(chunk.clone()).await.is_err() {
                break;
            }
            sent += chunk.len();
        }
        sent
    });
    (Fed(rx), task)
}

/// How much of its body the client got to send.
async fn uploaded(feeder: tokio::task::JoinHandle<usize>) -> usize {
    tokio::time::timeout(Duration::from_secs(20), feeder)
        .await
        .expect("the upload ends")
        .unwrap()
}

#[tokio::test]
async fn an_http2_body_over_the_limit_gets_a_readable_413_and_the_connection_keeps_serving() {
    let env = start().await;
    let mut send = h2_connect(&env).await;

    // Declared over the limit: refused at once. The client is still let finish its upload
    // (a stream reset instead would make clients such as curl drop the answer).
    let declared = 8 * LIMIT;
    let (body, feeder) = feed(declared);
    let req = request(
        "/v1/messages",
        Some(declared as u64),
        http_body_util::Either::Left(body),
    );
    let (status, text) = answer(&mut send, req).await;
    assert_eq!(status, 413, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("an Anthropic error body");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "request_too_large");
    assert_eq!(uploaded(feeder).await, declared);

    // No length declared: the limit is found while reading. The OpenAI shape this time.
    let (body, feeder) = feed(3 * LIMIT);
    let req = request(
        "/v1/chat/completions",
        None,
        http_body_util::Either::Left(body),
    );
    let (status, text) = answer(&mut send, req).await;
    assert_eq!(status, 413, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("an OpenAI error body");
    assert_eq!(v["error"]["code"], "request_too_large", "{text}");
    assert_eq!(uploaded(feeder).await, 3 * LIMIT);

    // The same connection still serves both APIs.
    for (path, body) in [("/v1/messages", BODY), ("/v1/chat/completions", CHAT)] {
        let req = request(
            path,
            Some(body.len() as u64),
            http_body_util::Either::Right(Full::new(Bytes::from(body))),
        );
        let (status, text) = answer(&mut send, req).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(env.mock.stats().requests, 2);
}

#[tokio::test]
async fn a_refused_http2_upload_does_not_disturb_a_stream_in_flight_beside_it() {
    let env = start().await;
    let mut send = h2_connect(&env).await;

    // A well-formed request whose body is still on its way...
    let (tx, rx) = mpsc::channel(1);
    let slow = request(
        "/v1/messages",
        Some(BODY.len() as u64),
        http_body_util::Either::Left(Fed(rx)),
    );
    let mut other = send.clone();
    let slow = tokio::spawn(async move { answer(&mut other, slow).await });

    // ...while an oversized one beside it is refused.
    let (body, feeder) = feed(2 * LIMIT);
    let req = request("/v1/messages", None, http_body_util::Either::Left(body));
    let (status, text) = answer(&mut send, req).await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(uploaded(feeder).await, 2 * LIMIT);

    tx.send(Bytes::from(BODY)).await.unwrap();
    drop(tx);
    let (status, text) = slow.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(env.mock.stats().requests, 1);
}

/// The admin plane's answers over HTTP/2 are held within one bound: a caller that asks for the
/// whole journal on many streams of one connection and grants none of them a byte of window
/// gets 503 once the answers held pass it, instead of a copy per stream (1 GB and more).
#[tokio::test]
async fn admin_answers_held_for_streams_that_take_nothing_are_bounded() {
    let env = start().await;
    // A journal of a thousand entries with long model names: about a megabyte as a list.
    let model = format!("claude-{}", "m".repeat(200));
    let body = format!(
        r#"{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    for _ in 0..1000 {
        assert_eq!(env.messages(body.clone()).await.status(), 200);
    }
    let tcp = tokio::net::TcpStream::connect(env.legate.admin_addr)
        .await
        .unwrap();
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..60 {
        let mut send = send.clone();
        send.ready().await.unwrap();
        let req = http::Request::get("http://127.0.0.1/admin/requests?limit=1000")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .expect("an answer's head, not a hang")
            .unwrap();
        statuses.push(resp.status().as_u16());
        // Kept, unread: its stream grants no window.
        held.push(resp);
    }
    let first_refused = statuses.iter().position(|s| *s == 503);
    assert!(
        matches!(first_refused, Some(n) if n >= 16),
        "answers are held up to the bound, then refused: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    // Once the streams go, their share comes back.
    drop(held);
    drop(send);
    let wait = async {
        loop {
            let resp = env
                .http
                .get(format!(
                    "http://{}/admin/requests?limit=1000",
                    env.legate.admin_addr
                ))
                .send()
                .await
                .unwrap();
            if resp.status() == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the admin plane answers again once the streams are gone");
}
