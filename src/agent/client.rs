//! The HTTP side: one streamed `POST /v1/messages` to legate per turn, its SSE events fed to
//! a [`ReplyBuilder`] and its text deltas handed to the caller as they arrive.
//!
//! No retries: legate owns them, and a retry here would multiply its attempts. Whatever goes
//! wrong (connection, status, an error event, a cut stream) is a [`ClientError`] and ends the
//! run.

use std::error::Error as _;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::reply::{Reply, ReplyBuilder, StreamError};
use crate::sse::SseParser;

/// `anthropic-version` sent with every request.
const ANTHROPIC_VERSION: &str = "2023-06-01";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence on an open stream longer than this ends the run. legate has its own, shorter
/// upstream timeouts; this only guards against legate itself hanging.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Error bodies are read up to this many bytes.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// The most bytes an event (or a line without its end) may take: legate's own default
/// `limits.max_event_bytes`. legate never relays a larger one, so more means whatever `--url`
/// points at is misbehaving, and reading on would buffer without bound (SPEC §14).
const MAX_EVENT_BYTES: usize = 4 << 20;
/// The most bytes a whole reply may take on the wire: a reply of `max_tokens` (8,192) tokens
/// is a few megabytes of events at most; what passes this is not a reply, and holding it
/// would grow the agent (and its transcript) without bound.
const MAX_REPLY_BYTES: usize = 64 << 20;

/// Why a turn's request failed.
#[derive(Debug)]
pub(super) enum ClientError {
    BadUrl {
        url: String,
        detail: String,
    },
    Connect(hyper_util::client::legacy::Error),
    /// A non-2xx answer; type and message from the Anthropic-shaped error body if it had one.
    Status {
        status: u16,
        error_type: Option<String>,
        message: String,
    },
    Body(hyper::Error),
    Stream(StreamError),
    Idle(Duration),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::BadUrl { url, detail } => write!(f, "bad legate URL {url:?}: {detail}"),
            ClientError::Connect(e) => {
                write!(f, "cannot reach legate: {e}")?;
                let mut source = e.source();
                while let Some(cause) = source {
                    write!(f, ": {cause}")?;
                    source = cause.source();
                }
                Ok(())
            }
            ClientError::Status {
                status,
                error_type,
                message,
            } => match error_type {
                Some(t) => write!(f, "HTTP {status} {t}: {message}"),
                None => write!(f, "HTTP {status}: {message}"),
            },
            ClientError::Body(e) => write!(f, "the response broke off: {e}"),
            ClientError::Stream(e) => write!(f, "{e}"),
            ClientError::Idle(d) => write!(f, "no data from legate for {} s", d.as_secs()),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<StreamError> for ClientError {
    fn from(e: StreamError) -> ClientError {
        ClientError::Stream(e)
    }
}

/// Talks to one legate instance.
pub(super) struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    uri: Uri,
    key: HeaderValue,
}

impl Client {
    /// `base_url` is legate's data plane (`http://host:port`, optionally with a path prefix).
    pub(super) fn new(base_url: &str, key: &str) -> Result<Client, ClientError> {
        let bad = |detail: &str| ClientError::BadUrl {
            url: base_url.to_owned(),
            detail: detail.to_owned(),
        };
        let full = format!("{}/v1/messages", base_url.trim_end_matches('/'));
        let uri: Uri = full.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            // legate runs beside the agent; its data plane is plain HTTP on localhost.
            _ => return Err(bad("only http:// URLs are supported")),
        }
        if uri.host().is_none() {
            return Err(bad("no host"));
        }
        let key =
            HeaderValue::from_str(key).map_err(|_| bad("the API key is not a header value"))?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Client { http, uri, key })
    }

    /// Sends one request body and streams the reply, calling `on_text` with each text delta.
    pub(super) async fn send(
        &self,
        body: &Value,
        on_text: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Reply, ClientError> {
        let bytes = Bytes::from(serde_json::to_vec(body).map_err(|e| {
            ClientError::Stream(StreamError::Malformed {
                event: "request".to_owned(),
                detail: e.to_string(),
            })
        })?);
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .header("anthropic-version", ANTHROPIC_VERSION)
            .header("x-api-key", self.key.clone())
            .body(Full::new(bytes))
            .map_err(|e| ClientError::BadUrl {
                url: self.uri.to_string(),
                detail: e.to_string(),
            })?;
        // legate answers within its own timeouts; this only guards against it hanging.
        let response = tokio::time::timeout(IDLE_TIMEOUT, self.http.request(request))
            .await
            .map_err(|_| ClientError::Idle(IDLE_TIMEOUT))?
            .map_err(ClientError::Connect)?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            return Err(status_error(status.as_u16(), &mut body).await);
        }
        read_stream(&mut body, on_text).await
    }
}

async fn next_chunk(body: &mut Incoming) -> Result<Option<Bytes>, ClientError> {
    loop {
        let frame = tokio::time::timeout(IDLE_TIMEOUT, body.frame())
            .await
            .map_err(|_| ClientError::Idle(IDLE_TIMEOUT))?;
        match frame {
            None => return Ok(None),
            Some(Err(e)) => return Err(ClientError::Body(e)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

async fn read_stream(
    body: &mut Incoming,
    on_text: &mut (dyn FnMut(&str) + Send),
) -> Result<Reply, ClientError> {
    let mut parser = SseParser::new();
    let mut builder = ReplyBuilder::new();
    let mut read = 0usize;
    loop {
        let chunk = next_chunk(body).await?;
        match &chunk {
            Some(data) => {
                read = read.saturating_add(data.len());
                if read > MAX_REPLY_BYTES {
                    return Err(StreamError::ReplyTooLarge {
                        limit: MAX_REPLY_BYTES,
                    }
                    .into());
                }
                parser.push(data);
            }
            None => parser.finish(),
        }
        if parser.pending_bytes() > MAX_EVENT_BYTES {
            return Err(StreamError::TooLarge {
                limit: MAX_EVENT_BYTES,
            }
            .into());
        }
        while let Some(event) = parser.next_event() {
            if let Some(text) = builder.push(&event)? {
                on_text(&text);
            }
        }
        // Nothing after message_stop matters; legate closes the stream there anyway.
        if chunk.is_none() || builder.is_done() {
            return Ok(builder.finish()?);
        }
    }
}

async fn status_error(status: u16, body: &mut Incoming) -> ClientError {
    let mut bytes = Vec::new();
    while bytes.len() < MAX_ERROR_BODY {
        match next_chunk(body).await {
            Ok(Some(data)) => bytes.extend_from_slice(&data),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(MAX_ERROR_BODY);
    let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.pointer(&format!("/error/{name}")))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let message = field("message").unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        if text.is_empty() {
            "(empty body)".to_owned()
        } else {
            text.chars().take(500).collect()
        }
    });
    ClientError::Status {
        status,
        error_type: field("type"),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_plain_http_urls_are_accepted() {
        assert!(Client::new("http://127.0.0.1:8787", "k").is_ok());
        assert!(Client::new("http://127.0.0.1:8787/", "k").is_ok());
        for bad in ["https://example.com", "127.0.0.1:8787", "not a url", ""] {
            assert!(
                matches!(Client::new(bad, "k"), Err(ClientError::BadUrl { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            Client::new("http://127.0.0.1:1", "bad\nkey"),
            Err(ClientError::BadUrl { .. })
        ));
    }

    #[test]
    fn the_messages_path_is_appended_to_the_base() -> Result<(), ClientError> {
        let client = Client::new("http://127.0.0.1:9/prefix/", "k")?;
        assert_eq!(
            client.uri.to_string(),
            "http://127.0.0.1:9/prefix/v1/messages"
        );
        Ok(())
    }

    /// Serves one canned HTTP/1.1 response (close-delimited) after reading the request.
    async fn serve_once(response: String) -> std::io::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the head and the Content-Length body, so closing does not reset the socket.
            while let Ok(n) = socket.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                if let Some(head_end) = text.find("\r\n\r\n") {
                    let length = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if request.len() >= head_end + 4 + length {
                        break;
                    }
                }
            }
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
        Ok(format!("http://{addr}"))
    }

    fn sse_response(events: &[(&str, Value)]) -> String {
        let mut out =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                .to_owned();
        for (name, data) in events {
            // CRLF line ends, as some servers send them.
            out.push_str(&format!("event: {name}\r\ndata: {data}\r\n\r\n"));
        }
        out
    }

    async fn send(response: String) -> Result<(String, Reply), ClientError> {
        let url = serve_once(response)
            .await
            .map_err(|e| ClientError::BadUrl {
                url: String::new(),
                detail: e.to_string(),
            })?;
        let client = Client::new(&url, "k")?;
        let mut printed = String::new();
        let reply = client
            .send(&json!({"model": "m"}), &mut |t: &str| printed.push_str(t))
            .await?;
        Ok((printed, reply))
    }

    fn text_stream(stop: bool) -> Vec<(&'static str, Value)> {
        let mut events = vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "there"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
        ];
        if stop {
            events.push(("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}})));
            events.push(("message_stop", json!({"type": "message_stop"})));
        }
        events
    }

    #[tokio::test]
    async fn a_stream_is_printed_as_it_comes_and_assembled() -> Result<(), ClientError> {
        let (printed, reply) = send(sse_response(&text_stream(true))).await?;
        assert_eq!(printed, "Hi there");
        assert_eq!(
            reply.content,
            vec![json!({"type": "text", "text": "Hi there"})]
        );
        assert_eq!(reply.usage.total(), 7);
        Ok(())
    }

    #[tokio::test]
    async fn a_cut_stream_and_an_error_event_are_errors() {
        let cut = send(sse_response(&text_stream(false))).await;
        assert!(matches!(
            cut,
            Err(ClientError::Stream(StreamError::Incomplete))
        ));
        let mut events = text_stream(false);
        events.push((
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ));
        let error = send(sse_response(&events)).await;
        assert!(matches!(
            error,
            Err(ClientError::Stream(StreamError::Api { ref error_type, .. })) if error_type == "overloaded_error"
        ));
    }

    #[test]
    fn the_event_bound_is_legates_own() {
        assert_eq!(
            MAX_EVENT_BYTES,
            crate::config::ServerLimits::default().max_event_bytes
        );
    }

    #[tokio::test]
    async fn an_event_that_never_ends_is_cut_off_at_the_bound() {
        // One `data:` line, never ended, larger than the bound. Read to the end, it would be a
        // stream cut short (Incomplete) after the whole line was buffered.
        let mut response = sse_response(&text_stream(false));
        response.push_str("event: content_block_delta\ndata: ");
        response.push_str(&"x".repeat(MAX_EVENT_BYTES + 1));
        let result = send(response).await;
        assert!(
            matches!(
                result,
                Err(ClientError::Stream(StreamError::TooLarge {
                    limit: MAX_EVENT_BYTES
                }))
            ),
            "{result:?}"
        );
    }

    /// Events each within their bound, but without end: the reply as a whole is bounded too.
    #[tokio::test]
    async fn a_reply_without_end_is_cut_off_at_the_bound() {
        let mut response = sse_response(&text_stream(false));
        let piece = json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "x".repeat(1 << 20)}});
        let event = format!("event: content_block_delta\ndata: {piece}\n\n");
        for _ in 0..(MAX_REPLY_BYTES >> 20) + 1 {
            response.push_str(&event);
        }
        let result = send(response).await;
        assert!(
            matches!(
                result,
                Err(ClientError::Stream(StreamError::ReplyTooLarge {
                    limit: MAX_REPLY_BYTES
                }))
            ),
            "{:?}",
            result.map(|_| ())
        );
    }

    #[tokio::test]
    async fn a_non_2xx_status_carries_the_error_body() {
        let body = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string();
        let json_error = format!(
            "HTTP/1.1 529 Site Overloaded\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let result = send(json_error).await;
        assert!(
            matches!(&result, Err(ClientError::Status { status: 529, error_type: Some(t), message }) if t == "overloaded_error" && message == "Overloaded"),
            "{result:?}"
        );
        let html = "HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/html\r\nconnection: close\r\n\r\n<html>bad gateway</html>".to_owned();
        let result = send(html).await;
        assert!(
            matches!(&result, Err(ClientError::Status { status: 502, error_type: None, message }) if message == "<html>bad gateway</html>"),
            "{result:?}"
        );
    }
}
