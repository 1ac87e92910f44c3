//! Token-bucket arithmetic shared by every store (the Redis script mirrors it line by line):
//! integers only, so that replicas and the local fallback agree to the token.
//!
//! A bucket with a limit of L per minute holds up to L * 60_000 units and refills L units per
//! millisecond; taking n tokens costs n * 60_000 units. The level may go below zero when usage
//! reported after the fact exceeds what was reserved (a debt that refills like anything else).

pub const UNITS_PER_TOKEN: i128 = 60_000;

/// How far ahead of the clock a bucket's time may be before it is taken as a step of the
/// clock (and the clock's time is taken instead): the Redis script uses the same bound.
pub const CLOCK_STEP_MS: u64 = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub level: i128,
    pub last_ms: u64,
}

impl Bucket {
    /// A new bucket starts full.
    pub fn full(limit_per_min: u64, now_ms: u64) -> Self {
        Bucket {
            level: i128::from(limit_per_min) * UNITS_PER_TOKEN,
            last_ms: now_ms,
        }
    }

    fn refill(&mut self, limit_per_min: u64, now_ms: u64) {
        let cap = i128::from(limit_per_min) * UNITS_PER_TOKEN;
        let elapsed = i128::from(now_ms.saturating_sub(self.last_ms));
        self.level = (self.level + elapsed * i128::from(limit_per_min)).min(cap);
        // A time far ahead of the clock (a wall clock stepped back, a key written wrong) is
        // not kept: kept, the bucket would refill only once the clock caught up with it. One
        // a little ahead is (callers read the clock before they take the store's lock, so
        // they may come in a slightly different order): going back to it would count the
        // time between twice.
        if self.last_ms <= now_ms.saturating_add(CLOCK_STEP_MS) {
            self.last_ms = self.last_ms.max(now_ms);
        } else {
            self.last_ms = now_ms;
        }
    }

    /// Takes `n` tokens, or says how many milliseconds until they would be there.
    pub fn take(&mut self, limit_per_min: u64, n: u64, now_ms: u64) -> Result<(), u64> {
        self.refill(limit_per_min, now_ms);
        let need = i128::from(n) * UNITS_PER_TOKEN;
        if self.level >= need {
            self.level -= need;
            return Ok(());
        }
        let rate = i128::from(limit_per_min.max(1));
        let wait = (need - self.level + rate - 1) / rate;
        Err(u64::try_from(wait).unwrap_or(u64::MAX))
    }

    /// Gives `n` tokens back (a refund), or takes them (a debit) when `n` is negative.
    pub fn give(&mut self, limit_per_min: u64, n: i64, now_ms: u64) {
        self.refill(limit_per_min, now_ms);
        let cap = i128::from(limit_per_min) * UNITS_PER_TOKEN;
        self.level = (self.level + i128::from(n) * UNITS_PER_TOKEN).min(cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_full_bucket_serves_its_limit_then_says_when_the_next_fits() {
        let mut b = Bucket::full(3, 0);
        for _ in 0..3 {
            assert_eq!(b.take(3, 1, 0), Ok(()));
        }
        // One token per 20 s at 3/min.
        assert_eq!(b.take(3, 1, 0), Err(20_000));
        assert_eq!(b.take(3, 1, 19_999), Err(1));
        assert_eq!(b.take(3, 1, 20_000), Ok(()));
    }

    /// A clock stepped back freezes the bucket for no longer than the step's own refill:
    /// it refills again from the earlier time on.
    #[test]
    fn a_time_ahead_of_the_clock_is_not_kept() {
        let mut b = Bucket::full(60, 1_000_000_000);
        for _ in 0..60 {
            assert_eq!(b.take(60, 1, 1_000_000_000), Ok(()));
        }
        // The clock steps back by a day: one token a second from then on.
        assert_eq!(b.take(60, 1, 1_000), Err(1_000));
        assert_eq!(b.take(60, 1, 2_000), Ok(()));
    }

    #[test]
    fn refunds_make_room_and_debits_become_debt() {
        let mut b = Bucket::full(1000, 0);
        assert_eq!(b.take(1000, 900, 0), Ok(()));
        assert!(b.take(1000, 900, 0).is_err());
        b.give(1000, 885, 0);
        assert_eq!(b.take(1000, 900, 0), Ok(()));
        b.give(1000, -500, 0);
        // 100 - 900 + 885 - 900 - 500 = -415 tokens: 1415 tokens short of one more 1000.
        assert_eq!(b.take(1000, 1000, 0), Err(1415 * 60));
    }

    #[test]
    fn refunds_never_overfill() {
        let mut b = Bucket::full(10, 0);
        b.give(10, 1_000, 0);
        assert_eq!(b.level, 10 * UNITS_PER_TOKEN);
    }

    proptest! {
        #[test]
        fn the_promised_wait_is_exactly_enough(limit in 1u64..100_000, n in 1u64..100_000, t in 0u64..10_000) {
            prop_assume!(n <= limit);
            let mut b = Bucket::full(limit, 0);
            let _ = b.take(limit, limit, 0);
            let mut probe = b;
            if let Err(wait) = probe.take(limit, n, t) {
                let mut early = b;
                prop_assert!(early.take(limit, n, t + wait - 1).is_err());
                let mut on_time = b;
                prop_assert!(on_time.take(limit, n, t + wait).is_ok());
            }
        }
    }
}
