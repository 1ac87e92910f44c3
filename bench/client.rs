//! What the load generator sends: one target per side (its address and its prepared requests,
//! plain and streaming, for each API measured), the mock's script, and the two ways a request
//! is timed (to the last body byte, and to the first body byte of a stream).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::error::BenchError;
use crate::wire::{self, Conn};

/// Longest a single request may take before it counts as failed; far above any latency the
/// benchmark expects, so only a real stall trips it.
pub(crate) const REQUEST_LIMIT: Duration = Duration::from_secs(10);

const MESSAGE: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"Say hello in one short sentence."}]}"#;
const STREAM_MESSAGE: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"Say hello in one short sentence."}]}"#;
const RESPONSE: &str = r#"{"model":"gpt-4.1-mini","max_output_tokens":256,"input":[{"role":"user","content":"Say hello in one short sentence."}]}"#;
const STREAM_RESPONSE: &str = r#"{"model":"gpt-4.1-mini","max_output_tokens":256,"stream":true,"input":[{"role":"user","content":"Say hello in one short sentence."}]}"#;

/// The reply the mock is scripted with: a few hundred bytes of text, about the size of a short
/// model answer, so the proxy has a realistic body to carry.
pub(crate) const MOCK_SCRIPT: &str = r#"{"default":{"content":[{"type":"text","text":"Hello! legate is a model ambassador: a small proxy that sits beside an agent on localhost and owns the connection to the model providers, with their keys, timeouts, streaming, usage metering and metrics. This reply is padded to a few hundred bytes so that the benchmark carries a body about the size of a short real answer."}]}}"#;

/// Whether the load generator sends an official SDK's whole header set (`BENCH_SDK_HEADERS=1`)
/// besides the lines each API requires: an SDK sends about nineteen lines where the default
/// requests have five, and every line costs a proxy its parse, its copy and its write.
pub(crate) fn sdk_headers() -> bool {
    std::env::var("BENCH_SDK_HEADERS").is_ok_and(|v| v == "1")
}

/// The Anthropic Python SDK's own request headers, in its spelling (wire-protocol §C3).
const ANTHROPIC_SDK: [(&str, &str); 13] = [
    ("Accept-Encoding", "gzip, deflate"),
    ("Connection", "keep-alive"),
    ("Accept", "application/json"),
    ("User-Agent", "Anthropic/Python 2.14.0"),
    ("X-Stainless-Lang", "python"),
    ("X-Stainless-Package-Version", "2.14.0"),
    ("X-Stainless-OS", "Linux"),
    ("X-Stainless-Arch", "x64"),
    ("X-Stainless-Runtime", "CPython"),
    ("X-Stainless-Runtime-Version", "3.12.3"),
    ("X-Stainless-Async", "false"),
    ("x-stainless-retry-count", "0"),
    ("x-stainless-read-timeout", "600"),
];

/// The OpenAI Python SDK's own request headers, in its spelling (wire-protocol §C3).
const OPENAI_SDK: [(&str, &str); 13] = [
    ("Accept-Encoding", "gzip, deflate"),
    ("Connection", "keep-alive"),
    ("accept", "application/json"),
    ("user-agent", "OpenAI/Python 3.57.0"),
    ("X-Stainless-Lang", "python"),
    ("X-Stainless-Package-Version", "3.57.0"),
    ("X-Stainless-OS", "Linux"),
    ("X-Stainless-Arch", "x64"),
    ("X-Stainless-Runtime", "CPython"),
    ("X-Stainless-Runtime-Version", "3.12.3"),
    ("x-stainless-async", "false"),
    ("x-stainless-retry-count", "0"),
    ("x-stainless-read-timeout", "600"),
];

/// The API a request speaks: which endpoint, body and headers the load generator sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// Anthropic `POST /v1/messages`, with the headers an Anthropic SDK sends.
    Messages,
    /// OpenAI `POST /v1/responses` (passthrough to the `openai` provider), with the headers an
    /// OpenAI SDK sends.
    Responses,
}

impl Api {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }
}

/// One side of the comparison: the mock directly, nginx, or legate in front of it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub label: &'static str,
    pub addr: SocketAddr,
    /// The API that [`Target::message`] speaks; [`Target::speaking`] switches it.
    api: Api,
    /// Plain and streaming request of each API.
    messages: [Bytes; 2],
    responses: [Bytes; 2],
}

impl Target {
    pub(crate) fn new(label: &'static str, base_url: &str) -> Result<Target, BenchError> {
        let addr = wire::address(base_url)?;
        let host = addr.to_string();
        let mut anthropic = vec![
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
            // legate consumes and never forwards the caller's key; the mock checks none.
            ("x-api-key", "bench-caller-key"),
        ];
        let mut openai = vec![
            ("content-type", "application/json"),
            ("authorization", "Bearer bench-caller-key"),
        ];
        if sdk_headers() {
            anthropic.extend(ANTHROPIC_SDK);
            openai.extend(OPENAI_SDK);
        }
        let messages = |body| wire::request("POST", Api::Messages.path(), &host, &anthropic, body);
        let responses = |body| wire::request("POST", Api::Responses.path(), &host, &openai, body);
        Ok(Target {
            label,
            addr,
            api: Api::Messages,
            messages: [messages(MESSAGE), messages(STREAM_MESSAGE)],
            responses: [responses(RESPONSE), responses(STREAM_RESPONSE)],
        })
    }

    /// The same side, sending requests of `api`.
    pub(crate) fn speaking(&self, api: Api) -> Target {
        Target {
            api,
            ..self.clone()
        }
    }

    pub(crate) fn api(&self) -> Api {
        self.api
    }

    pub(crate) fn message(&self, stream: bool) -> &Bytes {
        let pair = match self.api {
            Api::Messages => &self.messages,
            Api::Responses => &self.responses,
        };
        &pair[usize::from(stream)]
    }

    pub(crate) async fn connect(&self) -> Result<Conn, BenchError> {
        Conn::open(self.addr).await
    }

    /// `n` connections, each warmed with one request so nothing measured pays for a connect.
    pub(crate) async fn connections(&self, n: usize) -> Result<Vec<Conn>, BenchError> {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            let mut conn = self.connect().await?;
            complete(&mut conn, self.message(false)).await?;
            conns.push(conn);
        }
        Ok(conns)
    }
}

/// Sends a request and reads its body to the end; the caller times it.
pub(crate) async fn complete(conn: &mut Conn, request: &[u8]) -> Result<(), BenchError> {
    let reply = tokio::time::timeout(REQUEST_LIMIT, conn.exchange(request))
        .await
        .map_err(|_| BenchError::Timeout(REQUEST_LIMIT))??;
    checked(reply.status)
}

/// Sends a streaming request and returns the time from sending to the first body byte; the
/// rest of the stream is read so the connection is clean for the next request.
pub(crate) async fn first_byte(conn: &mut Conn, request: &[u8]) -> Result<Duration, BenchError> {
    let start = Instant::now();
    let reply = tokio::time::timeout(REQUEST_LIMIT, conn.exchange(request))
        .await
        .map_err(|_| BenchError::Timeout(REQUEST_LIMIT))??;
    checked(reply.status)?;
    let first = reply.first_byte.ok_or(BenchError::EmptyStream)?;
    Ok(first.saturating_duration_since(start))
}

/// Replaces the mock's script (control plane `PUT /_mock/script`).
pub(crate) async fn script_mock(mock_url: &str, script: &str) -> Result<(), BenchError> {
    let addr = wire::address(mock_url)?;
    let headers = [("content-type", "application/json")];
    let request = wire::request("PUT", "/_mock/script", &addr.to_string(), &headers, script);
    let mut conn = Conn::open(addr).await?;
    complete(&mut conn, &request).await
}

fn checked(status: u16) -> Result<(), BenchError> {
    match status {
        200 => Ok(()),
        other => Err(BenchError::Status(
            http::StatusCode::from_u16(other).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR),
        )),
    }
}
