//! End-to-end tests of the mock: a real HTTP client against a server on 127.0.0.1:0.
//! Waits are on the mock's counters; timeouts only keep a broken build from hanging.

mod anthropic_api;
mod control_plane;
mod faults;
mod openai_api;
mod responses_api;
mod script_queue;
mod transport;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use super::{MockServer, Script};

pub(super) type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Upper bound for anything a test waits on; never reached when the mock works.
const SAFETY_NET: Duration = Duration::from_secs(20);

/// Awaits `future`, failing the test instead of hanging if it never resolves.
pub(super) async fn within<T>(future: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(SAFETY_NET, future)
        .await
        .map_err(|_| "timed out waiting".to_owned())
}

pub(super) async fn start(
    script: Value,
) -> Result<MockServer, Box<dyn std::error::Error + Send + Sync>> {
    let script = Script::from_value(script)?;
    let listen: SocketAddr = "127.0.0.1:0".parse()?;
    Ok(MockServer::start(listen, script, None).await?)
}

pub(super) fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// POSTs a JSON body and returns the response.
pub(super) async fn post(
    server: &MockServer,
    path: &str,
    body: &Value,
) -> Result<reqwest::Response, reqwest::Error> {
    client()
        .post(format!("{}{path}", server.base_url()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
}

pub(super) async fn json_of(
    response: reqwest::Response,
) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    Ok(serde_json::from_slice(&response.bytes().await?)?)
}

/// GETs `url` and parses the answer as JSON.
pub(super) async fn get_json(
    url: String,
) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    json_of(client().get(url).send().await?).await
}

/// One parsed SSE event.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Event {
    pub event: Option<String>,
    pub data: String,
}

impl Event {
    pub(super) fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// Splits an SSE body into events; every event must end with a blank line.
pub(super) fn parse_sse(text: &str) -> Vec<Event> {
    let mut events = Vec::new();
    for block in text.split_terminator("\n\n") {
        let mut event = Event {
            event: None,
            data: String::new(),
        };
        for line in block.lines() {
            if let Some(name) = line.strip_prefix("event: ") {
                event.event = Some(name.to_owned());
            } else if let Some(data) = line.strip_prefix("data: ") {
                event.data.push_str(data);
            }
        }
        events.push(event);
    }
    events
}

pub(super) fn anthropic_request(stream: bool) -> Value {
    serde_json::json!({
        "model": "claude-test",
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

pub(super) fn openai_request(stream: bool, include_usage: bool) -> Value {
    let mut body = serde_json::json!({
        "model": "gpt-test",
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    });
    if include_usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body
}
