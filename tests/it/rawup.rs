//! A raw HTTP/1.1 upstream for behaviour the scripted mock cannot show: replies written byte
//! for byte, connections held open after a partial reply, keep-alive connections closed
//! without an answer.

#![allow(dead_code, reason = "parts used by some tests only")]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness;

/// One request as it arrived.
pub(crate) struct RawRequest {
    /// Which connection (0-based, in accept order) and which request on it (0-based).
    pub conn: usize,
    pub on_conn: usize,
    pub head: String,
    pub body: Vec<u8>,
}

pub(crate) enum Action {
    /// Write these bytes and keep serving the connection.
    Reply(Vec<u8>),
    /// Write these bytes and close the connection (the end of a body without a length).
    ReplyAndClose(Vec<u8>),
    /// Write these bytes and then hold the connection open, sending nothing more.
    ReplyAndHang(Vec<u8>),
    /// Write the first bytes, wait for the signal, then write the second and keep serving: a
    /// body whose two halves the caller sees apart.
    ReplyInTwo(Vec<u8>, tokio::sync::oneshot::Receiver<()>, Vec<u8>),
    /// Write the parts one after another, `pause` apart, and keep serving: a server whose
    /// writes arrive apart (its last event, then its body's end).
    ReplyPaced(Vec<Vec<u8>>, std::time::Duration),
    /// Close the connection without a byte.
    Close,
    /// Reset the connection (RST, not FIN) without a byte.
    Reset,
    /// Stop listening (new connections are refused), then close this one without a byte: a
    /// provider going down with the request.
    CloseAndStopListening,
}

pub(crate) struct RawUpstream {
    pub url: String,
    pub requests: Arc<AtomicUsize>,
    pub connections: Arc<AtomicUsize>,
}

pub(crate) async fn start<F, Fut>(handler: F) -> RawUpstream
where
    F: Fn(RawRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Action> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let handler = Arc::new(handler);
    let (r, c) = (requests.clone(), connections.clone());
    let stop = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(async move {
        loop {
            let (sock, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(_) => return,
                },
                // Dropping the listener refuses every later connection.
                () = stop.notified() => return,
            };
            let conn = c.fetch_add(1, Ordering::SeqCst);
            let (h, r, st) = (handler.clone(), r.clone(), stop.clone());
            tokio::spawn(serve(sock, conn, h, r, st));
        }
    });
    RawUpstream {
        url,
        requests,
        connections,
    }
}

async fn serve<F, Fut>(
    mut sock: TcpStream,
    conn: usize,
    handler: Arc<F>,
    count: Arc<AtomicUsize>,
    stop: Arc<tokio::sync::Notify>,
) where
    F: Fn(RawRequest) -> Fut,
    Fut: Future<Output = Action>,
{
    let mut buf = Vec::new();
    for on_conn in 0.. {
        let Some((head, body)) = harness::read_message(&mut sock, &mut buf).await else {
            return;
        };
        count.fetch_add(1, Ordering::SeqCst);
        let req = RawRequest {
            conn,
            on_conn,
            head,
            body,
        };
        match handler(req).await {
            Action::Reply(bytes) => {
                if sock.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Action::ReplyAndClose(bytes) => {
                let _ = sock.write_all(&bytes).await;
                return;
            }
            Action::ReplyAndHang(bytes) => {
                let _ = sock.write_all(&bytes).await;
                // Held until the peer goes away.
                let mut sink = [0u8; 1024];
                while matches!(sock.read(&mut sink).await, Ok(n) if n > 0) {}
                return;
            }
            Action::ReplyInTwo(first, go, second) => {
                if sock.write_all(&first).await.is_err() || go.await.is_err() {
                    return;
                }
                if sock.write_all(&second).await.is_err() {
                    return;
                }
            }
            Action::ReplyPaced(parts, pause) => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        // The stand-in's own pacing between its writes.
                        tokio::time::sleep(pause).await;
                    }
                    if sock.write_all(part).await.is_err() {
                        return;
                    }
                }
            }
            Action::Close => return,
            Action::CloseAndStopListening => {
                stop.notify_one();
                return;
            }
            Action::Reset => {
                let _ = sock.set_zero_linger();
                return;
            }
        }
    }
}

/// A chunked event-stream reply written in `parts` (each a chunk; the body's end follows the
/// last, in a write of its own), 50 ms apart.
pub(crate) fn paced_chunks(parts: &[&str]) -> Action {
    paced_chunks_every(parts, std::time::Duration::from_millis(50))
}

/// [`paced_chunks`], `pause` apart.
pub(crate) fn paced_chunks_every(parts: &[&str], pause: std::time::Duration) -> Action {
    let mut writes = vec![
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
    ];
    writes[0].extend_from_slice(format!("{:x}\r\n{}\r\n", parts[0].len(), parts[0]).as_bytes());
    for part in &parts[1..] {
        writes.push(format!("{:x}\r\n{part}\r\n", part.len()).into_bytes());
    }
    writes.push(b"0\r\n\r\n".to_vec());
    Action::ReplyPaced(writes, pause)
}

/// A 200 answer of media type `ct` with `body` and its length, keeping the connection.
pub(crate) fn reply_of(ct: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An event-stream response head (no length: the body runs until the connection ends).
pub(crate) fn sse_head() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec()
}

/// A JSON response with a length, keeping the connection alive.
pub(crate) fn json_reply(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A whole Anthropic stream saying `text`, with usage.
pub(crate) fn anthropic_stream(text: &str) -> String {
    let start = r#"{"type":"message_start","message":{"id":"msg_r","type":"message","role":"assistant","model":"claude-r","content":[],"stop_reason":null,"usage":{"input_tokens":7,"output_tokens":1}}}"#;
    let delta = serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}});
    format!(
        "event: message_start\ndata: {start}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: content_block_delta\ndata: {delta}\n\n\
         event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
         event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":3}}}}\n\n\
         event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    )
}

/// legate in front of a raw upstream answering every request with `reply`, retrying fast.
pub(crate) async fn behind(reply: Vec<u8>) -> (harness::Env, RawUpstream) {
    let retry = "[retry]\nbase_delay = \"1ms\"\nmax_delay = \"2ms\"\n";
    behind_with(reply, retry).await
}

/// [`behind`] with `extra` config (its own `[retry]`, models, chains).
pub(crate) async fn behind_with(reply: Vec<u8>, extra: &str) -> (harness::Env, RawUpstream) {
    let up = start(move |_req| {
        let action = Action::Reply(reply.clone());
        async move { action }
    })
    .await;
    let toml = harness::config_toml_with(&up.url, "", "", extra);
    (harness::start_alone(&toml).await, up)
}

/// A whole Chat Completions stream: "Hi", `finish_reason: stop`, `[DONE]`; no usage chunk.
pub(crate) fn chat_stream_hi() -> String {
    [
        chat_chunk(r#"{"role":"assistant","content":"Hi"}"#, "null"),
        chat_chunk("{}", r#""stop""#),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

/// One OpenAI `chat.completion.chunk` event of model `gpt-x` with `delta` (JSON) and
/// `finish` (JSON: `null` or a quoted reason).
pub(crate) fn chat_chunk(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-r\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-x\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}
