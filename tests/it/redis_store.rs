//! The conversation store in Redis (SPEC §11): a turn kept there is rebuilt for the next one, by
//! a real `redis-server`; and a Redis that answers with more than the store ever writes has its
//! connection dropped before the reply is read whole (SPEC §14: a peer's size never becomes
//! legate's memory).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use legate::mock::Script;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::harness::{self, Env};
use crate::shared_limits::Redis;

const MODELS: &str = r#"
[[models]]
name = "agent"
chain = ["anthropic:claude-x"]
"#;

async fn responses(env: &Env, body: &str) -> reqwest::Response {
    env.http
        .post(env.url("/v1/responses"))
        .header("authorization", "Bearer caller-key")
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

/// `GET url` until it answers 200 (a stored response read back), for at most 5 s; every other
/// answer meanwhile must be `other`.
async fn read_back(http: &reqwest::Client, url: &str, other: u16) -> Option<Value> {
    for _ in 0..200 {
        let got = http.get(url).send().await.unwrap();
        if got.status() == 200 {
            return Some(got.json().await.unwrap());
        }
        assert_eq!(got.status(), other, "{url}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// A turn relayed with 200; its response id.
async fn turn(env: &Env, body: &str) -> String {
    let resp = responses(env, body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    v["id"].as_str().unwrap().to_owned()
}

/// legate with the Redis store at `url`, before a mock answering two turns about the weather.
async fn two_turns(url: &str) -> Env {
    let script = r#"{"replies":[
        {"content":[{"type":"text","text":"Oslo is wet."}]},
        {"content":[{"type":"text","text":"Bergen is wetter."}]}]}"#;
    harness::start_with(Script::from_json(script).unwrap(), &store_at(url, 1 << 20)).await
}

fn store_at(url: &str, max_bytes: usize) -> String {
    format!(
        "{MODELS}\n[ratelimit]\nredis_url = \"{url}\"\n[responses]\nstore = \"redis\"\nmax_bytes = {max_bytes}\n"
    )
}

#[tokio::test]
async fn a_turn_kept_in_redis_is_rebuilt_for_the_next_one() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let env = two_turns(&redis.url()).await;
    let id = turn(&env, r#"{"model":"agent","input":"Oslo?"}"#).await;
    // The entry is written behind the answer: wait until Redis holds it.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("legate:resp:{id}");
    let mut kept = false;
    for _ in 0..200 {
        let n: u64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if n == 1 {
            kept = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(kept, "the first turn was not written to Redis within 5 s");
    let body =
        format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"And Bergen?"}}"#);
    let second = responses(&env, &body).await;
    assert_eq!(second.status(), 200);
    let second: Value = second.json().await.unwrap();
    assert_eq!(
        second["output"][0]["content"][0]["text"],
        "Bergen is wetter."
    );
    let sent: Value = serde_json::from_slice(&env.mock.requests()[1].body).unwrap();
    let msgs = sent["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{sent}");
    assert_eq!(msgs[0]["content"][0]["text"], "Oslo?");
    assert!(msgs[1].to_string().contains("Oslo is wet."), "{sent}");
    // And the stored response is read back from Redis.
    let got = harness::get_json(&env.url(&format!("/v1/responses/{id}"))).await;
    assert_eq!(got["output"][0]["content"][0]["text"], "Oslo is wet.");
}

/// Redis down: a turn relayed meanwhile is kept in legate's own memory, so the next turn is
/// rebuilt from it, and it is still found once Redis is back (empty).
#[tokio::test]
async fn a_turn_relayed_while_redis_is_down_is_kept_and_rebuilt() {
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    let env = two_turns(&redis.url()).await;
    redis.stop().await;
    let id = turn(&env, r#"{"model":"agent","input":"Oslo?"}"#).await;
    // The write fails behind the answer (the store is down meanwhile: 503).
    let url = env.url(&format!("/v1/responses/{id}"));
    assert!(
        read_back(&env.http, &url, 503).await.is_some(),
        "the turn was not kept within 5 s"
    );
    let body =
        format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"And Bergen?"}}"#);
    let second = responses(&env, &body).await;
    assert_eq!(second.status(), 200);
    let sent: Value = serde_json::from_slice(&env.mock.requests()[1].body).unwrap();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 3, "{sent}");
    // Back, and empty: the entry kept here is still found.
    redis.restart().await;
    let got = env
        .http
        .get(env.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
}

/// Reads one command (an array of bulk strings) and returns its name; None at the end.
async fn command<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Option<String> {
    let mut line = String::new();
    r.read_line(&mut line).await.ok().filter(|&n| n > 0)?;
    let count: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut name = None;
    for _ in 0..count {
        line.clear();
        r.read_line(&mut line).await.ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0u8; len + 2];
        r.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        name.get_or_insert_with(|| String::from_utf8_lossy(&arg).to_uppercase());
    }
    name
}

/// A stand-in Redis that says `+OK` to everything but `GET`, which it answers with a bulk
/// string declared 1 GiB long, written as fast as the socket takes it (for at most 256 MiB or
/// 3 s). Counts the bytes of those answers the socket took, and says when it stopped writing
/// one (the connection closed, or the limits reached).
async fn huge_replies() -> (u16, Arc<AtomicU64>, mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let taken = Arc::new(AtomicU64::new(0));
    let count = taken.clone();
    let (stopped, stops) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let count = count.clone();
            let stopped = stopped.clone();
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut r = BufReader::new(r);
                while let Some(name) = command(&mut r).await {
                    if name != "GET" {
                        if w.write_all(b"+OK\r\n").await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let chunk = vec![b'A'; 1 << 20];
                    let _ = w.write_all(b"$1073741824\r\n").await;
                    let until = tokio::time::Instant::now() + Duration::from_secs(3);
                    for _ in 0..256 {
                        let wrote = tokio::time::timeout_at(until, w.write_all(&chunk)).await;
                        if !matches!(wrote, Ok(Ok(()))) {
                            break;
                        }
                        count.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                    }
                    let _ = stopped.send(());
                    return;
                }
            });
        }
    });
    (port, taken, stops)
}

#[tokio::test]
async fn a_redis_reply_larger_than_the_store_writes_is_refused_unread() {
    let (port, taken, mut stops) = huge_replies().await;
    let env = harness::start_with(
        Script::default(),
        &store_at(&format!("redis://127.0.0.1:{port}/0"), 1 << 20),
    )
    .await;
    let body = r#"{"model":"agent","previous_response_id":"resp_earlier","input":"hi"}"#;
    let resp = responses(&env, body).await;
    assert_eq!(resp.status(), 503);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(
        err["error"]["code"], "conversation_store_unavailable",
        "{err}"
    );
    assert!(env.mock.requests().is_empty());
    tokio::time::timeout(Duration::from_secs(10), stops.recv())
        .await
        .expect("the stand-in stops writing within 10 s");
    // A reply refused for its size is an answer, not an outage: the next lookup connects again
    // at once (no pause), and meets the same refusal; so does the one after two lookups on
    // one connection, of which only one is told the reply's size (the other sees the
    // connection closed).
    for together in [1, 2, 1] {
        let lookups = (0..together).map(|_| responses(&env, body));
        for resp in futures_util::future::join_all(lookups).await {
            assert_eq!(resp.status(), 503);
        }
        tokio::time::timeout(Duration::from_secs(10), stops.recv())
            .await
            .expect("the lookup asked Redis again");
    }
    // What the kernel's socket buffers took, not the reply: legate stopped at its header.
    let taken = taken.load(Ordering::SeqCst);
    assert!(
        taken < 32 << 20,
        "legate took {} MiB of a reply declared 1 GiB",
        taken >> 20
    );
    // legate keeps serving.
    let resp = responses(&env, r#"{"model":"agent","input":"hi"}"#).await;
    assert_eq!(resp.status(), 200);
}

/// `rediss://`: a real `redis-server` serving TLS only, under a certificate of a private CA
/// that the real binary trusts through `SSL_CERT_FILE` (the system roots' override, which both
/// Redis stores honour): the rate limiter uses it (not degraded) and a conversation kept there
/// is read back.
#[tokio::test]
async fn both_stores_reach_redis_over_tls() {
    if !crate::shared_limits::redis_installed().await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut redis = tokio::process::Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--tls-auth-clients", "no"])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server starts");
    let mut listening = false;
    for _ in 0..200 {
        assert!(redis.try_wait().unwrap().is_none(), "redis-server exited");
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            listening = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(listening, "redis-server did not listen within 5 s");

    let (_mock, mock_url) = harness::spawn_mock(&[]).await;
    let extra = format!(
        "{MODELS}\n[tenants.default]\nrequests_per_minute = 1000\n\n[ratelimit]\nstore = \"redis\"\nredis_url = \"rediss://localhost:{port}/0\"\n\n[responses]\nstore = \"redis\"\n"
    );
    let cfg = crate::binary::write_config(dir.path(), &mock_url, &extra);
    let ca = cert.display().to_string();
    let (_legate, line) = harness::spawn(
        &["serve", "--config", cfg.to_str().unwrap()],
        &[
            ("SSL_CERT_FILE", &ca),
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
            ("OPENAI_API_KEY", "sk-test"),
        ],
        None,
    )
    .await;
    let (data, admin) = harness::addrs(&line);
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{data}/v1/responses"))
        .header("content-type", "application/json")
        .body(r#"{"model":"agent","input":"hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The entry is written behind the answer (over TLS): poll Redis itself for it, over TLS.
    let mut written = false;
    for _ in 0..200 {
        let out = tokio::process::Command::new("redis-cli")
            .args([
                "--tls",
                "--cacert",
                &ca,
                "-h",
                "localhost",
                "-p",
                &port.to_string(),
            ])
            .args(["EXISTS", &format!("legate:resp:{id}")])
            .output()
            .await
            .expect("redis-cli runs");
        if String::from_utf8_lossy(&out.stdout).trim() == "1" {
            written = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(written, "the entry was not written to Redis within 5 s");
    // And read back from there.
    let next = format!(r#"{{"model":"agent","previous_response_id":"{id}","input":"more"}}"#);
    let resp = http
        .post(format!("{data}/v1/responses"))
        .header("content-type", "application/json")
        .body(next)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let metrics = http
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        harness::metric_value(&metrics, "legate_ratelimit_store_degraded", &[]),
        Some(0.0),
        "the rate limiter reached Redis over TLS"
    );
}

/// A Redis that stops reading in the middle of a large write: once the write has failed (the
/// entry is then kept in legate's memory), legate lets go of the connection, socket and
/// unwritten bytes included, instead of leaving its writer blocked on it for good.
#[tokio::test]
async fn a_write_to_a_redis_that_stops_reading_is_given_up_with_its_connection() {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    // Accepted sockets inherit it: the kernel takes little of what legate writes.
    sock.set_recv_buffer_size(4096).unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = sock.local_addr().unwrap().port();
    let listener = sock.listen(8).unwrap();
    let (resume, resumed) = tokio::sync::oneshot::channel::<()>();
    let (closed, mut closes) = mpsc::unbounded_channel::<u64>();
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        let (r, mut w) = sock.into_split();
        let mut r = BufReader::new(r);
        // The set-up's commands are answered; the first line of a SET stops the reading.
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line.starts_with('*') {
                let mut name = String::new();
                r.read_line(&mut name).await.unwrap();
                name.clear();
                r.read_line(&mut name).await.unwrap();
                if name.trim() == "SET" {
                    break;
                }
                // The rest of a short command, then +OK.
                let n: usize = line.trim()[1..].parse().unwrap();
                for _ in 1..n {
                    let mut l = String::new();
                    r.read_line(&mut l).await.unwrap();
                    l.clear();
                    r.read_line(&mut l).await.unwrap();
                }
                w.write_all(b"+OK\r\n").await.unwrap();
            }
        }
        let _ = resumed.await;
        let mut drained = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n as u64,
            }
        }
        let _ = closed.send(drained);
    });
    let env = harness::start_with(
        Script::default(),
        &store_at(&format!("redis://127.0.0.1:{port}/0"), 64 << 20),
    )
    .await;
    let input = "x".repeat(8 << 20);
    let id = turn(
        &env,
        &serde_json::json!({"model": "agent", "input": input}).to_string(),
    )
    .await;
    // The write fails (its timeout) behind the answer; the entry is then found in memory.
    let url = env.url(&format!("/v1/responses/{id}"));
    assert!(
        read_back(&env.http, &url, 503).await.is_some(),
        "the entry was not kept within 5 s"
    );
    // Now read: what the kernel held, then the end of the connection.
    resume.send(()).unwrap();
    let drained = tokio::time::timeout(Duration::from_secs(10), closes.recv())
        .await
        .expect("legate closed the connection within 10 s")
        .unwrap();
    assert!(drained < 8 << 20, "{drained} bytes: the write went on");
}

/// An entry whose background write is not answered yet is found by a lookup that Redis answers
/// with a miss, or cannot answer: an agent's next turn, sent as soon as it has the answer,
/// does not race its own write.
#[tokio::test]
async fn an_entry_being_written_is_found_before_redis_holds_it() {
    use legate::responses::store::{RedisConversations, Stored};
    let Some(redis) = Redis::start().await else {
        return;
    };
    let entry = Stored {
        input: vec![serde_json::json!({"role": "user", "content": "Oslo?"})],
        response: serde_json::json!({"id": "resp_w", "output": []}),
        passthrough: false,
        provider: String::new(),
        owner: "team-a".to_owned(),
    };
    let bytes: Arc<[u8]> = Arc::from(serde_json::to_vec(&entry).unwrap());
    // A Redis that answers, and one that cannot be reached (a port nothing listens on).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("redis://127.0.0.1:{}/0", l.local_addr().unwrap().port())
    };
    for url in [redis.url(), closed] {
        let store = RedisConversations::new(&url, Duration::from_secs(60), 1 << 20).unwrap();
        let before = store.get("resp_w").await;
        assert!(matches!(before, Ok(None) | Err(_)), "{url}");
        store.will_write("resp_w", bytes.clone());
        assert_eq!(
            store.get("resp_w").await.ok().flatten(),
            Some(entry.clone()),
            "{url}"
        );
    }
    // Once written, Redis answers for it, and the copy is gone.
    let store = RedisConversations::new(&redis.url(), Duration::from_secs(60), 1 << 20).unwrap();
    store.will_write("resp_w", bytes.clone());
    store
        .put_serialised("resp_w", bytes.to_vec())
        .await
        .unwrap();
    assert_eq!(store.get("resp_w").await.unwrap(), Some(entry));
    assert!(store.delete("resp_w").await.unwrap());
    assert_eq!(store.get("resp_w").await.unwrap(), None);
}

/// A DELETE answered while the entry's write is on its way (on another connection, so Redis
/// may run the write after the DEL) deletes what the write leaves too: the deleted response
/// came back, with its full TTL, readable and continuable.
#[tokio::test]
async fn a_delete_during_the_entrys_write_is_not_undone_by_it() {
    use legate::responses::store::{RedisConversations, Stored};
    let Some(redis) = Redis::start().await else {
        return;
    };
    let entry = Stored {
        input: vec![serde_json::json!({"role": "user", "content": "Oslo?"})],
        response: serde_json::json!({"id": "resp_d", "output": []}),
        passthrough: false,
        provider: String::new(),
        owner: "team-a".to_owned(),
    };
    let bytes: Arc<[u8]> = Arc::from(serde_json::to_vec(&entry).unwrap());
    let store = RedisConversations::new(&redis.url(), Duration::from_secs(60), 1 << 20).unwrap();
    store.will_write("resp_d", bytes.clone());
    // The DELETE reaches Redis first; the write after it.
    assert!(store.delete("resp_d").await.unwrap());
    store
        .put_serialised("resp_d", bytes.to_vec())
        .await
        .unwrap();
    assert_eq!(store.get("resp_d").await.unwrap(), None);
    // A write no DELETE overtook stays.
    store.will_write("resp_e", bytes.clone());
    store
        .put_serialised("resp_e", bytes.to_vec())
        .await
        .unwrap();
    assert_eq!(store.get("resp_e").await.unwrap(), Some(entry));
}
