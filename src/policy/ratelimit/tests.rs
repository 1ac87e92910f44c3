//! The limiter's choice of store: a reservation is settled in the store that charged it,
//! whichever store is in use by the time the request ends.

use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use super::*;

/// A shared store that can be taken down and brought back, recording the settlements it got.
#[derive(Default)]
struct Flaky {
    up: AtomicBool,
    refunds: Mutex<Vec<i64>>,
    /// Every settlement it got: (refund, hold released, the hold's id).
    got: Mutex<Vec<(i64, u128, u64)>>,
    /// Every cost (pico-USD) and credit (pico-USD, from day) it got.
    spend: Mutex<Vec<(u128, u128, u64)>>,
    /// The UTC day its clock reads (0: legate's).
    day: AtomicU64,
}

struct FlakyStore(Arc<Flaky>);

impl Store for FlakyStore {
    fn admit<'a>(&'a self, _: &'a Ask, _: Now) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let up = self.0.up.load(Ordering::Relaxed);
        Box::pin(async move {
            match up {
                true => Ok(Decision::Admit),
                false => Err(StoreError("down".into())),
            }
        })
    }

    fn settle<'a>(
        &'a self,
        s: &'a Settlement,
        now: Now,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        let up = self.0.up.load(Ordering::Relaxed);
        if up {
            self.0.refunds.lock().push(s.refund);
            self.0.got.lock().push((s.refund, s.held_pico, s.hold_id));
            self.0
                .spend
                .lock()
                .push((s.cost_pico, s.credit_pico, s.credit_day));
        }
        let day = match self.0.day.load(Ordering::Relaxed) {
            0 => now.day(),
            day => day,
        };
        Box::pin(async move {
            match up {
                true => Ok((s.cost_pico > 0).then_some(day)),
                false => Err(StoreError("down".into())),
            }
        })
    }
}

fn limiter() -> (Arc<Limiter>, Arc<Flaky>) {
    let flaky = Arc::new(Flaky::default());
    let gauge = IntGauge::new("degraded", "degraded").unwrap();
    let shared = Box::new(FlakyStore(flaky.clone()));
    (Arc::new(Limiter::new(Some(shared), gauge)), flaky)
}

fn ask(tenant: &'static str, tokens: u64) -> Ask {
    Ask {
        tenant: Cow::Borrowed(tenant),
        rpm: 0,
        tpm: 1000,
        tokens,
        budget_pico: 0,
        hold_pico: 0,
        hold_id: 0,
        hold_ms: 0,
    }
}

/// Yields until `done` holds (the settlements run on spawned tasks), for at most 5 s.
async fn until(done: impl Fn() -> bool) {
    let wait = async {
        while !done() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .unwrap();
}

/// Tenant `t`'s request of 10 tokens holding 600 pico-USD of a budget of 1,000,000.
fn held_ask() -> Ask {
    Ask {
        budget_pico: 1_000_000,
        hold_pico: 600,
        ..ask("t", 10)
    }
}

/// 3 and 15 pico-USD per input and output token.
fn price() -> crate::meter::Price {
    crate::meter::Price {
        input: 3,
        output: 15,
        ..Default::default()
    }
}

/// Admits `a` and returns its reservation, checking which store charged it.
async fn reserve(limiter: &Arc<Limiter>, a: &Ask, want: Charged) -> Reservation {
    let (decision, charged) = limiter.admit(a).await;
    assert_eq!((decision, charged), (Decision::Admit, want));
    Reservation::new(limiter.clone(), a, charged, 0)
}

/// The tokens `tenant`'s local bucket holds, as `/admin/state` shows them.
fn local_tokens(limiter: &Limiter, tenant: &str) -> i64 {
    limiter.local_snapshot()[tenant]["tokens_available"]
        .as_i64()
        .unwrap()
}

/// The shared store answers again, and its pause after the failure is over.
fn bring_back(limiter: &Limiter, flaky: &Flaky) {
    flaky.up.store(true, Ordering::Relaxed);
    limiter.retry_shared_at.store(0, Ordering::Relaxed);
}

#[tokio::test]
async fn a_reservation_taken_locally_is_refunded_locally_after_the_shared_store_returns() {
    let (limiter, flaky) = limiter();
    let mut r = reserve(&limiter, &ask("t", 900), Charged::Local).await;
    assert!(limiter.is_degraded());
    assert_eq!(local_tokens(&limiter, "t"), 100);

    bring_back(&limiter, &flaky);
    r.settle(100, 0);
    // The refund of 800 goes back where the 900 were taken, at once.
    assert!(local_tokens(&limiter, "t") >= 900);
    let next = reserve(&limiter, &ask("t", 1), Charged::Shared).await;
    drop(next);
    // The shared store got back only the reservation it charged itself (1, none used).
    until(|| !flaky.refunds.lock().is_empty()).await;
    assert_eq!(*flaky.refunds.lock(), vec![1]);
}

#[tokio::test]
async fn a_reservation_taken_in_the_shared_store_is_not_refunded_into_local_buckets() {
    let (limiter, flaky) = limiter();
    // A local bucket for the tenant from an earlier outage, 100 of 1000 tokens used.
    reserve(&limiter, &ask("t", 100), Charged::Local)
        .await
        .keep(None);
    assert_eq!(local_tokens(&limiter, "t"), 900);

    bring_back(&limiter, &flaky);
    let mut r = reserve(&limiter, &ask("t", 500), Charged::Shared).await;
    flaky.up.store(false, Ordering::Relaxed);
    // Another request finds the shared store gone: the limiter is degraded.
    let _ = reserve(&limiter, &ask("u", 1), Charged::Local).await;
    assert!(limiter.is_degraded());

    r.settle(0, 0);
    // The 500 tokens the shared store charged are not handed out by the local bucket.
    let local = local_tokens(&limiter, "t");
    assert!((900..950).contains(&local), "{local}");
    assert!(flaky.refunds.lock().is_empty());
}

#[tokio::test]
async fn an_answer_without_usage_spends_its_estimate_at_the_answering_steps_price() {
    let gauge = IntGauge::new("degraded", "degraded").unwrap();
    let limiter = Arc::new(Limiter::new(None, gauge));
    // 10 tokens reserved, 4 of them the input estimate; held at a dearer step's price.
    let (held, price) = (held_ask(), price());
    let mut r = limiter.admit(&held).await;
    assert_eq!(r, (Decision::Admit, Charged::Local));
    let mut reservation = Reservation::new(limiter.clone(), &held, r.1, 4);
    reservation.keep(Some(price));
    let state = &limiter.local_snapshot()["t"];
    assert_eq!(state["held_pico_usd"], "0");
    // 4 input at 3 and 6 output at 15.
    assert_eq!(state["spent_today_pico_usd"], "102");
    // The token estimate stands.
    assert_eq!(local_tokens(&limiter, "t"), 990);
    // Unpriced, or without a budget, nothing is spent.
    r = limiter.admit(&held).await;
    Reservation::new(limiter.clone(), &held, r.1, 4).keep(None);
    let free = Ask {
        budget_pico: 0,
        ..held.clone()
    };
    r = limiter.admit(&free).await;
    Reservation::new(limiter.clone(), &free, r.1, 4).keep(Some(price));
    assert_eq!(limiter.local_snapshot()["t"]["spent_today_pico_usd"], "102");
}

#[tokio::test]
async fn a_kept_estimate_counts_no_more_output_than_is_ever_metered_and_is_put_right_later() {
    let gauge = IntGauge::new("degraded", "degraded").unwrap();
    let limiter = Arc::new(Limiter::new(None, gauge));
    // Asked for 10^13 output tokens: the estimate counts 2^24 of them, as metering would.
    let huge = Ask {
        budget_pico: u128::MAX,
        hold_pico: 1,
        tokens: 10_000_000_000_004,
        tpm: 0,
        ..ask("t", 10)
    };
    let price = price();
    let r = limiter.admit(&huge).await;
    assert_eq!(r, (Decision::Admit, Charged::Local));
    let mut reservation = Reservation::new(limiter.clone(), &huge, r.1, 4);
    let later = reservation.resettle(Some(price)).expect("a spend is kept");
    reservation.keep(Some(price));
    let spent = || limiter.local_snapshot()["t"]["spent_today_pico_usd"].clone();
    let estimate = 4 * 3 + 15 * u128::from(crate::meter::MAX_REPORTED_TOKENS);
    assert_eq!(spent(), estimate.to_string());
    // The usage came: 1,000 pico-USD, the estimate taken back.
    later.settle(1_000);
    assert_eq!(spent(), "1000");
    assert!(
        reservation.resettle(Some(price)).is_none(),
        "settled already"
    );
}

/// A hold of the budget taken in the shared store (or maybe taken: an admission that timed
/// out may have run there) is released there once it answers again, in order, whatever
/// happened in between: a settlement made while the store was known to be down is sent
/// whole, one whose call failed sends only its hold's release (it may have been applied),
/// and an admission that failed sends the release of the hold it may have taken.
#[tokio::test]
async fn holds_the_shared_store_missed_are_released_once_it_answers() {
    let (limiter, flaky) = limiter();
    let held = |id: u64| Ask {
        budget_pico: 1_000_000,
        hold_pico: 600,
        hold_id: id,
        ..ask("t", 10)
    };
    bring_back(&limiter, &flaky);
    let mut failed_call = reserve(&limiter, &held(1), Charged::Shared).await;
    let mut while_down = reserve(&limiter, &held(2), Charged::Shared).await;
    // The store stops answering: the first settlement's call fails.
    flaky.up.store(false, Ordering::Relaxed);
    failed_call.settle(4, 0);
    until(|| limiter.is_degraded()).await;
    // Still down once its pause is over: an admission tries it, fails, and is served on
    // local buckets. (One made during the pause does not try it: it takes no hold there.)
    limiter.retry_shared_at.store(0, Ordering::Relaxed);
    let _local = reserve(&limiter, &held(3), Charged::Local).await;
    // During the pause: a settlement, never sent.
    while_down.settle(7, 0);
    until(|| limiter.deferred_settlements() >= 3).await;
    assert!(flaky.got.lock().is_empty());

    bring_back(&limiter, &flaky);
    let mut next = reserve(&limiter, &held(4), Charged::Shared).await;
    next.settle(10, 0);
    until(|| flaky.got.lock().len() >= 4).await;
    assert_eq!(
        *flaky.got.lock(),
        vec![(0, 600, 4), (0, 600, 1), (0, 600, 3), (3, 600, 2)]
    );
    assert_eq!(limiter.deferred_settlements(), 0);
}

/// A kept estimate's credit goes to the day the shared store charged it to, by the store's
/// clock: near midnight, with the clocks apart, legate's own day would name the other one,
/// and the store would credit nothing (or the wrong day).
#[tokio::test]
async fn a_credit_goes_to_the_day_the_shared_store_charged() {
    let (limiter, flaky) = limiter();
    bring_back(&limiter, &flaky);
    let store_day = Now::wall().day() - 1;
    flaky.day.store(store_day, Ordering::Relaxed);
    let (held, price) = (held_ask(), price());
    let mut reservation = reserve(&limiter, &held, Charged::Shared).await;
    let later = reservation.resettle(Some(price)).expect("a spend is kept");
    reservation.keep(Some(price));
    until(|| !flaky.spend.lock().is_empty()).await;
    // The estimate (nothing of input, 10 output at 15) was charged; the usage cost 100.
    later.settle(100);
    until(|| flaky.spend.lock().len() >= 2).await;
    assert_eq!(*flaky.spend.lock(), vec![(150, 0, 0), (0, 50, store_day)]);
}
