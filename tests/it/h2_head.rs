//! HEAD over HTTP/2 is GET without the body on both planes (RFC 9110 §9.3.2): hyper's server
//! would send the body, which a strict client refuses as more data than a HEAD answer may have.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::harness;

/// Status, declared length and body bytes of `method path` on one HTTP/2 connection.
async fn over_h2(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String, usize) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1{path}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let length = resp.headers()["content-length"]
        .to_str()
        .unwrap()
        .to_owned();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, length, body.len())
}

#[tokio::test]
async fn head_over_http2_sends_the_headers_without_the_body() {
    let env = harness::start("").await;
    for (addr, path) in [
        (env.legate.data_addr, "/v1/models"),
        (env.legate.admin_addr, "/healthz"),
        (env.legate.admin_addr, "/metrics"),
    ] {
        let (status, length, body) = over_h2(addr, "GET", path).await;
        assert_eq!(status, 200, "GET {path}");
        assert!(body > 0, "GET {path}");
        let (status, head_length, head_body) = over_h2(addr, "HEAD", path).await;
        assert_eq!(status, 200, "HEAD {path}");
        assert_eq!(head_body, 0, "HEAD {path}");
        if path != "/metrics" {
            // The metrics change between the two calls; the others answer the same bytes.
            assert_eq!(head_length, length, "HEAD {path}");
            assert_eq!(head_length, body.to_string(), "HEAD {path}");
        }
    }
    assert_eq!(env.mock.stats().requests, 0);
}
