//! The soak's callers, each kind a bounded number of loops that run until the stop token:
//! ordinary and streaming callers of both APIs, callers that walk away mid-stream, callers
//! inventing model names, callers of upstreams that fail (529s, cut streams, hangs, oversized
//! events, error bodies echoing the provider key), and hostile peers: silent connections,
//! slowloris heads, stalled bodies, oversized and crowding uploads.
//!
//! Every outcome is tallied as expected or not; a response carrying the provider key is a leak.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::procs::{MAX_BODY_BYTES, PROVIDER_KEY};

/// What each kind of caller saw.
#[derive(Default)]
pub struct Tally {
    pub expected: AtomicU64,
    pub unexpected: AtomicU64,
    pub leaks: AtomicU64,
}

impl Tally {
    fn count(&self, expected: bool) {
        let c = if expected {
            &self.expected
        } else {
            &self.unexpected
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

pub const KINDS: [&str; 10] = [
    "normal",
    "stream",
    "abandon",
    "names",
    "faults",
    "silent",
    "slowloris",
    "slow body",
    "huge",
    "crowd",
];

pub type Tallies = Arc<[Tally; KINDS.len()]>;

/// The mock's script: the upstream faults, chosen by model name.
pub fn mock_script() -> String {
    let big = "x".repeat(3 * crate::procs::MAX_EVENT_BYTES * 2);
    serde_json::json!({"replies": [
        {"match": {"model": "claude-soak-overloaded"}, "times": 0, "status": 529},
        {"match": {"model": "claude-soak-cut", "stream": true}, "times": 0, "cut_after": 5},
        {"match": {"model": "claude-soak-hang"}, "times": 0, "hang": true},
        {"match": {"model": "claude-soak-echo"}, "times": 0, "status": 500,
         "error_message": format!("invalid key Bearer {PROVIDER_KEY}"),
         "headers": {"x-echo": PROVIDER_KEY}},
        {"match": {"model": "claude-soak-huge", "stream": true}, "times": 0,
         "content": [{"type": "text", "text": big}]},
    ]})
    .to_string()
}

pub struct Traffic {
    pub http: reqwest::Client,
    pub url: String,
    pub addr: String,
    pub stop: CancellationToken,
    pub tallies: Tallies,
}

fn anthropic(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":16,"stream":{stream},"messages":[{{"role":"user","content":"soak"}}]}}"#
    )
}

impl Traffic {
    /// Starts every loop; they end when `stop` fires.
    pub fn spawn_all(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        let mut go = |kind: usize, n: usize| {
            for i in 0..n {
                let t = self.clone();
                tasks.push(tokio::spawn(async move { t.run(kind, i).await }));
            }
        };
        go(0, 3);
        go(1, 2);
        go(2, 1);
        go(3, 2);
        go(4, 2);
        go(5, 1);
        go(6, 1);
        go(7, 1);
        go(8, 1);
        go(9, 1);
        tasks
    }

    async fn run(&self, kind: usize, worker: usize) {
        let mut i: u64 = 0;
        while !self.stop.is_cancelled() {
            let expected = match kind {
                0 => self.normal(i).await,
                1 => self.streamed("claude-soak", i).await,
                2 => self.abandon().await,
                3 => self.name((worker as u64) << 32 | i).await,
                4 => self.fault(i).await,
                5 => self.silent().await,
                6 => self.slowloris().await,
                7 => self.slow_body().await,
                8 => self.huge(i).await,
                _ => self.crowd().await,
            };
            self.tallies[kind].count(expected);
            i += 1;
            // Pace the loops: the soak is about time and variety, not throughput.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = self.stop.cancelled() => {}
            }
        }
    }

    async fn post(
        &self,
        path: &str,
        body: String,
        extra: &[(&str, &str)],
    ) -> Option<(u16, String)> {
        let mut req = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .timeout(Duration::from_secs(10))
            .body(body);
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.ok()?;
        let status = resp.status().as_u16();
        let headers = format!("{:?}", resp.headers());
        let text = resp.text().await.unwrap_or_default();
        if headers.contains(PROVIDER_KEY) || text.contains(PROVIDER_KEY) {
            self.tallies[4].leaks.fetch_add(1, Ordering::Relaxed);
        }
        Some((status, text))
    }

    async fn normal(&self, i: u64) -> bool {
        let r = if i % 2 == 0 {
            self.post("/v1/messages", anthropic("claude-soak", false), &[])
                .await
        } else {
            let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"soak"}]}"#;
            self.post("/v1/chat/completions", body.to_string(), &[])
                .await
        };
        matches!(r, Some((200, _)))
    }

    async fn streamed(&self, model: &str, _i: u64) -> bool {
        let r = self.post("/v1/messages", anthropic(model, true), &[]).await;
        matches!(r, Some((200, t)) if t.contains("message_stop"))
    }

    /// Reads the first chunk of a stream, then goes away.
    async fn abandon(&self) -> bool {
        let resp = self
            .http
            .post(format!("{}/v1/messages", self.url))
            .header("content-type", "application/json")
            .header("x-legate-deadline-ms", "5000")
            .timeout(Duration::from_secs(10))
            .body(anthropic("claude-soak", true))
            .send()
            .await;
        match resp {
            Ok(mut r) => r.status() == 200 && matches!(r.chunk().await, Ok(Some(_))),
            Err(_) => false,
        }
    }

    async fn name(&self, n: u64) -> bool {
        let model = format!("claude-soak-name-{n:x}");
        let r = self
            .post("/v1/messages", anthropic(&model, false), &[])
            .await;
        matches!(r, Some((200, _)))
    }

    async fn fault(&self, i: u64) -> bool {
        let deadline = [("x-legate-deadline-ms", "1500")];
        match i % 5 {
            0 => {
                let r = self.post(
                    "/v1/messages",
                    anthropic("claude-soak-overloaded", false),
                    &[],
                );
                matches!(r.await, Some((529, _)))
            }
            1 => {
                let r = self.post("/v1/messages", anthropic("claude-soak-cut", true), &[]);
                matches!(r.await, Some((200, t)) if t.contains("event: error"))
            }
            2 => {
                let r = self.post(
                    "/v1/messages",
                    anthropic("claude-soak-hang", false),
                    &deadline,
                );
                matches!(r.await, Some((504, _)))
            }
            3 => {
                let r = self.post("/v1/messages", anthropic("claude-soak-echo", false), &[]);
                matches!(r.await, Some((500, t)) if t.contains("[redacted]"))
            }
            _ => {
                // The oversized event is the first content: retried, then a broken stream.
                let r = self.post("/v1/messages", anthropic("claude-soak-huge", true), &[]);
                match r.await {
                    Some((502, _)) => true,
                    Some((200, t)) => t.contains("max_event_bytes"),
                    _ => false,
                }
            }
        }
    }

    /// Connects and sends nothing: legate must close it within `header_read_timeout`.
    async fn silent(&self) -> bool {
        let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
            return false;
        };
        closed_within(&mut sock, Duration::from_secs(6)).await
    }

    /// Sends a request head one byte at a time, never finishing it.
    async fn slowloris(&self) -> bool {
        let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
            return false;
        };
        let head = b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ";
        let drip = async {
            for b in head.iter().chain(std::iter::repeat(&b'a')) {
                if sock.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        // Cut by header_read_timeout (2 s), well before this.
        tokio::time::timeout(Duration::from_secs(6), drip)
            .await
            .is_ok()
    }

    /// Declares a body and sends a tenth of it: 408 after `body_read_timeout`.
    async fn slow_body(&self) -> bool {
        let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
            return false;
        };
        let head = "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":";
        if sock.write_all(head.as_bytes()).await.is_err() {
            return false;
        }
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(8), sock.read_to_end(&mut got));
        read.await.is_ok() && got.starts_with(b"HTTP/1.1 408")
    }

    /// Uploads over `max_body_bytes`: declared (refused at once) or found while reading.
    async fn huge(&self, i: u64) -> bool {
        if i % 2 == 0 {
            let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
                return false;
            };
            let head = "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 104857600\r\n\r\n";
            if sock.write_all(head.as_bytes()).await.is_err() {
                return false;
            }
            let mut got = vec![0u8; 64];
            let read = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut got));
            matches!(read.await, Ok(Ok(n)) if got[..n].starts_with(b"HTTP/1.1 413"))
        } else {
            // No length declared: the limit is found while reading.
            let chunk = bytes::Bytes::from(vec![b'x'; 256 << 10]);
            let chunks = (0..=MAX_BODY_BYTES / chunk.len())
                .map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
            let resp = self
                .http
                .post(format!("{}/v1/messages", self.url))
                .header("content-type", "application/json")
                .timeout(Duration::from_secs(10))
                .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                    chunks,
                )))
                .send()
                .await;
            // Or shed with 529: the bytes read so far count against max_buffered_bytes.
            matches!(resp, Ok(r) if r.status() == 413 || r.status() == 529)
        }
    }

    /// Eight large bodies at once (as much as the global buffer bound) beside the rest: each is served or shed
    /// with 529, never anything else.
    async fn crowd(&self) -> bool {
        let pad = "p".repeat(MAX_BODY_BYTES / 2);
        let body = format!(
            r#"{{"model":"claude-soak","max_tokens":16,"metadata":{{"user_id":"{pad}"}},"messages":[{{"role":"user","content":"soak"}}]}}"#
        );
        let all = futures_util::future::join_all(
            (0..8).map(|_| self.post("/v1/messages", body.clone(), &[])),
        )
        .await;
        all.iter()
            .all(|r| matches!(r, Some((200, _)) | Some((529, _))))
    }
}

/// Whether the peer closed the connection within `limit`.
async fn closed_within(sock: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 256];
    let wait = async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, wait).await.is_ok()
}
