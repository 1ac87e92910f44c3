//! The Redis store's tests: its failure behaviour needs no Redis; the scripts are checked against
//! a real `redis-server` (skipped when none is installed, unless `CI` is set), by replaying the
//! in-memory store's arithmetic on a pinned clock.

use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::*;
use crate::policy::ratelimit::HELD_WAIT_MS;
use crate::policy::ratelimit::memory::MemoryStore;
use crate::redis_conn::test_server::{RedisServer, free_port};

fn ask(tenant: &str, rpm: u64, tpm: u64, tokens: u64, budget_pico: u128) -> Ask {
    Ask {
        tenant: tenant.to_owned().into(),
        rpm,
        tpm,
        tokens,
        budget_pico,
        hold_pico: 0,
        hold_id: 0,
        hold_ms: 0,
    }
}

fn settlement(tenant: &str, tpm: u64, refund: i64, cost_pico: u128) -> Settlement {
    Settlement {
        tenant: tenant.to_owned().into(),
        tpm,
        refund,
        cost_pico,
        budget_pico: 0,
        rpm: 0,
        request_back: false,
        held_pico: 0,
        hold_id: 0,
        credit_pico: 0,
        credit_day: 0,
        charged_day: None,
    }
}

#[tokio::test]
async fn creating_the_store_does_not_connect_and_calls_fail_fast_while_redis_is_down() {
    let store = RedisStore::new(&format!("redis://127.0.0.1:{}/0", free_port())).unwrap();
    let started = Instant::now();
    let answer = store.admit(&ask("t", 1, 0, 0, 0), Now::wall()).await;
    assert!(answer.is_err(), "{answer:?}");
    assert!(
        store
            .settle(&settlement("t", 10, 5, 0), Now::wall())
            .await
            .is_err()
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_server_that_never_answers_costs_a_call_its_timeouts_not_a_hang() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts connections and keeps them open without a word.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/0")).unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        store.admit(&ask("t", 1, 0, 0, 0), Now::wall()),
    )
    .await;
    assert!(matches!(answer, Ok(Err(_))), "{answer:?}");
    silent.abort();
}

#[test]
fn an_unusable_url_is_refused_without_echoing_it() {
    for url in ["http://user:hunter2@example:6379", "redis://:hunter2@[::1"] {
        match RedisStore::new(url) {
            Err(StoreError(msg)) => assert!(!msg.contains("hunter2"), "{msg}"),
            Ok(_) => panic!("{url} was accepted"),
        }
    }
    assert!(RedisStore::new("redis://:pw@127.0.0.1:6379/2").is_ok());
    assert!(RedisStore::new("rediss://127.0.0.1:6380/0").is_ok());
}

#[test]
fn one_tenants_keys_share_a_hash_tag() {
    assert_eq!(
        Keys::of("team-a"),
        Keys {
            requests: "legate:rl:{team-a}:req".into(),
            tokens: "legate:rl:{team-a}:tok".into(),
            spent: "legate:rl:{team-a}:spent".into(),
            held: "legate:rl:{team-a}:held".into(),
        }
    );
}

#[test]
fn script_arguments_stay_exact_in_lua_doubles_and_int64() {
    let a = Ask {
        hold_pico: u128::MAX,
        hold_id: 0xab,
        hold_ms: u64::MAX,
        ..ask("t", u64::MAX, 5, u64::MAX, u128::MAX)
    };
    let [rpm, tpm, tokens, budget, hold, member, hold_ms] = admit_args(&a);
    assert_eq!((rpm.as_str(), tpm.as_str()), ("100000000000", "5"));
    assert_eq!(tokens, "100000000000");
    // The budget is compared as a decimal string, so it travels whole.
    assert_eq!(budget, u128::MAX.to_string());
    // A hold is clamped so that 1,024 of them fit in int64, and lives at most a day.
    assert_eq!(hold, "9007199254740991");
    assert_eq!(member, "00000000000000ab:9007199254740991");
    assert_eq!(hold_ms, "86400000");
    // Without a budget nothing is held, whatever the estimate.
    let free = Ask {
        budget_pico: 0,
        ..a.clone()
    };
    let [.., hold, member, _] = admit_args(&free);
    assert_eq!((hold.as_str(), member.as_str()), ("0", ""));
    let s = Settlement {
        held_pico: u128::MAX,
        hold_id: 0xab,
        ..settlement("t", 1, i64::MIN, u128::MAX)
    };
    let [_, refund, cost, _, _, held, member] = settle_args(&s);
    assert_eq!(
        (refund.as_str(), cost.as_str()),
        ("-100000000000", "9223372036854775807")
    );
    // The settlement names the member its admission added.
    assert_eq!(
        (held.as_str(), member.as_str()),
        ("9007199254740991", "00000000000000ab:9007199254740991")
    );
    assert!(MAX_SCRIPT_TOKENS as f64 * 60_000.0 * 1.5 < 2f64.powi(53));
}

#[test]
fn script_replies_become_decisions() {
    assert_eq!(decision(0, 0).unwrap(), Decision::Admit);
    let refused = |limit, ms| Decision::Refuse {
        limit,
        retry_after: Duration::from_millis(ms),
    };
    assert_eq!(
        decision(1, 20_000).unwrap(),
        refused(Limit::Requests, 20_000)
    );
    assert_eq!(decision(2, 0).unwrap(), refused(Limit::Tokens, 1));
    assert_eq!(decision(3, 5).unwrap(), refused(Limit::Budget, 5));
    assert_eq!(decision(4, 1000).unwrap(), refused(Limit::BudgetHeld, 1000));
    assert!(decision(7, 1).is_err());
    // A wait no script computes is cut to a day.
    assert_eq!(
        decision(1, i64::MAX).unwrap(),
        refused(Limit::Requests, DAY_MS)
    );
}

/// A running server, a store on it and a runtime to drive it; None when redis-server is not
/// installed (see `RedisServer::start`).
fn store_on_server() -> Option<(RedisServer, RedisStore, tokio::runtime::Runtime)> {
    let server = RedisServer::start()?;
    let redis = RedisStore::new(&server.url()).unwrap();
    Some((server, redis, runtime()))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        tokens: u64,
        hold: u128,
    },
    /// Releases the oldest hold still held, if any, with the rest of the settlement.
    Settle {
        refund: i64,
        cost: u128,
        back: bool,
    },
    Wait {
        ms: u64,
    },
    /// Takes spend back from today (or, `yesterday`, from the day before).
    Credit {
        pico: u128,
        yesterday: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..1_500, prop_oneof![Just(0u128), 1u128..1_500])
            .prop_map(|(tokens, hold)| Op::Admit { tokens, hold }),
        2 => (-800i64..800, 0u128..1_200, any::<bool>())
            .prop_map(|(refund, cost, back)| Op::Settle { refund, cost, back }),
        2 => (0u64..40_000).prop_map(|ms| Op::Wait { ms }),
        1 => (0u128..1_500, any::<bool>())
            .prop_map(|(pico, yesterday)| Op::Credit { pico, yesterday }),
    ]
}

/// The limits, a start time (often just before a UTC midnight), and what happens.
fn scenario() -> impl Strategy<Value = ((u64, u64, u128), u64, Vec<Op>)> {
    let limits = (0u64..6, prop_oneof![Just(0u64), 1u64..2_000], 0u128..3_000);
    let start = prop_oneof![DAY_MS - 90_000..DAY_MS, 0..DAY_MS];
    (limits, start, proptest::collection::vec(op(), 1..40))
}

#[test]
fn the_scripts_decide_exactly_as_the_memory_store() {
    let Some((_server, redis, rt)) = store_on_server() else {
        return;
    };
    let case = std::sync::atomic::AtomicU32::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let outcome = runner.run(&scenario(), |((rpm, tpm, budget), start, ops)| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tenant = format!("case-{n}");
        let memory = MemoryStore::default();
        let mut now = Now {
            ms: 20_000 * DAY_MS + start,
        };
        // memory.rs settles only tenants it has seen: begin with an admission.
        let opening = Op::Admit { tokens: 1, hold: 0 };
        // Holds taken and not yet settled, oldest first: (name, pico-USD).
        let mut held = std::collections::VecDeque::new();
        for (i, op) in std::iter::once(&opening).chain(&ops).enumerate() {
            redis.pin_clock(now.ms);
            match *op {
                Op::Admit { tokens, hold } => {
                    // Holds outlive every scenario here (memory.rs never lets one lapse).
                    let a = Ask {
                        hold_pico: hold,
                        hold_id: i as u64,
                        hold_ms: DAY_MS,
                        ..ask(&tenant, rpm, tpm, tokens, budget)
                    };
                    let expected = memory.admit_now(&a, now).unwrap();
                    let got = rt.block_on(redis.admit(&a, now)).unwrap();
                    prop_assert_eq!(got, expected, "step {}: {:?}", i, op);
                    if got == Decision::Admit && a.held() > 0 {
                        held.push_back((a.hold_id, a.held()));
                    }
                }
                Op::Settle { refund, cost, back } => {
                    let (hold_id, held_pico) = held.pop_front().unwrap_or((0, 0));
                    let s = Settlement {
                        rpm,
                        request_back: back,
                        held_pico,
                        hold_id,
                        ..settlement(&tenant, tpm, refund, cost)
                    };
                    memory.settle_now(&s, now);
                    rt.block_on(redis.settle(&s, now)).unwrap();
                }
                Op::Wait { ms } => now.ms += ms,
                Op::Credit { pico, yesterday } => {
                    let s = Settlement {
                        credit_pico: pico,
                        credit_day: now.day() - u64::from(yesterday),
                        ..settlement(&tenant, tpm, 0, 0)
                    };
                    memory.settle_now(&s, now);
                    rt.block_on(redis.settle(&s, now)).unwrap();
                }
            }
        }
        // What both hold at the end, not only what they decided on the way: the holds, and
        // the day's spend (credits included).
        let spent = memory.snapshot(now)[tenant.as_str()]["spent_today_pico_usd"].clone();
        let shared: Option<String> = rt.block_on(redis.spent_today(&tenant, now));
        prop_assert_eq!(
            spent,
            serde_json::json!(shared.unwrap_or_else(|| "0".into()))
        );
        let local = memory.snapshot(now)[tenant.as_str()]["held_pico_usd"].clone();
        let shared: Option<String> = rt.block_on(redis.held_sum(&tenant));
        let shared = shared.filter(|s| s != "0").unwrap_or_else(|| "0".into());
        prop_assert_eq!(local, serde_json::json!(shared));
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

/// The settlement script answers the day it charged a cost to, by the server's clock (here
/// pinned a day behind legate's), and none when there was no cost: a later credit of a kept
/// estimate is taken from that day.
#[test]
fn a_settlement_answers_the_day_its_cost_went_to_by_the_servers_clock() {
    let Some((_server, redis, rt)) = store_on_server() else {
        return;
    };
    let wall = Now::wall();
    let server_day = wall.day() - 1;
    redis.pin_clock(server_day * DAY_MS + 5_000);
    rt.block_on(async {
        let charged = redis.settle(&settlement("day", 0, 0, 1_000), wall).await;
        assert_eq!(charged.unwrap(), Some(server_day));
        let nothing = redis.settle(&settlement("day", 0, 0, 0), wall).await;
        assert_eq!(nothing.unwrap(), None);
    });
}

#[test]
fn a_credit_lowers_only_the_day_it_was_charged_to_and_never_below_zero() {
    let Some((_server, redis, rt)) = store_on_server() else {
        return;
    };
    let memory = MemoryStore::default();
    let now = Now {
        ms: 20_000 * DAY_MS + 1_000,
    };
    redis.pin_clock(now.ms);
    let credit = |pico, day| Settlement {
        credit_pico: pico,
        credit_day: day,
        ..settlement("credit", 0, 0, 0)
    };
    // Spent 1,000 of a budget of 1,000: refused by both stores.
    let admit = ask("credit", 0, 0, 0, 1_000);
    let spend = settlement("credit", 0, 0, 1_000);
    let budget = |d: Decision| {
        matches!(
            d,
            Decision::Refuse {
                limit: Limit::Budget,
                ..
            }
        )
    };
    rt.block_on(async {
        assert_eq!(redis.admit(&admit, now).await.unwrap(), Decision::Admit);
        memory.admit_now(&admit, now).unwrap();
        redis.settle(&spend, now).await.unwrap();
        memory.settle_now(&spend, now);
        assert!(budget(redis.admit(&admit, now).await.unwrap()));
        assert!(budget(memory.admit_now(&admit, now).unwrap()));
        // Another day's credit takes nothing from today's spend.
        redis
            .settle(&credit(400, now.day() - 1), now)
            .await
            .unwrap();
        memory.settle_now(&credit(400, now.day() - 1), now);
        assert!(budget(redis.admit(&admit, now).await.unwrap()));
        assert!(budget(memory.admit_now(&admit, now).unwrap()));
        // Today's does: 600 spent.
        redis.settle(&credit(400, now.day()), now).await.unwrap();
        memory.settle_now(&credit(400, now.day()), now);
        let spent = |v: serde_json::Value| v["credit"]["spent_today_pico_usd"].clone();
        assert_eq!(spent(memory.snapshot(now)), "600");
        assert_eq!(redis.admit(&admit, now).await.unwrap(), Decision::Admit);
        // More than was spent leaves nothing, not a negative spend.
        redis.settle(&credit(5_000, now.day()), now).await.unwrap();
        memory.settle_now(&credit(5_000, now.day()), now);
        assert_eq!(spent(memory.snapshot(now)), "0");
        assert_eq!(redis.spent_today("credit", now).await.as_deref(), Some("0"));
        // A spend that saturated says nothing of what was charged: no credit comes off it.
        redis
            .settle(&settlement("credit", 0, 0, u128::MAX), now)
            .await
            .unwrap();
        redis.settle(&credit(5_000, now.day()), now).await.unwrap();
        let saturated = i64::MAX.to_string();
        assert_eq!(
            redis.spent_today("credit", now).await.as_deref(),
            Some(saturated.as_str())
        );
    });
}

#[test]
fn the_server_clock_sets_the_budget_wait_and_spend_saturates_at_int64() {
    let Some((_server, redis, rt)) = store_on_server() else {
        return;
    };
    let cap = i64::MAX as u128;
    rt.block_on(async {
        let s = settlement("rich", 0, 0, u128::MAX);
        redis.settle(&s, Now::wall()).await.unwrap();
        redis.settle(&s, Now::wall()).await.unwrap();
        // A budget above the int64 cap is never reached; one at it is.
        let above = redis
            .admit(&ask("rich", 0, 0, 0, cap + 1), Now::wall())
            .await;
        assert_eq!(above.unwrap(), Decision::Admit);
        let at = redis.admit(&ask("rich", 0, 0, 0, cap), Now::wall()).await;
        let Ok(Decision::Refuse {
            limit: Limit::Budget,
            retry_after,
        }) = at
        else {
            panic!("{at:?}");
        };
        // This server runs on this machine's clock.
        let expected = Now::wall().until_midnight().as_millis() as i128;
        assert!(
            (retry_after.as_millis() as i128 - expected).abs() < 5_000,
            "{retry_after:?}"
        );
    });
}

#[test]
fn a_hold_whose_settlement_never_comes_lapses_and_is_taken_off_once() {
    let Some((server, redis, rt)) = store_on_server() else {
        return;
    };
    let client = Client::open(server.url()).unwrap();
    let t0 = 20_000 * DAY_MS + 1_000;
    let hold = |id, ms| Ask {
        hold_pico: 600,
        hold_id: id,
        hold_ms: ms,
        ..ask("lapse", 0, 0, 0, 1_000)
    };
    let held_sum = || {
        let client = client.clone();
        async move {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let sum: String = redis::cmd("HGET")
                .arg("legate:rl:{lapse}:spent")
                .arg("held")
                .query_async(&mut conn)
                .await
                .unwrap();
            let members: i64 = redis::cmd("ZCARD")
                .arg("legate:rl:{lapse}:held")
                .query_async(&mut conn)
                .await
                .unwrap();
            (sum, members)
        }
    };
    rt.block_on(async {
        redis.pin_clock(t0);
        // The first is admitted alone; its settlement is never sent (a replica gone).
        assert_eq!(
            redis.admit(&hold(1, 5_000), Now::wall()).await.unwrap(),
            Decision::Admit
        );
        assert_eq!(held_sum().await, ("600".to_string(), 1));
        redis.pin_clock(t0 + 4_999);
        assert_eq!(
            redis.admit(&hold(2, 5_000), Now::wall()).await.unwrap(),
            Decision::Refuse {
                limit: Limit::BudgetHeld,
                retry_after: Duration::from_millis(HELD_WAIT_MS),
            }
        );
        // Lapsed: dropped by this admission, which then holds alone.
        redis.pin_clock(t0 + 5_000);
        assert_eq!(
            redis.admit(&hold(3, 5_000), Now::wall()).await.unwrap(),
            Decision::Admit
        );
        assert_eq!(held_sum().await, ("600".to_string(), 1));
        // The lapsed hold's late settlement takes nothing off a second time.
        let late = Settlement {
            held_pico: 600,
            hold_id: 1,
            ..settlement("lapse", 0, 0, 0)
        };
        redis.settle(&late, Now::wall()).await.unwrap();
        assert_eq!(held_sum().await, ("600".to_string(), 1));
        let on_time = Settlement {
            held_pico: 600,
            hold_id: 3,
            ..settlement("lapse", 0, 0, 250)
        };
        redis.settle(&on_time, Now::wall()).await.unwrap();
        assert_eq!(held_sum().await, ("0".to_string(), 0));
    });
}

#[test]
fn holds_whose_set_is_gone_hold_nothing_and_the_set_lives_as_long_as_the_sum() {
    let Some((server, redis, rt)) = store_on_server() else {
        return;
    };
    let client = Client::open(server.url()).unwrap();
    let hold = |id| Ask {
        hold_pico: 600,
        hold_id: id,
        hold_ms: 60_000,
        ..ask("gone", 0, 0, 0, 1_000)
    };
    rt.block_on(async {
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        assert_eq!(
            redis.admit(&hold(1), Now::wall()).await.unwrap(),
            Decision::Admit
        );
        // Both keys expire together, two days on: the set never goes before its sum.
        for key in ["legate:rl:{gone}:held", "legate:rl:{gone}:spent"] {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(pttl > 2 * DAY_MS as i64 - 60_000, "{key}: {pttl}");
        }
        // The set evicted (maxmemory) with its hold never settled: the sum says 600, but no
        // member holds anything, so the next request is admitted alone.
        let _: i64 = redis::cmd("DEL")
            .arg("legate:rl:{gone}:held")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            redis.admit(&hold(2), Now::wall()).await.unwrap(),
            Decision::Admit
        );
        let sum: String = redis::cmd("HGET")
            .arg("legate:rl:{gone}:spent")
            .arg("held")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(sum, "600");
    });
}

/// A bucket whose time is ahead of the server's clock (the clock stepped back, or the key was
/// written wrong) refills from the clock's time, and one holding what is no number (`nan`,
/// `inf`) is a new bucket: the first froze its tenant while it kept retrying, the second
/// failed every later call at PEXPIRE.
#[test]
fn a_bucket_ahead_of_the_clock_or_not_a_number_does_not_lock_its_tenant_out() {
    let Some((server, redis, rt)) = store_on_server() else {
        return;
    };
    let client = Client::open(server.url()).unwrap();
    let now = 20_000 * DAY_MS;
    rt.block_on(async {
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let write = |key: &'static str, level: &'static str, last: &'static str| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("HSET")
                    .arg(key)
                    .arg("level")
                    .arg(level)
                    .arg("last_ms")
                    .arg(last)
                    .query_async::<i64>(&mut conn)
                    .await
                    .unwrap()
            }
        };
        write("legate:rl:{ahead}:req", "0", "99999999999999").await;
        redis.pin_clock(now);
        let first = redis
            .admit(&ask("ahead", 60, 0, 0, 0), Now { ms: now })
            .await;
        assert!(matches!(first, Ok(Decision::Refuse { .. })), "{first:?}");
        // One request of 60/min is there a second later.
        redis.pin_clock(now + 1_000);
        let later = redis
            .admit(&ask("ahead", 60, 0, 0, 0), Now { ms: now + 1_000 })
            .await;
        assert_eq!(later.unwrap(), Decision::Admit);
        for (tenant, key, level) in [
            ("nan", "legate:rl:{nan}:req", "nan"),
            ("inf", "legate:rl:{inf}:req", "-inf"),
        ] {
            write(key, level, "1000").await;
            let got = redis
                .admit(&ask(tenant, 60, 0, 0, 0), Now { ms: now + 1_000 })
                .await;
            assert_eq!(got.unwrap(), Decision::Admit, "{tenant}");
        }
        let _ = &mut conn;
    });
}

#[test]
fn buckets_expire_once_they_would_be_full_and_spend_after_two_days() {
    let Some((server, redis, rt)) = store_on_server() else {
        return;
    };
    let client = Client::open(server.url()).unwrap();
    rt.block_on(async {
        redis
            .admit(&ask("ttl", 60, 10, 0, 0), Now::wall())
            .await
            .unwrap();
        // A debit of 100 tokens at 10/min: the bucket is full again in 600 s.
        let owed = settlement("ttl", 10, -100, 7);
        redis.settle(&owed, Now::wall()).await.unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let pttl = |key: &'static str| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("PTTL")
                    .arg(key)
                    .query_async::<i64>(&mut conn)
                    .await
                    .unwrap()
            }
        };
        // One request of 60/min is refilled in 1 s, plus the idle minute.
        let req = pttl("legate:rl:{ttl}:req").await;
        assert!((59_000..=61_000).contains(&req), "{req}");
        let tok = pttl("legate:rl:{ttl}:tok").await;
        assert!((658_000..=660_000).contains(&tok), "{tok}");
        let spent = pttl("legate:rl:{ttl}:spent").await;
        assert!(
            (2 * DAY_MS as i64 - 5_000..=2 * DAY_MS as i64).contains(&spent),
            "{spent}"
        );
        let pico: String = redis::cmd("HGET")
            .arg("legate:rl:{ttl}:spent")
            .arg("pico")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(pico, "7");
    });
}

#[test]
fn after_redis_restarts_the_next_call_reconnects() {
    let Some((server, redis, rt)) = store_on_server() else {
        return;
    };
    let port = server.port;
    let a = ask("back", 3, 0, 0, 0);
    rt.block_on(async {
        assert_eq!(redis.admit(&a, Now::wall()).await.unwrap(), Decision::Admit);
        drop(server);
        assert!(redis.admit(&a, Now::wall()).await.is_err());
        // The broken connection is replaced at once (by this call, if its driver had already
        // seen the close, or else by the next); connecting fails, and pauses further attempts.
        if !redis.conn.paused().await {
            assert!(redis.admit(&a, Now::wall()).await.is_err());
        }
        assert!(redis.conn.paused().await);
        let _again = RedisServer::start_on(port);
        redis.conn.end_pause().await;
        // A new, empty server: its bucket starts full again.
        for _ in 0..3 {
            assert_eq!(redis.admit(&a, Now::wall()).await.unwrap(), Decision::Admit);
        }
        let refused = redis.admit(&a, Now::wall()).await.unwrap();
        assert!(
            matches!(
                refused,
                Decision::Refuse {
                    limit: Limit::Requests,
                    ..
                }
            ),
            "{refused:?}"
        );
    });
}
