//! Request bodies count against one global bound while they are read and held (SPEC §14:
//! `max_buffered_bytes`): beyond it new requests are shed with 529, and the share comes back
//! when a request is done.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness;

fn body_of(len: usize) -> String {
    let head = r#"{"model":"claude-b","max_tokens":8,"messages":[{"role":"user","content":""#;
    let tail = r#""}]}"#;
    format!("{head}{}{tail}", "a".repeat(len - head.len() - tail.len()))
}

#[tokio::test]
async fn bodies_beyond_max_buffered_bytes_are_shed_with_529_until_the_share_comes_back() {
    let mock = harness::start_mock(legate::mock::Script::default()).await;
    let toml = harness::config_toml_with(&mock.base_url(), "max_buffered_bytes = 100000\n", "", "");
    let env = harness::start_toml(mock, &toml).await;

    // A slow upload declares 80 kB and sends part of it.
    let big = body_of(80_000);
    let mut slow = tokio::net::TcpStream::connect(env.legate.data_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        big.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&big.as_bytes()[..1000]).await.unwrap();

    // Another 30 kB does not fit beside it: 529 overloaded, nothing sent upstream.
    let small = body_of(30_000);
    let shed = async {
        loop {
            let resp = env.messages(small.clone()).await;
            if resp.status() == 529 {
                return resp;
            }
        }
    };
    let resp = tokio::time::timeout(Duration::from_secs(10), shed)
        .await
        .expect("a request beyond the bound is shed");
    assert!(resp.headers().contains_key("retry-after"));
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");
    let served_before = env.mock.stats().requests;

    // The slow upload completes and is served; its share comes back.
    slow.write_all(&big.as_bytes()[1000..]).await.unwrap();
    let mut answer = Vec::new();
    slow.read_to_end(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    assert_eq!(env.mock.stats().requests, served_before + 1);
    assert_eq!(env.messages(small).await.status(), 200);
    assert_eq!(env.legate.proxy.buffers.used(), 0);
}
