//! A full plane closes one idle HTTP/2 connection for a new peer, with a short grace: a client
//! that does not read its idle connections (and so never answers the GOAWAY's PING, as some
//! SDKs' HTTP/2 transports do not) neither holds the new peer up to its header deadline nor
//! gets every other idle connection closed in turn while it lingers.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::harness::{self, Env};

const BODY: &str =
    r#"{"model":"claude-x","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

/// Whether reads are stopped, and the read waiting to be resumed.
#[derive(Default)]
struct Gate {
    frozen: bool,
    waiting: Option<Waker>,
}

/// A socket whose reads can be stopped: while frozen, the client reads nothing (what legate
/// sends waits in the kernel), as a transport that leaves its idle connections unpolled.
struct Freezable {
    tcp: TcpStream,
    gate: Arc<Mutex<Gate>>,
}

impl AsyncRead for Freezable {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        {
            let mut gate = this.gate.lock();
            if gate.frozen {
                gate.waiting = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Freezable {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

fn set_frozen(gate: &Mutex<Gate>, frozen: bool) {
    let mut g = gate.lock();
    g.frozen = frozen;
    if !frozen && let Some(w) = g.waiting.take() {
        w.wake();
    }
}

async fn connect(env: &Env) -> (SendRequest<Full<Bytes>>, Arc<Mutex<Gate>>) {
    let tcp = TcpStream::connect(env.legate.data_addr).await.unwrap();
    let gate = Arc::new(Mutex::new(Gate::default()));
    let io = Freezable {
        tcp,
        gate: gate.clone(),
    };
    let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    (send, gate)
}

async fn ask(send: &mut SendRequest<Full<Bytes>>) -> u16 {
    let req = http::Request::post("http://127.0.0.1/v1/messages")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap();
    send.ready().await.unwrap();
    send.send_request(req).await.unwrap().status().as_u16()
}

#[tokio::test]
async fn a_full_plane_closes_one_idle_http2_connection_for_a_new_peer_with_a_short_grace() {
    // Deadlines far away: a new peer waiting on them would wait a minute.
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let server =
        "header_read_timeout = \"60s\"\nconnection_idle_timeout = \"60s\"\nmax_connections = 2\n";
    let toml = harness::config_toml_with(&mock.base_url(), server, "", "");
    let env = harness::start_toml(mock, &toml).await;
    let (mut older, older_gate) = connect(&env).await;
    assert_eq!(ask(&mut older).await, 200);
    let (mut newer, newer_gate) = connect(&env).await;
    assert_eq!(ask(&mut newer).await, 200);
    // Both stop reading: neither will answer a GOAWAY's PING.
    set_frozen(&older_gate, true);
    set_frozen(&newer_gate, true);

    let caller = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = caller
        .post(env.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(BODY)
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("a new caller is served within the evicted connection's short grace");
    assert_eq!(resp.status(), 200);

    // Only one connection was closed for the one peer: the other, reading again, takes a
    // new request (after a GOAWAY its client would refuse to open the stream).
    set_frozen(&newer_gate, false);
    assert_eq!(ask(&mut newer).await, 200);
    drop(older);
}
