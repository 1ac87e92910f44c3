//! Retry arithmetic: which upstream answers are worth another try, how long to wait (the
//! upstream's `retry-after-ms` / `retry-after`, else capped exponential backoff with jitter,
//! from backon), and the retry budget that keeps retries from multiplying load during an
//! outage. Where to retry is not here: `policy::judge` decides and `proxy::chain` acts, since a
//! retry also chooses between attempts, chain steps and the breaker — which is why the upstream
//! client is not wrapped in tower's `Retry` service.
//!
//! Why the budget is not tower's `TpsBudget` (the same finagle design, 10 s window, a floor
//! per second and a ratio): measured on paused time, tower 0.5.3 forgets its window about
//! twice as fast as it says — when a slot's second has run out by even a little, `expire`
//! clears the next slot and moves two slots on — so a 10 s window with a floor of 10/s granted
//! 500 floor retries in 30 s where this budget grants 300 (`the_floor_refills_once_per_window`).
//! It also counts in whole tokens
//! (a ratio becomes one retry per ⌊1/ratio⌋ requests) and cannot change its ratio on reload
//! without forgetting the window.

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use crate::config::RetryConfig;

/// What one upstream answer means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 1xx–3xx: pass it on.
    Success,
    /// Worth another try (or the next chain step). `provider_fault` says whether it counts
    /// against the upstream's circuit breaker.
    Retryable { provider_fault: bool },
    /// Another try would fail the same way (invalid request, content policy, too large, quota
    /// exhausted): returned to the caller as it is, never routed around.
    Final { provider_fault: bool },
}

/// Classifies an upstream status; `body` is consulted only for 429, where a spend or quota
/// exhaustion (OpenAI `insufficient_quota`, Anthropic `enforced_spend_limit_reached`) must not
/// be retried.
pub fn classify(status: StatusCode, body: &[u8]) -> Verdict {
    let quota = status == StatusCode::TOO_MANY_REQUESTS && crate::api::is_quota_exhaustion(body);
    classify_status(status.as_u16(), quota)
}

/// Classifies an upstream status, `quota` saying whether its body reports an exhausted quota
/// or spend limit (SPEC §6: retry 408, 429 unless quota, 500, 502, 503, 504, 529).
pub fn classify_status(status: u16, quota: bool) -> Verdict {
    match status {
        0..=399 => Verdict::Success,
        429 if quota => Verdict::Final {
            provider_fault: false,
        },
        408 | 429 => Verdict::Retryable {
            provider_fault: false,
        },
        500 | 502 | 503 | 504 | 529 => Verdict::Retryable {
            provider_fault: true,
        },
        500..=599 => Verdict::Final {
            provider_fault: true,
        },
        _ => Verdict::Final {
            provider_fault: false,
        },
    }
}

/// The wait an upstream asked for: `retry-after-ms` (milliseconds, fractional allowed) first,
/// else `retry-after` as seconds or as an HTTP date.
///
/// A wait of zero (`retry-after: 0`, a date already past) is no wait asked for: the backoff
/// applies, as the SDKs read it (wire-protocol §C5), instead of `max_attempts` calls back to
/// back at an upstream that says it is overloaded.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    asked_wait(headers, now).filter(|d| !d.is_zero())
}

fn asked_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && let Some(d) = seconds(ms / 1000.0).filter(|d| !d.is_zero())
    {
        return Some(d);
    }
    let ra = text("retry-after")?;
    if let Ok(secs) = ra.parse::<f64>() {
        return seconds(secs);
    }
    let at = httpdate::parse_http_date(ra).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A non-negative, finite number of seconds as a Duration, capped at a day: an upstream's
/// header must never be able to overflow legate's arithmetic.
fn seconds(s: f64) -> Option<Duration> {
    (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(86_400.0)))
}

/// Capped exponential backoff with jitter, one per request and chain step. backon's jitter
/// adds up to 100% of the delay, so the schedule is built on half the configured delays:
/// each wait falls in [d/2, d) with d = min(base_delay * 2^n, max_delay).
pub struct Backoff(backon::ExponentialBackoff);

impl Backoff {
    pub fn new(cfg: &RetryConfig) -> Self {
        use backon::BackoffBuilder;
        Backoff(
            backon::ExponentialBuilder::default()
                .with_min_delay(cfg.base_delay / 2)
                .with_max_delay(cfg.max_delay / 2)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .build(),
        )
    }

    pub fn next_delay(&mut self) -> Duration {
        self.0.next().unwrap_or_default()
    }
}

/// Retries may add at most `ratio` extra upstream load over a rolling 10 s window, with a
/// floor of 10 retries per second so that a quiet proxy can still retry: the larger of the
/// two, never their sum (which let 100 requests a second retry 30 a second, not 20).
pub struct RetryBudget {
    /// f64 bits, so a config reload can change it without a lock.
    ratio: std::sync::atomic::AtomicU64,
    epoch: Instant,
    slots: Mutex<[Slot; WINDOW_SECS]>,
}

const WINDOW_SECS: usize = 10;
const FLOOR_PER_SEC: f64 = 10.0;

#[derive(Clone, Copy, Default)]
struct Slot {
    second: u64,
    requests: u64,
    retries: u64,
}

impl RetryBudget {
    pub fn new(ratio: f64) -> Self {
        RetryBudget {
            ratio: std::sync::atomic::AtomicU64::new(ratio.to_bits()),
            epoch: Instant::now(),
            slots: Mutex::new([Slot::default(); WINDOW_SECS]),
        }
    }

    fn with_slots<R>(&self, f: impl FnOnce(&mut [Slot; WINDOW_SECS], u64) -> R) -> R {
        self.with_slots_at(Instant::now(), f)
    }

    fn with_slots_at<R>(
        &self,
        at: Instant,
        f: impl FnOnce(&mut [Slot; WINDOW_SECS], u64) -> R,
    ) -> R {
        let now = at.saturating_duration_since(self.epoch).as_secs();
        let mut slots = self.slots.lock();
        let slot = &mut slots[(now % WINDOW_SECS as u64) as usize];
        if slot.second != now {
            *slot = Slot {
                second: now,
                ..Slot::default()
            };
        }
        f(&mut slots, now)
    }

    pub fn set_ratio(&self, ratio: f64) {
        self.ratio
            .store(ratio.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    /// A new request (its first attempt) earns retry credit, in the second of `at` (the
    /// caller's reading of the clock, shared with its deadline check).
    pub fn deposit_at(&self, at: Instant) {
        self.with_slots_at(at, |slots, now| {
            slots[(now % WINDOW_SECS as u64) as usize].requests += 1
        });
    }

    /// Takes one retry from the budget, or says there is none left.
    pub fn try_withdraw(&self) -> bool {
        let ratio = f64::from_bits(self.ratio.load(std::sync::atomic::Ordering::Relaxed));
        self.with_slots(|slots, now| {
            let live = |s: &&Slot| now.saturating_sub(s.second) < WINDOW_SECS as u64;
            let requests: u64 = slots.iter().filter(live).map(|s| s.requests).sum();
            let retries: u64 = slots.iter().filter(live).map(|s| s.retries).sum();
            let allowed = (requests as f64 * ratio).max(FLOOR_PER_SEC * WINDOW_SECS as f64);
            if (retries as f64) < allowed {
                slots[(now % WINDOW_SECS as u64) as usize].retries += 1;
                true
            } else {
                false
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn statuses_are_classified_per_the_failure_policy() {
        let s = |n| StatusCode::from_u16(n).unwrap();
        assert_eq!(classify(s(200), b""), Verdict::Success);
        for n in [408, 429] {
            assert_eq!(
                classify(s(n), b"{}"),
                Verdict::Retryable {
                    provider_fault: false
                }
            );
        }
        for n in [500, 502, 503, 504, 529] {
            assert_eq!(
                classify(s(n), b"{}"),
                Verdict::Retryable {
                    provider_fault: true
                }
            );
        }
        for n in [400, 401, 403, 404, 413, 422] {
            assert_eq!(
                classify(s(n), b"{}"),
                Verdict::Final {
                    provider_fault: false
                }
            );
        }
        assert_eq!(
            classify(s(501), b""),
            Verdict::Final {
                provider_fault: true
            }
        );
    }

    #[test]
    fn quota_exhaustion_is_never_retried() {
        let openai = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let anthropic = br#"{"type":"error","error":{"type":"rate_limit_error","message":"spend limit","details":{"error_code":"enforced_spend_limit_reached"}}}"#;
        let plain =
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
        let s429 = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(
            classify(s429, openai),
            Verdict::Final {
                provider_fault: false
            }
        );
        assert_eq!(
            classify(s429, anthropic),
            Verdict::Final {
                provider_fault: false
            }
        );
        assert_eq!(
            classify(s429, plain),
            Verdict::Retryable {
                provider_fault: false
            }
        );
        assert_eq!(
            classify(s429, b"<html>"),
            Verdict::Retryable {
                provider_fault: false
            }
        );
    }

    #[test]
    fn retry_after_prefers_ms_then_seconds_then_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("5"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(5)));
        h.insert("retry-after-ms", HeaderValue::from_static("300"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(300)));
        let mut h = HeaderMap::new();
        let date = httpdate::fmt_http_date(now + Duration::from_secs(3));
        h.insert("retry-after", HeaderValue::from_str(&date).unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        h.insert(
            "retry-after",
            HeaderValue::from_static("99999999999999999999"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(86_400)));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
        // No wait at all is no wait asked for: the backoff applies.
        for zero in ["0", "0.0"] {
            h.insert("retry-after", HeaderValue::from_static(zero));
            assert_eq!(retry_after(&h, now), None, "{zero}");
        }
        let past = httpdate::fmt_http_date(now - Duration::from_secs(3));
        h.insert("retry-after", HeaderValue::from_str(&past).unwrap());
        assert_eq!(retry_after(&h, now), None);
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", HeaderValue::from_static("0"));
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn backoff_is_capped_and_jittered_below_each_step() {
        let cfg = RetryConfig {
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            ..RetryConfig::default()
        };
        for _ in 0..50 {
            let mut b = Backoff::new(&cfg);
            let mut d = Duration::from_millis(500);
            for _ in 0..10 {
                let got = b.next_delay();
                assert!(
                    got >= d / 2 && got <= d,
                    "{got:?} not in [{:?}, {d:?}]",
                    d / 2
                );
                d = (d * 2).min(cfg.max_delay);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_allows_the_ratio_or_the_floor_then_refuses() {
        let budget = RetryBudget::new(0.2);
        for _ in 0..1000 {
            budget.deposit_at(Instant::now());
        }
        // 1000 requests * 0.2 = 200 retries in the window, above the floor's 10/s * 10 s.
        let granted = (0..400).filter(|_| budget.try_withdraw()).count();
        assert_eq!(granted, 200);
        // Below the floor's load the floor holds: 100 requests * 0.2 is 20, the floor 100.
        tokio::time::advance(Duration::from_secs(11)).await;
        for _ in 0..100 {
            budget.deposit_at(Instant::now());
        }
        let granted = (0..400).filter(|_| budget.try_withdraw()).count();
        assert_eq!(granted, 100);
        // The window rolls on: after it, the floor is available again.
        tokio::time::advance(Duration::from_secs(11)).await;
        let granted = (0..400).filter(|_| budget.try_withdraw()).count();
        assert_eq!(granted, 100);
    }

    /// The floor is 10 retries a second over the 10 s window: with no traffic, asking every
    /// 1.001 s for 30 s gets the floor of one window three times (tower's TpsBudget: 500).
    #[tokio::test(start_paused = true)]
    async fn the_floor_refills_once_per_window() {
        let budget = RetryBudget::new(0.2);
        let mut granted = 0;
        for _ in 0..30 {
            granted += (0..1000).filter(|_| budget.try_withdraw()).count();
            tokio::time::advance(Duration::from_millis(1001)).await;
        }
        assert_eq!(granted, 300);
    }
}
