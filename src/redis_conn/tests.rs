use super::*;

/// A stand-in Redis: `GET big` is answered with 5,000 bytes, any other `GET` with one, every
/// other command with `+OK`.
async fn stand_in() -> u16 {
    test_server::stand_in(|args| {
        let reply = match (&args[0][..], args.get(1).map(Vec::as_slice)) {
            (b"GET", Some(b"big")) => format!("$5000\r\n{}\r\n", "b".repeat(5000)),
            (b"GET", _) => "$1\r\nx\r\n".to_string(),
            _ => "+OK\r\n".to_string(),
        };
        Some(reply.into_bytes())
    })
    .await
}

/// Only one of the calls waiting on a connection is given the size error; the others see the
/// connection closed, and whichever reaches `reset` first must not pause the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_refused_for_its_size_never_pauses_whoever_reports_it() {
    let port = stand_in().await;
    let client = Client::open(format!("redis://127.0.0.1:{port}/0")).unwrap();
    let conn = Arc::new(LazyConnection::new(&client, Duration::from_secs(2), 1024).unwrap());
    for round in 0..40 {
        let calls = ["big", "small"].map(|key| {
            let conn = conn.clone();
            tokio::spawn(async move {
                let mut leased = conn.get().await.unwrap();
                let got: Result<Option<String>, _> = redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut leased.conn)
                    .await;
                if let Err(e) = &got {
                    conn.reset(&leased, e).await;
                }
                got.is_ok()
            })
        });
        let mut big_failed = false;
        for (i, call) in calls.into_iter().enumerate() {
            let ok = call.await.unwrap();
            if i == 0 {
                big_failed = !ok;
            }
        }
        assert!(big_failed, "round {round}: the large reply was taken");
        assert!(!conn.paused().await, "round {round}: the store was paused");
    }
    // A small reply alone is taken.
    let mut leased = conn.get().await.unwrap();
    let got: Option<String> = redis::cmd("GET")
        .arg("small")
        .query_async(&mut leased.conn)
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("x"));
}

/// Redis closes a connection while it is idle (its `timeout`, a restart, a proxy between): the
/// next call connects again instead of failing on the dead one and pausing the store.
#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced_before_a_call() {
    use crate::redis_conn::test_server::RedisServer;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let client = Client::open(server.url()).unwrap();
    let conn = LazyConnection::new(&client, Duration::from_secs(2), 1024).unwrap();
    let ping = || async {
        let mut leased = conn.get().await?;
        let got = redis::cmd("PING")
            .query_async::<String>(&mut leased.conn)
            .await;
        if let Err(e) = &got {
            conn.reset(&leased, e).await;
        }
        got
    };
    assert_eq!(ping().await.unwrap(), "PONG");
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let mut ended = false;
    for _ in 0..200 {
        if conn
            .conn
            .lock()
            .await
            .conn
            .as_ref()
            .is_some_and(|(_, d)| d.ended())
        {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        ended,
        "the driver did not see the connection closed within 5 s"
    );
    assert_eq!(ping().await.unwrap(), "PONG");
    assert!(!conn.paused().await);
}
