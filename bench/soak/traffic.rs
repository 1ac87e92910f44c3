//! The soak's callers, each kind a bounded number of loops that run until the stop token:
//! ordinary and streaming callers of both APIs, callers that walk away mid-stream, callers
//! inventing model names, callers of upstreams that fail (529s, cut streams, hangs, oversized
//! events, error bodies echoing the provider key), and hostile peers: silent connections,
//! slowloris heads, stalled bodies, oversized and crowding uploads.
//!
//! Every outcome is tallied as expected or not; a response carrying the provider key is a leak.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::procs::{MAX_BODY_BYTES, PROVIDER_KEY};

/// What each kind of caller saw.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) expected: AtomicU64,
    pub(crate) unexpected: AtomicU64,
    pub(crate) leaks: AtomicU64,
    /// The statuses of the unexpected outcomes (0: no answer at all).
    pub(crate) otherwise: Mutex<BTreeMap<u16, u64>>,
}

impl Tally {
    fn count(&self, seen: Seen) {
        match seen {
            Ok(()) => self.expected.fetch_add(1, Ordering::Relaxed),
            Err(status) => {
                if let Ok(mut m) = self.otherwise.lock() {
                    *m.entry(status).or_default() += 1;
                }
                self.unexpected.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// An outcome: as expected, or the status that came instead (0: none).
pub(crate) type Seen = Result<(), u16>;

/// `r` judged by `ok`.
fn judge(r: Option<(u16, String)>, ok: impl FnOnce(u16, &str) -> bool) -> Seen {
    match r {
        Some((s, t)) if ok(s, &t) => Ok(()),
        Some((s, _)) => Err(s),
        None => Err(0),
    }
}

fn seen(ok: bool) -> Seen {
    if ok { Ok(()) } else { Err(0) }
}

pub(crate) const KINDS: [&str; 10] = [
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

pub(crate) type Tallies = Arc<[Tally; KINDS.len()]>;

/// The mock's script: the upstream faults, chosen by model name.
pub(crate) fn mock_script() -> String {
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

pub(crate) struct Traffic {
    pub(crate) http: reqwest::Client,
    /// A client of its own for the uploads legate refuses unread: legate reads their rest
    /// after the answer, and closes the connection when that rest is too large or too slow; a
    /// pooled connection shared with the others might then be reused as it does.
    pub(crate) rough: reqwest::Client,
    pub(crate) url: String,
    pub(crate) addr: String,
    pub(crate) stop: CancellationToken,
    pub(crate) tallies: Tallies,
}

fn anthropic(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":16,"stream":{stream},"messages":[{{"role":"user","content":"soak"}}]}}"#
    )
}

impl Traffic {
    /// Starts every loop; they end when `stop` fires.
    pub(crate) fn spawn_all(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
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
            let outcome = match kind {
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
            self.tallies[kind].count(outcome);
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
        self.post_on(&self.http, path, body, extra).await
    }

    async fn post_on(
        &self,
        http: &reqwest::Client,
        path: &str,
        body: String,
        extra: &[(&str, &str)],
    ) -> Option<(u16, String)> {
        let mut req = http
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

    async fn normal(&self, i: u64) -> Seen {
        let r = if i.is_multiple_of(2) {
            self.post("/v1/messages", anthropic("claude-soak", false), &[])
                .await
        } else {
            let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"soak"}]}"#;
            self.post("/v1/chat/completions", body.to_string(), &[])
                .await
        };
        judge(r, |s, _| s == 200)
    }

    async fn streamed(&self, model: &str, _i: u64) -> Seen {
        let r = self.post("/v1/messages", anthropic(model, true), &[]).await;
        judge(r, |s, t| s == 200 && t.contains("message_stop"))
    }

    /// Reads the first chunk of a stream, then goes away.
    async fn abandon(&self) -> Seen {
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
            Ok(mut r) if r.status() == 200 => seen(matches!(r.chunk().await, Ok(Some(_)))),
            Ok(r) => Err(r.status().as_u16()),
            Err(_) => Err(0),
        }
    }

    async fn name(&self, n: u64) -> Seen {
        let model = format!("claude-soak-name-{n:x}");
        let r = self
            .post("/v1/messages", anthropic(&model, false), &[])
            .await;
        judge(r, |s, _| s == 200)
    }

    /// Each fault as it shows before its breaker opens; once open (all of them fail), 529.
    async fn fault(&self, i: u64) -> Seen {
        let deadline = [("x-legate-deadline-ms", "1500")];
        match i % 5 {
            0 => {
                let r = self.post(
                    "/v1/messages",
                    anthropic("claude-soak-overloaded", false),
                    &[],
                );
                judge(r.await, |s, _| s == 529)
            }
            1 => {
                let r = self.post("/v1/messages", anthropic("claude-soak-cut", true), &[]);
                judge(r.await, |s, t| {
                    s == 529 || s == 200 && t.contains("event: error")
                })
            }
            2 => {
                let r = self.post(
                    "/v1/messages",
                    anthropic("claude-soak-hang", false),
                    &deadline,
                );
                judge(r.await, |s, _| s == 529 || s == 504)
            }
            3 => {
                let r = self.post("/v1/messages", anthropic("claude-soak-echo", false), &[]);
                judge(r.await, |s, t| {
                    s == 529 || s == 500 && t.contains("[redacted]")
                })
            }
            _ => {
                // The oversized event is the first content: retried, then a broken stream.
                let r = self.post("/v1/messages", anthropic("claude-soak-huge", true), &[]);
                judge(r.await, |s, t| {
                    s == 529 || s == 502 || s == 200 && t.contains("max_event_bytes")
                })
            }
        }
    }

    /// Connects and sends nothing: legate must close it within `header_read_timeout`.
    async fn silent(&self) -> Seen {
        let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
            return Err(0);
        };
        seen(closed_within(&mut sock, Duration::from_secs(6)).await)
    }

    /// Sends a request head one byte at a time, never finishing it.
    async fn slowloris(&self) -> Seen {
        let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
            return Err(0);
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
        seen(
            tokio::time::timeout(Duration::from_secs(6), drip)
                .await
                .is_ok(),
        )
    }

    /// Declares a body and sends a tenth of it: 408 after `body_read_timeout`.
    async fn slow_body(&self) -> Seen {
        let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
            return Err(0);
        };
        let head = "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":";
        if sock.write_all(head.as_bytes()).await.is_err() {
            return Err(0);
        }
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(8), sock.read_to_end(&mut got));
        seen(read.await.is_ok() && got.starts_with(b"HTTP/1.1 408"))
    }

    /// Uploads over `max_body_bytes`: declared (refused at once) or found while reading.
    async fn huge(&self, i: u64) -> Seen {
        if i.is_multiple_of(2) {
            let Ok(mut sock) = TcpStream::connect(&self.addr).await else {
                return Err(0);
            };
            let head = "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 104857600\r\n\r\n";
            if sock.write_all(head.as_bytes()).await.is_err() {
                return Err(0);
            }
            let mut got = vec![0u8; 64];
            let read = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut got));
            seen(matches!(read.await, Ok(Ok(n)) if got[..n].starts_with(b"HTTP/1.1 413")))
        } else {
            // No length declared: the limit is found while reading.
            let chunk = bytes::Bytes::from(vec![b'x'; 256 << 10]);
            let chunks = (0..=MAX_BODY_BYTES / chunk.len())
                .map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
            let resp = self
                .rough
                .post(format!("{}/v1/messages", self.url))
                .header("content-type", "application/json")
                .timeout(Duration::from_secs(10))
                .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                    chunks,
                )))
                .send()
                .await;
            // Or shed with 529: the bytes read so far count against max_buffered_bytes.
            match resp {
                Ok(r) if r.status() == 413 || r.status() == 529 => Ok(()),
                Ok(r) => Err(r.status().as_u16()),
                Err(_) => Err(0),
            }
        }
    }

    /// Eight large bodies at once (as much as the global buffer bound) beside the rest: each
    /// is served or shed with 529, never anything else.
    async fn crowd(&self) -> Seen {
        let pad = "p".repeat(MAX_BODY_BYTES / 2);
        let body = format!(
            r#"{{"model":"claude-soak","max_tokens":16,"metadata":{{"user_id":"{pad}"}},"messages":[{{"role":"user","content":"soak"}}]}}"#
        );
        let all = futures_util::future::join_all(
            (0..8).map(|_| self.post_on(&self.rough, "/v1/messages", body.clone(), &[])),
        )
        .await;
        all.into_iter()
            .map(|r| judge(r, |s, _| s == 200 || s == 529))
            .find(Result::is_err)
            .unwrap_or(Ok(()))
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
