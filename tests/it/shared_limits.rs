//! Rate limits shared through Redis: two legate replicas against one real `redis-server` enforce
//! one combined limit, keep serving on local buckets while Redis is down (and say so), and share
//! again once it is back. Needs `redis-server` on the PATH: without it these tests fail under
//! `CI` and are skipped (with a line on stderr) elsewhere.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::harness::{self, Env};

const BODY: &str =
    r#"{"model":"claude-t","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

/// A `redis-server` child on a loopback port, killed when dropped.
pub(crate) struct Redis {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Redis {
    /// None when redis-server is not installed and this is not CI.
    pub(crate) async fn start() -> Option<Self> {
        if !redis_installed().await {
            return None;
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let child = spawn(port, dir.path()).await;
        Some(Redis { child, port, dir })
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub(crate) async fn stop(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// A fresh, empty server on the same port.
    pub(crate) async fn restart(&mut self) {
        self.child = spawn(self.port, self.dir.path()).await;
    }
}

/// Whether `redis-server` is on the PATH; under `CI` it must be.
pub(crate) async fn redis_installed() -> bool {
    let installed = Command::new("redis-server")
        .arg("--version")
        .output()
        .await
        .is_ok();
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "redis-server is not installed: `apt-get install -y redis-server` in .ci/run"
        );
        eprintln!("redis-server is not installed: skipping the Redis tests");
    }
    installed
}

async fn spawn(port: u16, dir: &Path) -> Child {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server starts");
    for _ in 0..200 {
        assert!(child.try_wait().unwrap().is_none(), "redis-server exited");
        if pong(port).await {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("redis-server did not answer PING within 5 s");
}

async fn pong(port: u16) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let mut buf = [0u8; 5];
    s.write_all(b"PING\r\n").await.is_ok()
        && s.read_exact(&mut buf).await.is_ok()
        && &buf == b"+PONG"
}

/// A legate replica using `redis` for its buckets, with its own mock provider.
async fn replica(redis: &Redis, tenant: &str, script: &str) -> Env {
    let mock = harness::start_mock(legate::mock::Script::from_json(script).unwrap()).await;
    let extra = format!(
        "[ratelimit]\nstore = \"redis\"\nredis_url = \"{}\"\n[tenants.default]\n{tenant}\n",
        redis.url()
    );
    let toml = harness::config_toml_with(&mock.base_url(), "", "", &extra);
    harness::start_toml(mock, &toml).await
}

async fn degraded(env: &Env) -> (Option<f64>, bool) {
    let gauge = env.metric("legate_ratelimit_store_degraded", &[]).await;
    let state: serde_json::Value = env.admin_json("/admin/state").await;
    let flag = state["buckets"]["degraded"]
        .as_bool()
        .expect("/admin/state has buckets.degraded");
    (gauge, flag)
}

async fn assert_rate_limited(resp: reqwest::Response) {
    assert_eq!(resp.status(), 429);
    let h = resp.headers().clone();
    assert!(
        h.get("x-should-retry").is_none(),
        "no upstream attempt was made"
    );
    let ms: u64 = h["retry-after-ms"].to_str().unwrap().parse().unwrap();
    let secs: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    // One request per 15 s at 4/min.
    assert!((1..=15_000).contains(&ms), "{ms}");
    assert_eq!(secs, ms.div_ceil(1000));
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn two_replicas_enforce_one_combined_limit() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let a = replica(&redis, "requests_per_minute = 4", "{}").await;
    let b = replica(&redis, "requests_per_minute = 4", "{}").await;
    for env in [&a, &b, &a, &b] {
        assert_eq!(env.messages(BODY).await.status(), 200);
    }
    assert_rate_limited(a.messages(BODY).await).await;
    assert_rate_limited(b.messages(BODY).await).await;
    for env in [&a, &b] {
        assert_eq!(degraded(env).await, (Some(0.0), false));
        assert_eq!(env.mock.stats().requests, 2);
    }
}

/// Sends requests to `env` until its limiter uses the shared store again (bounded: the limiter
/// retries a lost store once a second).
async fn until_shared_again(env: &Env) {
    for _ in 0..50 {
        let _ = env.messages(BODY).await;
        if degraded(env).await == (Some(0.0), false) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the replica did not go back to the shared store within 5 s");
}

#[tokio::test]
async fn without_redis_replicas_serve_on_local_buckets_and_share_again_when_it_returns() {
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    let a = replica(&redis, "requests_per_minute = 4", "{}").await;
    let b = replica(&redis, "requests_per_minute = 4", "{}").await;
    assert_eq!(a.messages(BODY).await.status(), 200);
    assert_eq!(b.messages(BODY).await.status(), 200);

    redis.stop().await;
    // Each replica now admits up to its own limit from a fresh local bucket: 8 in all.
    for env in [&a, &b] {
        for _ in 0..4 {
            assert_eq!(env.messages(BODY).await.status(), 200);
        }
        assert_rate_limited(env.messages(BODY).await).await;
        assert_eq!(degraded(env).await, (Some(1.0), true));
    }

    redis.restart().await;
    // The first request each replica sends through the restarted (empty) Redis takes one of
    // its 4: two are left for both replicas together.
    until_shared_again(&a).await;
    until_shared_again(&b).await;
    assert_eq!(a.messages(BODY).await.status(), 200);
    assert_eq!(b.messages(BODY).await.status(), 200);
    assert_rate_limited(a.messages(BODY).await).await;
    assert_rate_limited(b.messages(BODY).await).await;
}

#[tokio::test]
async fn a_token_reservation_is_refunded_through_redis() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let usage = r#"{"default":{"usage":{"input_tokens":10,"output_tokens":5}}}"#;
    let a = replica(&redis, "tokens_per_minute = 1000", usage).await;
    let b = replica(&redis, "tokens_per_minute = 1000", usage).await;
    let body =
        r#"{"model":"claude-t","max_tokens":900,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(a.messages(body).await.status(), 200);

    // The reservation (900 + the input estimate) leaves under 100 of 1000 tokens; settling
    // with the 15 used gives the rest back, in the shared bucket.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut available = 0;
    for _ in 0..100 {
        let level: Option<i64> = redis::cmd("HGET")
            .arg("legate:rl:{default}:tok")
            .arg("level")
            .query_async(&mut conn)
            .await
            .unwrap();
        available = level.unwrap_or(0) / 60_000;
        if available >= 900 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(available >= 900, "{available} tokens after settlement");
    // The other replica's request fits only thanks to that refund.
    assert_eq!(b.messages(body).await.status(), 200);
    for env in [&a, &b] {
        assert_eq!(degraded(env).await, (Some(0.0), false));
    }
}

#[tokio::test]
async fn a_budget_held_on_one_replica_holds_it_on_the_other() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    // Each request holds about 1.5 milli-USD (100 output tokens at 15 USD per Mtok) while in
    // flight: two fit in 4, three do not, whichever replica they go through.
    let budget = "daily_budget_usd = \"0.004\"\n[[prices]]\nmodel = \"anthropic:claude-t\"\ninput = \"3\"\noutput = \"15\"";
    let hang = r#"{"default":{"hang":true}}"#;
    let a = replica(&redis, budget, hang).await;
    let b = replica(&redis, budget, hang).await;
    let mut held = Vec::new();
    for env in [&a, &b] {
        let client = reqwest::Client::new();
        let url = env.url("/v1/messages");
        held.push(tokio::spawn(async move {
            let _ = client.post(url).body(BODY).send().await;
        }));
        let seen = async {
            while env.mock.stats().requests == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), seen)
            .await
            .expect("the held request reaches its provider");
    }
    for env in [&a, &b] {
        // Bounded: admitted, it would hang like the others.
        let refused = tokio::time::timeout(Duration::from_secs(10), env.messages(BODY))
            .await
            .expect("refused at once");
        assert_eq!(refused.status(), 429);
        assert_eq!(refused.headers()["retry-after"], "1");
        let v: serde_json::Value = refused.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("held by its requests in flight"),
            "{message}"
        );
        assert_eq!(env.mock.stats().requests, 1);
    }
    // The callers give up: both holds are released in Redis, and the budget serves again.
    for h in held {
        h.abort();
    }
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let released = async {
        loop {
            let members: i64 = redis::cmd("ZCARD")
                .arg("legate:rl:{default}:held")
                .query_async(&mut conn)
                .await
                .unwrap();
            if members == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), released)
        .await
        .expect("the holds are released through Redis");
    let sum: String = redis::cmd("HGET")
        .arg("legate:rl:{default}:spent")
        .arg("held")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(sum, "0");
    a.script(r#"{"default":{"usage":{"input_tokens":10,"output_tokens":100}}}"#);
    assert_eq!(a.messages(BODY).await.status(), 200);
    for env in [&a, &b] {
        assert_eq!(degraded(env).await, (Some(0.0), false));
    }
}
