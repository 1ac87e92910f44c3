//! The in-process store: one mutex-guarded map of tenant buckets. Used alone (`store =
//! "memory"`) and as the fallback while the shared store is unreachable.

use parking_lot::Mutex;
use std::collections::HashMap;

use super::bucket::Bucket;
use super::{Ask, BoxFuture, Decision, Limit, Now, Settlement, Store, StoreError};

#[derive(Default)]
pub struct MemoryStore {
    tenants: Mutex<HashMap<String, TenantState>>,
}

#[derive(Debug, Clone, Copy)]
struct TenantState {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    /// (UTC day, pico-USD spent that day)
    spent: (u64, u128),
    /// pico-USD held against the budget by requests in flight (any day's).
    held: u128,
}

impl MemoryStore {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, TenantState>> {
        self.tenants.lock()
    }

    pub fn admit_now(&self, ask: &Ask, now: Now) -> Result<Decision, StoreError> {
        let mut map = self.lock();
        let st = map.entry(ask.tenant.to_string()).or_insert(TenantState {
            requests: None,
            tokens: None,
            spent: (now.day(), 0),
            held: 0,
        });
        if st.spent.0 != now.day() {
            st.spent = (now.day(), 0);
        }
        if ask.budget_pico > 0 && st.spent.1 >= ask.budget_pico {
            return Ok(Decision::Refuse {
                limit: Limit::Budget,
                retry_after: now.until_midnight(),
            });
        }
        let hold = ask.held();
        // A request is admitted alone whatever its estimate, as one was before holds: the
        // budget is then passed by at most one request's cost, however many come at once.
        if hold > 0
            && st.held > 0
            && st.spent.1.saturating_add(st.held).saturating_add(hold) > ask.budget_pico
        {
            return Ok(refuse(Limit::BudgetHeld, super::HELD_WAIT_MS));
        }
        if ask.rpm > 0 {
            let b = st
                .requests
                .get_or_insert_with(|| Bucket::full(ask.rpm, now.ms));
            if let Err(wait) = b.take(ask.rpm, 1, now.ms) {
                return Ok(refuse(Limit::Requests, wait));
            }
        }
        if ask.tpm > 0 {
            let b = st
                .tokens
                .get_or_insert_with(|| Bucket::full(ask.tpm, now.ms));
            if let Err(wait) = b.take(ask.tpm, ask.tokens, now.ms) {
                // Both limits or neither: give back the request token just taken.
                if ask.rpm > 0
                    && let Some(r) = st.requests.as_mut()
                {
                    r.give(ask.rpm, 1, now.ms);
                }
                return Ok(refuse(Limit::Tokens, wait));
            }
        }
        st.held = st.held.saturating_add(hold);
        Ok(Decision::Admit)
    }

    pub fn settle_now(&self, s: &Settlement, now: Now) {
        let mut map = self.lock();
        let Some(st) = map.get_mut(s.tenant.as_ref()) else {
            return;
        };
        if s.tpm > 0 && s.refund != 0 {
            let b = st.tokens.get_or_insert_with(|| Bucket::full(s.tpm, now.ms));
            b.give(s.tpm, s.refund, now.ms);
        }
        if s.rpm > 0 && s.request_back {
            let b = st
                .requests
                .get_or_insert_with(|| Bucket::full(s.rpm, now.ms));
            b.give(s.rpm, 1, now.ms);
        }
        st.held = st.held.saturating_sub(s.held_pico);
        if s.cost_pico > 0 {
            if st.spent.0 != now.day() {
                st.spent = (now.day(), 0);
            }
            st.spent.1 = st.spent.1.saturating_add(s.cost_pico);
        }
        if s.credit_pico > 0 && st.spent.0 == s.credit_day {
            st.spent.1 = st.spent.1.saturating_sub(s.credit_pico);
        }
    }

    pub fn snapshot(&self, now: Now) -> serde_json::Value {
        let map = self.lock();
        let mut out = serde_json::Map::new();
        for (tenant, st) in map.iter() {
            let tokens =
                |b: &Option<Bucket>| b.map(|b| (b.level / super::bucket::UNITS_PER_TOKEN) as i64);
            out.insert(
                tenant.clone(),
                serde_json::json!({
                    "requests_available": tokens(&st.requests),
                    "tokens_available": tokens(&st.tokens),
                    "spent_today_pico_usd": if st.spent.0 == now.day() { st.spent.1.to_string() } else { "0".to_string() },
                    "held_pico_usd": st.held.to_string(),
                }),
            );
        }
        serde_json::Value::Object(out)
    }
}

fn refuse(limit: Limit, wait_ms: u64) -> Decision {
    Decision::Refuse {
        limit,
        // At most a day, as the shared store answers (a reservation beyond the whole
        // per-minute limit is refused as never fitting before it gets here).
        retry_after: std::time::Duration::from_millis(wait_ms.clamp(1, super::DAY_MS)),
    }
}

impl Store for MemoryStore {
    fn admit<'a>(&'a self, ask: &'a Ask, now: Now) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move { self.admit_now(ask, now) })
    }

    fn settle<'a>(
        &'a self,
        s: &'a Settlement,
        now: Now,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            self.settle_now(s, now);
            Ok((s.cost_pico > 0).then(|| now.day()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(rpm: u64, tpm: u64, tokens: u64, budget: u128) -> Ask {
        Ask {
            tenant: "t".into(),
            rpm,
            tpm,
            tokens,
            budget_pico: budget,
            hold_pico: 0,
            hold_id: 0,
            hold_ms: 0,
        }
    }

    /// Tenant `t`'s settlement of a request that held `held` and cost `cost` (pico-USD).
    fn settlement(held: u128, cost: u128) -> Settlement {
        Settlement {
            tenant: "t".into(),
            tpm: 0,
            refund: 0,
            cost_pico: cost,
            budget_pico: 1_000,
            rpm: 0,
            request_back: false,
            held_pico: held,
            hold_id: 0,
            credit_pico: 0,
            credit_day: 0,
            charged_day: None,
        }
    }

    /// The limit that refused, or None for an admission.
    fn refused_by(d: Decision) -> Option<Limit> {
        match d {
            Decision::Admit => None,
            Decision::Refuse { limit, .. } => Some(limit),
        }
    }

    #[test]
    fn a_token_refusal_does_not_spend_a_request() {
        let m = MemoryStore::default();
        let now = Now { ms: 1_000_000 };
        // Calls in turn: the tokens each asks for, and the limit that refuses it (None: admitted).
        for (tokens, want) in [
            (90, None),
            (90, Some(Limit::Tokens)),
            // The refused request gave its request token back: one more small request fits.
            (5, None),
            (1, Some(Limit::Requests)),
        ] {
            let got = m.admit_now(&ask(2, 100, tokens, 0), now).ok();
            assert_eq!(got.map(refused_by), Some(want), "{tokens} tokens");
        }
    }

    #[test]
    fn the_budget_refuses_at_the_exact_pico_dollar_until_midnight() {
        let m = MemoryStore::default();
        let now = Now {
            ms: 86_400_000 * 3 + 1000,
        };
        let a = ask(0, 0, 0, 1_000);
        assert_eq!(m.admit_now(&a, now).ok(), Some(Decision::Admit));
        let settle = |cost| settlement(0, cost);
        m.settle_now(&settle(999), now);
        assert_eq!(
            m.admit_now(&a, now).ok(),
            Some(Decision::Admit),
            "1 pico-USD left"
        );
        m.settle_now(&settle(1), now);
        match m.admit_now(&a, now) {
            Ok(Decision::Refuse {
                limit: Limit::Budget,
                retry_after,
            }) => {
                assert_eq!(retry_after.as_millis(), 86_400_000 - 1000);
            }
            other => panic!("{other:?}"),
        }
        let tomorrow = Now { ms: 86_400_000 * 4 };
        assert_eq!(m.admit_now(&a, tomorrow).ok(), Some(Decision::Admit));
    }

    #[test]
    fn requests_in_flight_hold_their_estimate_against_the_budget() {
        let m = MemoryStore::default();
        let now = Now { ms: 86_400_000 * 3 };
        let a = |hold| Ask {
            hold_pico: hold,
            ..ask(0, 0, 0, 1_000)
        };
        let release = settlement;
        let held = Decision::Refuse {
            limit: Limit::BudgetHeld,
            retry_after: std::time::Duration::from_millis(super::super::HELD_WAIT_MS),
        };
        // Alone, a request is admitted whatever its estimate.
        assert_eq!(m.admit_now(&a(5_000), now).ok(), Some(Decision::Admit));
        m.settle_now(&release(5_000, 0), now);
        assert_eq!(m.admit_now(&a(400), now).ok(), Some(Decision::Admit));
        assert_eq!(m.admit_now(&a(400), now).ok(), Some(Decision::Admit));
        // 800 held: another 400 would pass 1,000.
        assert_eq!(m.admit_now(&a(400), now).ok(), Some(held));
        // An estimate of nothing (an unpriced model) is never held back.
        assert_eq!(m.admit_now(&a(0), now).ok(), Some(Decision::Admit));
        // One settles at 100: 100 spent + 400 held + 400 fits.
        m.settle_now(&release(400, 100), now);
        assert_eq!(m.admit_now(&a(400), now).ok(), Some(Decision::Admit));
        assert_eq!(m.admit_now(&a(201), now).ok(), Some(held));
        assert_eq!(
            m.snapshot(now)["t"]["held_pico_usd"],
            serde_json::json!("800")
        );
        // Without a budget nothing is held.
        let free = Ask {
            budget_pico: 0,
            ..a(10_000)
        };
        assert_eq!(m.admit_now(&free, now).ok(), Some(Decision::Admit));
        assert_eq!(
            m.snapshot(now)["t"]["held_pico_usd"],
            serde_json::json!("800")
        );
    }
}
