//! The shared store: tenant buckets in Redis, so that every replica enforces one combined limit.
//! Each admission and each settlement is one Lua script (EVALSHA, loaded on a NOSCRIPT reply)
//! that replays `bucket.rs` and `memory.rs` atomically on the server, on the server's clock, so
//! replicas with skewed clocks agree and the local fallback counts the same way.
//!
//! Keys, per tenant; the `{tenant}` hash tag keeps one tenant's keys on one cluster slot:
//! - `legate:rl:{tenant}:req`, `legate:rl:{tenant}:tok`: hashes of `level` (units, may be
//!   negative: a debt) and `last_ms`. An absent bucket is a full one, so each expires once it
//!   would be full again, plus a minute: dead tenants do not pile up.
//! - `legate:rl:{tenant}:spent`: a hash of `day` (the UTC day number) and `pico` (pico-USD
//!   spent that day). It grows with HINCRBY, a signed 64-bit integer: the spend saturates at
//!   about 9.2 million USD per tenant per day, so a larger daily budget is never reached. It
//!   expires two days after its last write. Its `held` field is the sum of the holds below.
//! - `legate:rl:{tenant}:held`: a sorted set of the holds requests in flight keep against the
//!   daily budget, one member `ID:PICO` each, scored by when it lapses (unix ms: the request's
//!   deadline plus [`HOLD_PAST_DEADLINE`](super::HOLD_PAST_DEADLINE)). A settlement removes its
//!   member; one that never comes (its replica gone, or Redis unreachable when it was due) is
//!   dropped by the first admission after the lapse, so a lost settlement holds the budget for
//!   minutes, never for the rest of the day.
//!
//! The connection is a [`LazyConnection`]: opened by the first call, dropped after any failed
//! one. Both the connection and each reply have a short timeout, so a missing Redis costs a
//! request little.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{Client, FromRedisValue, Script, ScriptInvocation};

use super::{Ask, BoxFuture, DAY_MS, Decision, Limit, Now, Settlement, Store, StoreError};
use crate::redis_conn::LazyConnection;

const COMMON_LUA: &str = include_str!("redis/common.lua");
const ADMIT_LUA: &str = include_str!("redis/admit.lua");
const SETTLE_LUA: &str = include_str!("redis/settle.lua");

/// Bounds the connection and each reply.
const TIMEOUT: Duration = Duration::from_millis(200);

/// The scripts answer a few integers; the connection's set-up, a few short lines. A reply
/// larger than this is not the store's, and is refused before it is read whole.
const MAX_REPLY: usize = 64 * 1024;

/// A hold is clamped to this (about USD 9,000, far above any one request's cost), so that 1,024
/// of them still sum below the int64 maximum `held` grows in.
const MAX_HOLD_PICO: u128 = (i64::MAX / 1024) as u128;

/// Limits and token counts are clamped to this before they reach a script, so that every value
/// the script computes is an integer below 2^53 and therefore exact in a Lua double (10^11
/// tokens are 6 * 10^15 units). Nothing real comes near it.
const MAX_SCRIPT_TOKENS: u64 = 100_000_000_000;

pub struct RedisStore {
    conn: LazyConnection,
    admit: Script,
    settle: Script,
    /// Unix ms the scripts use instead of the server's TIME; 0 (always, outside tests) = TIME.
    pinned_clock_ms: AtomicU64,
}

/// The Redis keys of one tenant.
#[derive(Debug, PartialEq, Eq)]
struct Keys {
    requests: String,
    tokens: String,
    spent: String,
    held: String,
}

impl Keys {
    fn of(tenant: &str) -> Self {
        // Tenant names are `[a-z0-9_-]+` (validated), so they never contain a brace that would
        // move the hash tag.
        let base = format!("legate:rl:{{{tenant}}}");
        Keys {
            requests: format!("{base}:req"),
            tokens: format!("{base}:tok"),
            spent: format!("{base}:spent"),
            held: format!("{base}:held"),
        }
    }
}

impl RedisStore {
    /// Checks the URL; does not connect.
    pub fn new(url: &str) -> Result<Self, StoreError> {
        // The error names the problem, never the URL: it may carry a password.
        let client = Client::open(url).map_err(|e| {
            StoreError(format!(
                "ratelimit.redis_url is not usable: {}",
                e.category()
            ))
        })?;
        Ok(RedisStore {
            conn: LazyConnection::new(&client, TIMEOUT, MAX_REPLY).map_err(|e| {
                StoreError(format!(
                    "ratelimit.redis_url is not usable: {}",
                    e.category()
                ))
            })?,
            admit: Script::new(&format!("{COMMON_LUA}\n{ADMIT_LUA}")),
            settle: Script::new(&format!("{COMMON_LUA}\n{SETTLE_LUA}")),
            pinned_clock_ms: AtomicU64::new(0),
        })
    }

    async fn run<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        // The kind only: a server's error text may quote what it was sent.
        let failed = |e: redis::RedisError| StoreError(format!("Redis: {}", e.category()));
        let mut leased = self.conn.get().await.map_err(failed)?;
        match call.invoke_async(&mut leased.conn).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn.reset(&leased, &e).await;
                Err(failed(e))
            }
        }
    }

    fn clock_arg(&self) -> String {
        match self.pinned_clock_ms.load(Ordering::Relaxed) {
            0 => String::new(),
            ms => ms.to_string(),
        }
    }

    /// Makes the scripts use `ms` as the time instead of the server's clock.
    #[cfg(test)]
    fn pin_clock(&self, ms: u64) {
        self.pinned_clock_ms.store(ms, Ordering::Relaxed);
    }

    /// What `tenant`'s requests in flight hold against its budget, as kept (None: nothing).
    #[cfg(test)]
    async fn held_sum(&self, tenant: &str) -> Option<String> {
        let mut leased = self.conn.get().await.ok()?;
        redis::cmd("HGET")
            .arg(Keys::of(tenant).spent)
            .arg("held")
            .query_async(&mut leased.conn)
            .await
            .ok()?
    }

    /// What `tenant` spent on the UTC day of `now`, as kept (None: nothing that day).
    #[cfg(test)]
    async fn spent_today(&self, tenant: &str, now: Now) -> Option<String> {
        let mut leased = self.conn.get().await.ok()?;
        let (day, pico): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(Keys::of(tenant).spent)
            .arg("day")
            .arg("pico")
            .query_async(&mut leased.conn)
            .await
            .ok()?;
        pico.filter(|_| day == Some(now.day().to_string()))
    }
}

fn clamp_tokens(n: u64) -> u64 {
    n.min(MAX_SCRIPT_TOKENS)
}

/// The sorted-set member of a hold: its name and its amount, so that the script that drops
/// a lapsed one knows what to take off the sum.
fn hold_member(id: u64, pico: u128) -> String {
    if pico == 0 {
        return String::new();
    }
    format!("{id:016x}:{pico}")
}

/// ARGV of the admission script, before the clock.
fn admit_args(ask: &Ask) -> [String; 7] {
    let hold = ask.held().min(MAX_HOLD_PICO);
    [
        clamp_tokens(ask.rpm).to_string(),
        clamp_tokens(ask.tpm).to_string(),
        clamp_tokens(ask.tokens).to_string(),
        ask.budget_pico.to_string(),
        hold.to_string(),
        hold_member(ask.hold_id, hold),
        ask.hold_ms.clamp(1, DAY_MS).to_string(),
    ]
}

/// ARGV of the settlement script, before the clock.
fn settle_args(s: &Settlement) -> [String; 7] {
    let bound = MAX_SCRIPT_TOKENS as i64;
    let held = s.held_pico.min(MAX_HOLD_PICO);
    [
        clamp_tokens(s.tpm).to_string(),
        s.refund.clamp(-bound, bound).to_string(),
        // HINCRBY takes a signed 64-bit increment; the script saturates the sum there too.
        s.cost_pico.min(i64::MAX as u128).to_string(),
        clamp_tokens(s.rpm).to_string(),
        u8::from(s.request_back).to_string(),
        held.to_string(),
        hold_member(s.hold_id, held),
    ]
}

/// Reads the admission script's `{outcome, wait_ms}` reply.
fn decision(outcome: i64, wait_ms: i64) -> Result<Decision, StoreError> {
    let limit = match outcome {
        0 => return Ok(Decision::Admit),
        1 => Limit::Requests,
        2 => Limit::Tokens,
        3 => Limit::Budget,
        4 => Limit::BudgetHeld,
        other => {
            return Err(StoreError(format!(
                "the admission script answered an unknown outcome {other}"
            )));
        }
    };
    // No real wait is longer than the daily budget's, until the next UTC midnight: a reply
    // beyond it (a server that answers something else) must not tell callers to wait years.
    let wait = u64::try_from(wait_ms).unwrap_or(0).clamp(1, DAY_MS);
    Ok(Decision::Refuse {
        limit,
        retry_after: Duration::from_millis(wait),
    })
}

impl Store for RedisStore {
    /// `_now` is not used: the server's clock decides, the same for every replica.
    fn admit<'a>(&'a self, ask: &'a Ask, _now: Now) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let keys = Keys::of(&ask.tenant);
            let mut call = self.admit.key(&keys.requests);
            call.key(&keys.tokens).key(&keys.spent).key(&keys.held);
            call.arg(&admit_args(ask)[..]).arg(self.clock_arg());
            let (outcome, wait_ms): (i64, i64) = self.run(&call).await?;
            decision(outcome, wait_ms)
        })
    }

    fn settle<'a>(
        &'a self,
        s: &'a Settlement,
        _now: Now,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let keys = Keys::of(&s.tenant);
            let mut call = self.settle.key(&keys.tokens);
            call.key(&keys.spent).key(&keys.requests).key(&keys.held);
            call.arg(&settle_args(s)[..]).arg(self.clock_arg());
            call.arg(s.credit_pico.min(i64::MAX as u128).to_string())
                .arg(s.credit_day.to_string());
            // The day the script charged the cost to, by the server's clock (0: no cost).
            let day: i64 = self.run(&call).await?;
            Ok(u64::try_from(day).ok().filter(|d| *d > 0))
        })
    }
}

#[cfg(test)]
mod tests;
