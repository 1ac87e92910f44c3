//! The pacer of one provider: it reads the rate-limit headers of every upstream answer
//! (`anthropic-ratelimit-*`, `x-ratelimit-*`) and, while the remaining share of the tightest
//! limit is below `pace_below`, spaces out background and batch calls so that what is left
//! lasts until the reset. Interactive calls are never paced.
//!
//! Why not governor: its quota is fixed when the limiter is built, while the pace here is read
//! from every answer (what remains, until when) and applies only to some priorities; what is
//! left is one division and the next free slot.

use std::sync::OnceLock;

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use prometheus::{Gauge, GaugeVec};
use tokio::time::Instant;

use crate::config::Priority;

#[derive(Debug, Clone, Copy)]
struct Reading {
    ratio: f64,
    remaining: u64,
    reset_at: Instant,
}

pub struct Pacer {
    provider: String,
    state: Mutex<State>,
    gauge: GaugeVec,
    /// The gauge of each header family, by position in `FAMILIES`.
    gauges: [OnceLock<Gauge>; FAMILIES.len()],
}

/// The rate-limit headers of one family found in an answer.
#[derive(Default, Clone, Copy)]
struct Found<'a> {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<&'a HeaderValue>,
}

fn number(v: &HeaderValue) -> Option<u64> {
    v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok())
}

#[derive(Default)]
struct State {
    tightest: Option<Reading>,
    next_slot: Option<Instant>,
    /// When each header family's last reading resets (`None`: no reading, or reset already).
    resets: [Option<Instant>; FAMILIES.len()],
}

/// Header families: (kind label, limit, remaining, reset) for both providers' conventions.
const FAMILIES: &[(&str, &str, &str, &str)] = &[
    (
        "requests",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
    ),
    (
        "tokens",
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ),
    (
        "input_tokens",
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
    ),
    (
        "output_tokens",
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ),
    (
        "requests",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ),
    (
        "tokens",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ),
];

/// A pacing slot booked for one call ([`Pacer::book`]).
#[derive(Debug, Clone, Copy)]
pub struct Booking {
    /// How long the call waits for its slot.
    pub wait: Duration,
    slot: Instant,
    next: Instant,
}

/// A booked slot not yet used ([`Pacer::hold`]): given back when dropped.
pub struct Held<'a> {
    pacer: &'a Pacer,
    booking: Option<Booking>,
}

impl Held<'_> {
    /// The slot was waited for and is taken: nothing is given back.
    pub fn used(mut self) {
        self.booking = None;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.booking.take() {
            self.pacer.give_back(b);
        }
    }
}

impl Pacer {
    pub fn new(provider: &str, gauge: GaugeVec) -> Self {
        Pacer {
            provider: provider.to_string(),
            state: Mutex::new(State::default()),
            gauge,
            gauges: Default::default(),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Reads an upstream answer's rate-limit headers (if any). One pass over the headers picks
    /// out the rate-limit ones by prefix, so an answer without them costs a few byte compares
    /// per header and no clock reading.
    pub fn observe(&self, headers: &HeaderMap) {
        let mut found = [Found::default(); FAMILIES.len()];
        let mut any = false;
        for (name, value) in headers {
            let n = name.as_str();
            if !(n.starts_with("anthropic-ratelimit-") || n.starts_with("x-ratelimit-")) {
                continue;
            }
            for (slot, (_, limit, remaining, reset)) in found.iter_mut().zip(FAMILIES) {
                if n == *limit {
                    slot.limit = number(value);
                    any = true;
                } else if n == *remaining {
                    slot.remaining = number(value);
                } else if n == *reset {
                    slot.reset = Some(value);
                }
            }
        }
        if !any {
            return;
        }
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut tightest: Option<Reading> = None;
        let mut resets = [None; FAMILIES.len()];
        for (i, slot) in found.iter().enumerate() {
            let (Some(limit), Some(remaining)) = (slot.limit, slot.remaining) else {
                continue;
            };
            if limit == 0 {
                continue;
            }
            let ratio = (remaining as f64 / limit as f64).min(1.0);
            self.gauge(i).set(ratio);
            // Capped at a day: a header must not be able to overflow the clock arithmetic.
            let reset_in = slot
                .reset
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_reset(v, wall))
                .unwrap_or(Duration::from_secs(60))
                .min(Duration::from_secs(86_400));
            let reading = Reading {
                ratio,
                remaining,
                reset_at: now + reset_in,
            };
            resets[i] = Some(reading.reset_at);
            if tightest.is_none_or(|t| reading.ratio < t.ratio) {
                tightest = Some(reading);
            }
        }
        if let Some(t) = tightest {
            let mut st = self.lock();
            st.tightest = Some(t);
            for (kept, new) in st.resets.iter_mut().zip(resets) {
                if new.is_some() {
                    *kept = new;
                }
            }
        }
    }

    /// Forgets readings whose reset has passed: their gauges read 1 (the limit is whole again,
    /// as the provider said it would be), and `/admin/state` shows no reading. Called before
    /// `/metrics` and `/admin/state` are rendered; without it a low ratio stayed exported, and
    /// an alert on it kept firing, after the limit had come back.
    pub fn refresh(&self) {
        let now = Instant::now();
        let mut st = self.lock();
        for (i, reset) in st.resets.iter_mut().enumerate() {
            if reset.is_some_and(|r| r <= now) {
                *reset = None;
                self.gauge(i).set(1.0);
            }
        }
        if st.tightest.is_some_and(|t| t.reset_at <= now) {
            st.tightest = None;
        }
    }

    /// The remaining-ratio gauge of header family `i`, looked up once and kept: created on
    /// first use, so a provider that never sends rate-limit headers exports no series.
    fn gauge(&self, i: usize) -> &Gauge {
        self.gauges[i].get_or_init(|| {
            self.gauge
                .with_label_values(&[self.provider.as_str(), FAMILIES[i].0])
        })
    }

    /// How long a call of priority `p` should wait before it is sent; `None` for no wait.
    #[cfg(test)]
    pub fn delay(&self, p: Priority, pace_below: f64) -> Option<Duration> {
        self.book(p, pace_below).map(|b| b.wait)
    }

    /// A slot booked: the wait until it, and what gives it back ([`Pacer::give_back`]).
    pub fn book(&self, p: Priority, pace_below: f64) -> Option<Booking> {
        if p == Priority::Interactive {
            return None;
        }
        let now = Instant::now();
        let mut st = self.lock();
        let t = st.tightest?;
        if t.ratio >= pace_below || now >= t.reset_at {
            return None;
        }
        // Spread what is left over the time until the reset. No slot lies past the reset:
        // callers beyond what is left wait for the reset, and no longer (slots spaced on past
        // it kept them waiting after the limit had come back).
        // With nothing left, every call waits for the reset: the first one too (sent at once,
        // it would meet a limit already spent, and spend legate's retries on the 429).
        let slots = u32::try_from(t.remaining.max(1)).unwrap_or(u32::MAX);
        let interval = t.reset_at.saturating_duration_since(now) / slots;
        let first = if t.remaining == 0 { t.reset_at } else { now };
        let slot = st.next_slot.map_or(first, |n| n.max(first)).min(t.reset_at);
        let next = (slot + interval).min(t.reset_at);
        st.next_slot = Some(next);
        let wait = slot.saturating_duration_since(now);
        (!wait.is_zero()).then_some(Booking { wait, slot, next })
    }

    /// A booked slot the call will not use (it was shed before it was sent) is given back
    /// when no later call has booked since: otherwise every shed call a client retries would
    /// push the calls that do wait further towards the reset.
    pub fn give_back(&self, b: Booking) {
        let mut st = self.lock();
        if st.next_slot == Some(b.next) {
            st.next_slot = Some(b.slot);
        }
    }

    /// A booked slot that is given back unless it is used: a call dropped during its wait
    /// (its caller left) frees its slot as a shed one does.
    pub fn hold(&self, b: Booking) -> Held<'_> {
        Held {
            pacer: self,
            booking: Some(b),
        }
    }

    /// For `/admin/state`.
    pub fn snapshot(&self) -> serde_json::Value {
        self.refresh();
        let now = Instant::now();
        match self.lock().tightest {
            Some(t) => serde_json::json!({
                "remaining_ratio": t.ratio,
                "remaining": t.remaining,
                "reset_in_ms": t.reset_at.saturating_duration_since(now).as_millis() as u64,
            }),
            None => serde_json::Value::Null,
        }
    }
}

/// A reset value: an RFC 3339 time (Anthropic) or a Go-style duration like `6m0s`, `1s`,
/// `12ms` (OpenAI).
fn parse_reset(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(at) = humantime::parse_rfc3339_weak(v) {
        return Some(at.duration_since(now).unwrap_or(Duration::ZERO));
    }
    parse_go_duration(v)
}

fn parse_go_duration(v: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = v;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        total += n * secs;
        rest = &rest[unit_end..];
    }
    (total.is_finite() && total >= 0.0).then(|| Duration::from_secs_f64(total.min(86_400.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn pacer() -> Pacer {
        let g = GaugeVec::new(prometheus::Opts::new("g", "g"), &["provider", "kind"]).unwrap();
        Pacer::new("anthropic", g)
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn go_durations_and_rfc3339_resets_parse() {
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("12ms"), Some(Duration::from_millis(12)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("soon"), None);
        assert_eq!(
            parse_go_duration("99999999999999999999s"),
            Some(Duration::from_secs(86_400))
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = humantime::format_rfc3339(now + Duration::from_secs(30)).to_string();
        assert_eq!(parse_reset(&at, now), Some(Duration::from_secs(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn below_the_threshold_batch_is_spaced_and_interactive_is_not() {
        let p = pacer();
        let h = headers(&[
            ("x-ratelimit-limit-requests", "100"),
            ("x-ratelimit-remaining-requests", "4"),
            ("x-ratelimit-reset-requests", "2s"),
        ]);
        p.observe(&h);
        assert_eq!(p.delay(Priority::Interactive, 0.2), None);
        // 4 calls left over 2 s: one every 500 ms.
        assert_eq!(p.delay(Priority::Batch, 0.2), None);
        assert_eq!(
            p.delay(Priority::Batch, 0.2),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            p.delay(Priority::Background, 0.2),
            Some(Duration::from_millis(1000))
        );
        // Above the threshold nothing waits.
        assert_eq!(p.delay(Priority::Batch, 0.01), None);
        // After the reset nothing waits.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(p.delay(Priority::Batch, 0.2), None);
    }

    /// A reading of 4 requests left of 100 until a reset 2 s away (one slot every 500 ms), and
    /// the first call, sent at once.
    fn four_left_over_two_seconds(p: &Pacer) {
        p.observe(&headers(&[
            ("x-ratelimit-limit-requests", "100"),
            ("x-ratelimit-remaining-requests", "4"),
            ("x-ratelimit-reset-requests", "2s"),
        ]));
        assert!(p.book(Priority::Batch, 0.2).is_none());
    }

    /// A slot given back (its call was shed) is the next call's; one given back after a later
    /// booking stays taken, so no two calls share a slot.
    #[tokio::test(start_paused = true)]
    async fn a_slot_given_back_is_booked_again() {
        let p = pacer();
        four_left_over_two_seconds(&p);
        let shed = p.book(Priority::Batch, 0.2).unwrap();
        assert_eq!(shed.wait, Duration::from_millis(500));
        p.give_back(shed);
        let again = p.book(Priority::Batch, 0.2).unwrap();
        assert_eq!(again.wait, Duration::from_millis(500));
        let later = p.book(Priority::Batch, 0.2).unwrap();
        assert_eq!(later.wait, Duration::from_millis(1000));
        p.give_back(again);
        assert_eq!(
            p.book(Priority::Batch, 0.2).map(|b| b.wait),
            Some(Duration::from_millis(1500))
        );
    }

    /// A held slot is given back when dropped (its call went away during the wait), and kept
    /// once used.
    #[tokio::test(start_paused = true)]
    async fn a_held_slot_dropped_is_given_back_and_one_used_is_not() {
        let p = pacer();
        four_left_over_two_seconds(&p);
        let left = p.book(Priority::Batch, 0.2).unwrap();
        drop(p.hold(left));
        let used = p.book(Priority::Batch, 0.2).unwrap();
        assert_eq!(used.wait, Duration::from_millis(500));
        p.hold(used).used();
        assert_eq!(
            p.book(Priority::Batch, 0.2).map(|b| b.wait),
            Some(Duration::from_millis(1000))
        );
    }

    /// More callers than the limit has left wait for the reset, and no longer: slots spaced
    /// on past it kept them waiting after the limit had come back.
    #[tokio::test(start_paused = true)]
    async fn callers_beyond_what_is_left_wait_for_the_reset_and_no_longer() {
        let p = pacer();
        p.observe(&headers(&[
            ("x-ratelimit-limit-requests", "100"),
            ("x-ratelimit-remaining-requests", "4"),
            ("x-ratelimit-reset-requests", "2s"),
        ]));
        let waits: Vec<Option<Duration>> = (0..7).map(|_| p.delay(Priority::Batch, 0.2)).collect();
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(
            waits,
            [
                None,
                ms(500),
                ms(1000),
                ms(1500),
                ms(2000),
                ms(2000),
                ms(2000)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_nothing_left_every_call_waits_for_the_reset() {
        let p = pacer();
        p.observe(&headers(&[
            ("x-ratelimit-limit-requests", "50"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "8s"),
        ]));
        let waits: Vec<Option<Duration>> = (0..3).map(|_| p.delay(Priority::Batch, 0.2)).collect();
        assert_eq!(waits, [Some(Duration::from_secs(8)); 3]);
        assert_eq!(p.delay(Priority::Interactive, 0.2), None);
    }

    /// The same after calls were paced before: the slots booked then are no place for a
    /// call once nothing is left.
    #[tokio::test(start_paused = true)]
    async fn with_nothing_left_after_pacing_every_call_waits_for_the_reset() {
        let p = pacer();
        four_left_over_two_seconds(&p);
        assert_eq!(
            p.delay(Priority::Batch, 0.2),
            Some(Duration::from_millis(500))
        );
        p.observe(&headers(&[
            ("x-ratelimit-limit-requests", "100"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6s"),
        ]));
        assert_eq!(p.delay(Priority::Batch, 0.2), Some(Duration::from_secs(6)));
    }

    /// After the reset the gauge reads 1 and `/admin/state` shows no reading: both kept the
    /// last low ratio.
    #[tokio::test(start_paused = true)]
    async fn a_reading_is_forgotten_once_its_reset_has_passed() {
        let p = pacer();
        p.observe(&headers(&[
            ("x-ratelimit-limit-requests", "100"),
            ("x-ratelimit-remaining-requests", "2"),
            ("x-ratelimit-reset-requests", "2s"),
        ]));
        let gauge = || p.gauge.with_label_values(&["anthropic", "requests"]).get();
        p.refresh();
        assert_eq!(gauge(), 0.02);
        assert_eq!(p.snapshot()["remaining_ratio"], 0.02);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(p.snapshot(), serde_json::Value::Null);
        assert_eq!(gauge(), 1.0);
    }

    #[test]
    fn the_tightest_limit_wins() {
        let p = pacer();
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "100"),
            ("anthropic-ratelimit-requests-remaining", "90"),
            ("anthropic-ratelimit-tokens-limit", "1000"),
            ("anthropic-ratelimit-tokens-remaining", "50"),
        ]);
        p.observe(&h);
        let snap = p.snapshot();
        assert_eq!(snap["remaining_ratio"], 0.05);
    }
}
