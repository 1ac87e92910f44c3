//! Tenant rate limits: requests per minute, tokens per minute (reserved at admission, settled
//! with the usage the provider reported), and a daily budget in exact pico-dollars. The buckets
//! live in a `Store`: in memory, or in Redis shared by every replica. When Redis cannot be
//! reached legate keeps serving on its local buckets, says so once in the log, in a metric and
//! in `/admin/state`, and goes back to the shared buckets when Redis answers again.
//!
//! Why not governor: its GCRA answers "may this cell pass now" for a fixed quota, in process.
//! These buckets need what it does not have: a reservation taken at admission and settled
//! later against the usage the provider reports (a refund, or a debt that drives the level
//! below zero and refills like anything else), a daily budget in pico-dollars next to them,
//! and arithmetic in integers that a Redis Lua script repeats line by line (`bucket`,
//! `redis`), so that every replica and the local fallback agree to the token.

pub mod bucket;
pub mod memory;
pub mod redis;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use prometheus::IntGauge;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which limit refused a request (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Requests,
    Tokens,
    /// The day's settled spend has reached the daily budget.
    Budget,
    /// The budget left is held by requests in flight: the day's spend, what they hold and
    /// this request's estimated cost together would pass it.
    BudgetHeld,
}

impl Limit {
    /// The metric label: both budget refusals are `budget`.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::Tokens => "tokens",
            Limit::Budget | Limit::BudgetHeld => "budget",
        }
    }

    /// What the refusal's message names (`ProxyError::RateLimited`).
    pub fn reason(self) -> &'static str {
        match self {
            Limit::BudgetHeld => "budget_held",
            other => other.as_str(),
        }
    }
}

/// The wait a refusal by [`Limit::BudgetHeld`] asks for: the requests holding the budget settle
/// as they finish, at a time no store knows, and most agent calls take seconds.
pub(crate) const HELD_WAIT_MS: u64 = 1000;

/// How long a hold outlives its request's deadline in the shared store, where a settlement
/// lost with a replica (or dropped while Redis was unreachable) must not hold the budget for
/// the rest of the day. The deadline bounds the wait for an answer's first event, not a stream
/// that is flowing: a hold of a stream still running after this is simply no longer counted.
pub const HOLD_PAST_DEADLINE: Duration = Duration::from_secs(300);

/// A process-wide unique name for one hold (the shared store's member for it): a random start
/// per process, then a counter, so that replicas do not collide.
pub fn next_hold_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A UTC day. No refusal asks for a longer wait: the daily budget's, until the next midnight,
/// is the longest real one.
pub(crate) const DAY_MS: u64 = 86_400_000;

/// One admission question: may `tenant` send one request reserving `tokens` now?
#[derive(Debug, Clone)]
pub struct Ask {
    /// `default` borrowed (`route::tenant_name`): most requests copy no name to be admitted.
    pub tenant: Cow<'static, str>,
    /// 0 = unlimited, for each limit.
    pub rpm: u64,
    pub tpm: u64,
    pub tokens: u64,
    pub budget_pico: u128,
    /// The request's estimated cost, held against the daily budget while it is in flight (0:
    /// nothing held; never held without a budget), its name, and how long the shared store
    /// keeps it if no settlement comes.
    pub hold_pico: u128,
    pub hold_id: u64,
    pub hold_ms: u64,
}

impl Ask {
    /// What admission holds against the budget: nothing when there is no budget.
    pub fn held(&self) -> u128 {
        if self.budget_pico > 0 {
            self.hold_pico
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admit,
    Refuse { limit: Limit, retry_after: Duration },
}

/// The store whose buckets charged a request's admission, and where it is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charged {
    /// No limit applied, so no store was asked.
    Nowhere,
    Local,
    Shared,
}

/// Settling one admitted request: tokens given back (`refund` > 0) or owed (< 0), and its cost.
#[derive(Debug, Clone)]
pub struct Settlement {
    /// Taken from the reservation, not copied: settling allocates no name.
    pub tenant: Cow<'static, str>,
    pub tpm: u64,
    pub refund: i64,
    pub cost_pico: u128,
    pub budget_pico: u128,
    /// The tenant's requests-per-minute limit, and whether the request it counted is given
    /// back (nothing was sent upstream: SPEC §13, a credential that could not be obtained).
    pub rpm: u64,
    pub request_back: bool,
    /// The hold its admission took against the daily budget, released now (0: none).
    pub held_pico: u128,
    pub hold_id: u64,
    /// Spend taken back from UTC day `credit_day` (0: none), and only from that day's: an
    /// estimate charged before the usage was known, found too high once it was ([`Resettle`]).
    pub credit_pico: u128,
    pub credit_day: u64,
    /// Told the UTC day the store charged `cost_pico` to, by the store's own clock, once it
    /// has (a kept estimate's settlement: its [`Resettle`] credits that day, not the one
    /// legate's clock read, which near midnight may be the other).
    pub charged_day: Option<Arc<AtomicU64>>,
}

impl Settlement {
    /// Only the release of the hold: what may be sent again when it is unknown whether a
    /// call reached the store (a timeout), since removing a hold twice removes it once, where
    /// a refund or a cost applied twice would count twice. None without a hold.
    fn hold_only(&self) -> Option<Settlement> {
        (self.held_pico > 0).then(|| Settlement {
            tenant: self.tenant.clone(),
            tpm: self.tpm,
            refund: 0,
            cost_pico: 0,
            budget_pico: self.budget_pico,
            rpm: self.rpm,
            request_back: false,
            held_pico: self.held_pico,
            hold_id: self.hold_id,
            credit_pico: 0,
            credit_day: 0,
            charged_day: None,
        })
    }

    /// Tells the kept estimate's [`Resettle`], if any, the day the cost went to.
    fn tell_charged_day(&self, day: Option<u64>) {
        if let (Some(slot), Some(day)) = (&self.charged_day, day) {
            slot.store(day, Ordering::Relaxed);
        }
    }

    /// The release of the hold an admission `ask` may have taken in a store that did not
    /// answer in time (None without one).
    fn release_of(ask: &Ask) -> Option<Settlement> {
        Settlement {
            tenant: ask.tenant.clone(),
            tpm: ask.tpm,
            refund: 0,
            cost_pico: 0,
            budget_pico: ask.budget_pico,
            rpm: ask.rpm,
            request_back: false,
            held_pico: ask.held(),
            hold_id: ask.hold_id,
            credit_pico: 0,
            credit_day: 0,
            charged_day: None,
        }
        .hold_only()
    }
}

#[derive(Debug)]
pub struct StoreError(pub String);

/// Wall-clock time as the stores need it: unix milliseconds and the UTC day.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub ms: u64,
}

impl Now {
    pub fn wall() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Now { ms }
    }

    /// The UTC day number (budgets reset at UTC midnight).
    pub fn day(self) -> u64 {
        self.ms / 86_400_000
    }

    pub fn until_midnight(self) -> Duration {
        Duration::from_millis(86_400_000 - self.ms % 86_400_000)
    }
}

pub trait Store: Send + Sync {
    fn admit<'a>(&'a self, ask: &'a Ask, now: Now) -> BoxFuture<'a, Result<Decision, StoreError>>;
    /// Applies `s`; the UTC day its cost was charged to, by the store's clock (None: it had
    /// no cost).
    fn settle<'a>(
        &'a self,
        s: &'a Settlement,
        now: Now,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>>;
}

/// The limiter legate uses: the shared store when configured and reachable, else the local one.
pub struct Limiter {
    local: memory::MemoryStore,
    shared: Option<Box<dyn Store>>,
    degraded: AtomicBool,
    /// While degraded, the shared store is tried again no sooner than this (unix ms).
    retry_shared_at: AtomicU64,
    degraded_gauge: IntGauge,
    /// Settlements the shared store could not be given, sent in order once it answers again.
    /// Without them a hold lost to a slow moment stayed for minutes (until its lifetime
    /// lapsed), refusing the tenant's requests as "held by requests in flight" when none were.
    deferred: Mutex<VecDeque<Settlement>>,
    /// A task is sending the deferred settlements.
    flushing: AtomicBool,
}

/// How long a shared-store call may take before the local buckets answer instead.
const SHARED_TIMEOUT: Duration = Duration::from_millis(250);
/// While the shared store is down, how often one request tries it again.
const SHARED_RETRY_EVERY_MS: u64 = 1000;
/// Deferred settlements kept at most (the oldest go first: a hold lapses on its own anyway).
const DEFERRED_MAX: usize = 4096;

impl Limiter {
    pub fn new(shared: Option<Box<dyn Store>>, degraded_gauge: IntGauge) -> Self {
        Limiter {
            local: memory::MemoryStore::default(),
            shared,
            degraded: AtomicBool::new(false),
            retry_shared_at: AtomicU64::new(0),
            degraded_gauge,
            deferred: Mutex::new(VecDeque::new()),
            flushing: AtomicBool::new(false),
        }
    }

    fn defer(&self, s: Option<Settlement>) {
        let Some(s) = s else {
            return;
        };
        let mut deferred = self.deferred.lock();
        if deferred.len() >= DEFERRED_MAX {
            deferred.pop_front();
        }
        deferred.push_back(s);
    }

    /// Settlements waiting for the shared store (for tests and `/admin/state`).
    pub fn deferred_settlements(&self) -> usize {
        self.deferred.lock().len()
    }

    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    fn shared_usable(&self, now: Now) -> Option<&dyn Store> {
        let shared = self.shared.as_deref()?;
        if self.is_degraded() && now.ms < self.retry_shared_at.load(Ordering::Relaxed) {
            return None;
        }
        Some(shared)
    }

    fn on_shared_ok(&self) {
        if self.degraded.swap(false, Ordering::Relaxed) {
            self.degraded_gauge.set(0);
            tracing::info!(
                "the shared rate-limit store answers again; buckets are shared once more"
            );
        }
    }

    fn on_shared_error(&self, now: Now, err: &str) {
        self.retry_shared_at
            .store(now.ms + SHARED_RETRY_EVERY_MS, Ordering::Relaxed);
        if !self.degraded.swap(true, Ordering::Relaxed) {
            self.degraded_gauge.set(1);
            tracing::warn!(error = %err, "the shared rate-limit store is unreachable; serving on local buckets until it returns");
        }
    }

    /// The decision, and which store's buckets made it (its reservation is settled there).
    pub async fn admit(&self, ask: &Ask) -> (Decision, Charged) {
        let now = Now::wall();
        if let Some(shared) = self.shared_usable(now) {
            match tokio::time::timeout(SHARED_TIMEOUT, shared.admit(ask, now)).await {
                Ok(Ok(d)) => {
                    self.on_shared_ok();
                    return (d, Charged::Shared);
                }
                Ok(Err(e)) => self.on_shared_error(now, &e.0),
                Err(_) => self.on_shared_error(now, "timed out"),
            }
            // The script may have run there all the same, holding the request's estimated cost
            // against the budget: that hold is released once the store answers again.
            self.defer(Settlement::release_of(ask));
        }
        match self.local.admit_now(ask, now) {
            Ok(d) => (d, Charged::Local),
            // The local store cannot fail; admitting is the safe answer if it ever did.
            Err(_) => (Decision::Admit, Charged::Local),
        }
    }

    /// Settles in the shared store, which charged the request; once it answers, what was
    /// deferred is sent too, in order, until a call fails again.
    async fn settle_shared(&self, s: Settlement) {
        if !self.settle_once(s).await || self.flushing.swap(true, Ordering::AcqRel) {
            return;
        }
        loop {
            let next = self.deferred.lock().pop_front();
            let Some(d) = next else { break };
            if !self.settle_once(d).await {
                break;
            }
        }
        self.flushing.store(false, Ordering::Release);
    }

    /// One settlement sent to the shared store; true if it answered. Never applied to the
    /// local buckets, which did not charge this request (a refund there would hand the tenant
    /// tokens it never took from them). While the store is known to be down the settlement
    /// waits in `deferred`, whole (it was never sent); after a failed or timed-out call only
    /// its hold's release waits (the call may have been applied). What may be lost: a refund
    /// not given back leaves the shared bucket low until it refills (within a minute), and a
    /// cost not recorded is usage the shared store does not see.
    async fn settle_once(&self, s: Settlement) -> bool {
        let now = Now::wall();
        let Some(shared) = self.shared_usable(now) else {
            self.defer(Some(s));
            return false;
        };
        let why = match tokio::time::timeout(SHARED_TIMEOUT, shared.settle(&s, now)).await {
            Ok(Ok(day)) => {
                s.tell_charged_day(day);
                self.on_shared_ok();
                return true;
            }
            Ok(Err(e)) => e.0,
            Err(_) => "timed out".to_owned(),
        };
        self.on_shared_error(now, &why);
        self.defer(s.hold_only());
        false
    }

    /// Settles in the store that `charged` the request, without waiting: at once for local
    /// buckets (so the very next request sees the refund), in the background for a shared
    /// store. A local charge is settled locally even once the shared store is back, and the
    /// other way round: each store gets back only what it gave.
    pub fn settle_detached(self: &Arc<Self>, s: Settlement, charged: Charged) {
        match charged {
            Charged::Nowhere => {}
            Charged::Local => {
                let now = Now::wall();
                self.local.settle_now(&s, now);
                s.tell_charged_day((s.cost_pico > 0).then(|| now.day()));
            }
            Charged::Shared => {
                let me = self.clone();
                tokio::spawn(async move { me.settle_shared(s).await });
            }
        }
    }

    /// For `/admin/state`: the local buckets (what is enforced when no shared store is used).
    pub fn local_snapshot(&self) -> serde_json::Value {
        self.local.snapshot(Now::wall())
    }
}

/// A tenant's reservation for one request, settled exactly once: with the usage the provider
/// reported, or (dropped unsettled: an error, a refusal, a caller gone before any usage)
/// refunded in full.
pub struct Reservation {
    limiter: Arc<Limiter>,
    charged: Charged,
    tenant: Cow<'static, str>,
    tpm: u64,
    rpm: u64,
    budget_pico: u128,
    reserved: u64,
    pub estimated_input: u64,
    settled: bool,
    /// The request counted against `rpm` is to be given back when settled.
    request_back: bool,
    /// The estimated cost held against the daily budget (`Ask::held`), and its name.
    held_pico: u128,
    hold_id: u64,
    /// Where the store will say which day the kept estimate was charged to (`resettle`).
    charged_day: Option<Arc<AtomicU64>>,
}

impl Reservation {
    pub fn new(limiter: Arc<Limiter>, ask: &Ask, charged: Charged, estimated_input: u64) -> Self {
        Reservation {
            limiter,
            charged,
            tenant: ask.tenant.clone(),
            tpm: ask.tpm,
            rpm: ask.rpm,
            budget_pico: ask.budget_pico,
            reserved: ask.tokens,
            estimated_input,
            settled: false,
            request_back: false,
            held_pico: ask.held(),
            hold_id: ask.hold_id,
            charged_day: None,
        }
    }

    /// Nothing was sent upstream for this request (legate could not obtain the platform
    /// credential, SPEC §13, or refused the request itself): it is counted against none of
    /// the tenant's limits, its tokens refunded in full and its request given back.
    pub fn never_sent(&mut self) {
        self.request_back = self.rpm > 0;
        self.settle(0, 0);
    }

    /// The provider answered but reported no usage (an OpenAI stream cut before its usage
    /// chunk, a caller gone before it): the token estimate stands, nothing is refunded. Against
    /// the budget, the estimate is spent at the `price` of the step that answered: the most
    /// the provider may bill for it, since what it did bill is unknown. Spending nothing would
    /// let a caller that always leaves before the usage chunk pass any budget. (The ledger
    /// and the cost metrics count only reported usage.)
    pub fn keep(&mut self, price: Option<crate::meter::Price>) {
        self.keep_plus(0, 0, price);
    }

    /// What puts the daily budget right once the usage `keep` stands in for is known (a
    /// background response's, reported by a later poll); None when the tenant's spend is not
    /// kept (no limit charged it) or the reservation is settled already. Take it before `keep`.
    pub fn resettle(&mut self, price: Option<crate::meter::Price>) -> Option<Resettle> {
        if self.charged == Charged::Nowhere || self.settled {
            return None;
        }
        // Legate's day until the store says which day it charged (a shared store's clock).
        let day = Arc::new(AtomicU64::new(Now::wall().day()));
        self.charged_day = Some(day.clone());
        Some(Resettle {
            limiter: self.limiter.clone(),
            charged: self.charged,
            tenant: self.tenant.clone(),
            tpm: self.tpm,
            rpm: self.rpm,
            budget_pico: self.budget_pico,
            kept_pico: self.kept(0, 0, price).1,
            day,
        })
    }

    /// Like `keep`, with `tokens` and `cost_pico` charged on top (usage of earlier attempts).
    pub fn keep_plus(&mut self, tokens: u64, cost_pico: u128, price: Option<crate::meter::Price>) {
        let (tokens, cost_pico) = self.kept(tokens, cost_pico, price);
        self.settle(tokens, cost_pico);
    }

    /// Settles a request whose usage was reported only in part: a stream that ended before
    /// its final usage (Anthropic's `message_start` reports the input and one output token;
    /// the caller left, or the stream broke, before `message_delta`). The provider bills what
    /// it generated, which legate did not see: the charge is what was reported, or what `keep`
    /// charges if that is more. Settling with the part alone let a caller that leaves every
    /// stream early pass its tokens-per-minute limit and its budget.
    pub fn settle_at_least(
        &mut self,
        (used_tokens, cost_pico): (u64, u128),
        (earlier_tokens, earlier_pico): (u64, u128),
        price: Option<crate::meter::Price>,
    ) {
        let (kept_tokens, kept_pico) = self.kept(earlier_tokens, earlier_pico, price);
        self.settle(used_tokens.max(kept_tokens), cost_pico.max(kept_pico));
    }

    /// What `keep_plus` settles with: the reservation and its estimate's cost, plus `tokens`
    /// and `cost_pico`.
    fn kept(
        &self,
        tokens: u64,
        cost_pico: u128,
        price: Option<crate::meter::Price>,
    ) -> (u64, u128) {
        // The output at most what legate would meter of it (`Usage::bounded`): a request asking
        // for more (a `max_output_tokens` of 10^13) is not charged beyond any cost it can have.
        let estimate = match price {
            Some(p) if self.held_pico > 0 => crate::meter::Usage {
                input: self.estimated_input,
                output: self
                    .reserved
                    .saturating_sub(self.estimated_input)
                    .min(crate::meter::MAX_REPORTED_TOKENS),
                ..Default::default()
            }
            .cost_pico(&p),
            _ => 0,
        };
        (
            self.reserved.saturating_add(tokens),
            cost_pico.saturating_add(estimate),
        )
    }

    /// Settles with the tokens actually used and their cost.
    pub fn settle(&mut self, used_tokens: u64, cost_pico: u128) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        // A tenant with no limit at all was charged in no store, and its spend is not kept:
        // keeping it would cost each of its requests a store write (a lock here, a script run
        // in Redis) that nothing reads until a budget is configured. Any limit makes the
        // request pass a store at admission already, and then its spend is kept whenever a
        // price is known, budget or not, so that a budget added by a reload counts today's.
        if self.charged == Charged::Nowhere {
            return;
        }
        // Use beyond the reservation is charged, but at most one minute's worth: a report far
        // above what the request could use (a provider's bug) then holds the tenant back for
        // about a minute, not for as long as its bucket takes to refill the excess.
        let tpm = i64::try_from(self.tpm).unwrap_or(i64::MAX);
        let refund = match self.tpm {
            0 => 0,
            _ => (i64::try_from(self.reserved).unwrap_or(i64::MAX)
                - i64::try_from(used_tokens).unwrap_or(i64::MAX))
            .max(-tpm),
        };
        if refund == 0 && cost_pico == 0 && !self.request_back && self.held_pico == 0 {
            return;
        }
        let s = Settlement {
            tenant: std::mem::take(&mut self.tenant),
            tpm: self.tpm,
            refund,
            cost_pico,
            budget_pico: self.budget_pico,
            rpm: self.rpm,
            request_back: self.request_back,
            held_pico: self.held_pico,
            hold_id: self.hold_id,
            credit_pico: 0,
            credit_day: 0,
            charged_day: self.charged_day.take(),
        };
        self.limiter.settle_detached(s, self.charged);
    }
}

/// A reservation kept at its estimate's cost (`kept_pico`) while the usage is unknown: once
/// the usage is known, the spend of the tenant's daily budget is put right, in the store that
/// charged it. Only the spend: the tokens-per-minute bucket's minute has passed by then, and
/// the request's count stands. A debit of what the usage cost beyond the estimate is charged to
/// the day it is known; a credit of what it cost less only to the day it was charged, so that
/// a response finished after midnight never lowers the next day's spend.
pub struct Resettle {
    limiter: Arc<Limiter>,
    charged: Charged,
    tenant: Cow<'static, str>,
    tpm: u64,
    rpm: u64,
    budget_pico: u128,
    kept_pico: u128,
    /// The day the estimate was charged to: legate's, until the store that charged it says.
    day: Arc<AtomicU64>,
}

impl Resettle {
    /// The usage turned out to cost `cost_pico`.
    pub fn settle(self, cost_pico: u128) {
        if cost_pico == self.kept_pico {
            return;
        }
        let s = Settlement {
            tenant: self.tenant,
            tpm: self.tpm,
            refund: 0,
            cost_pico: cost_pico.saturating_sub(self.kept_pico),
            budget_pico: self.budget_pico,
            rpm: self.rpm,
            request_back: false,
            held_pico: 0,
            hold_id: 0,
            credit_pico: self.kept_pico.saturating_sub(cost_pico),
            credit_day: self.day.load(Ordering::Relaxed),
            charged_day: None,
        };
        self.limiter.settle_detached(s, self.charged);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.settle(0, 0);
    }
}

#[cfg(test)]
mod tests;
