//! One circuit breaker per upstream (provider + model). Closed: outcomes are kept for a rolling
//! window and it opens when at least `min_calls` calls saw `failure_ratio` failures. Open:
//! calls are refused without touching the upstream. After `open_for`: exactly one probe passes,
//! however many callers arrive; its success closes the breaker, its failure reopens it for
//! twice as long (up to `max_open_for`). Only provider-side failures count; callers' mistakes,
//! 429s and disconnects are neutral.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus::IntGaugeVec;
use tokio::time::Instant;

use crate::config::BreakerConfig;
use crate::lru::Lru;

/// Breakers of models that are not configured by their exact name (callers may send any model
/// name to a default route, or any snapshot name under a configured `*` pattern) are kept for
/// at most this many upstreams, the least recently used forgotten first. Exactly configured
/// models' breakers are bounded by the config and never forgotten.
const MAX_UNCONFIGURED_BREAKERS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { probe_out: bool },
}

impl State {
    fn gauge(self) -> i64 {
        match self {
            State::Closed => 0,
            State::Open { .. } => 1,
            State::HalfOpen { .. } => 2,
        }
    }
}

struct Inner {
    state: State,
    open_for: Duration,
    /// Closed-state outcomes inside the rolling window.
    outcomes: Window,
}

pub struct Breaker {
    /// Shared by all breakers and swapped on config reload.
    cfg: Arc<ArcSwap<BreakerConfig>>,
    inner: Mutex<Inner>,
    gauge: Option<prometheus::IntGauge>,
}

/// The answer to "may I call this upstream now?".
pub enum Admission {
    /// Go ahead; report the outcome on the ticket.
    Pass(Ticket),
    /// Refused; the earliest time a probe may pass.
    Refused { until: Instant },
}

/// A call admitted by a breaker. Exactly one outcome is reported; dropping it unreported (the
/// caller went away, the request was cancelled) is neutral and frees a probe slot.
pub struct Ticket {
    breaker: Option<Arc<Breaker>>,
    probe: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    Neutral,
}

impl Ticket {
    /// A ticket for an upstream without a breaker.
    pub fn unguarded() -> Self {
        Ticket {
            breaker: None,
            probe: false,
        }
    }

    /// The answer is committed (a stream's first content arrived). A probe has then proven the
    /// upstream: its success is given now, so other callers are not refused for the whole
    /// length of the stream; what the stream does afterwards counts as an ordinary call.
    pub fn committed(mut self) -> Ticket {
        if self.probe {
            if let Some(b) = self.breaker.take() {
                b.record(true, Outcome::Success);
                return Ticket {
                    breaker: Some(b),
                    probe: false,
                };
            }
        }
        self
    }

    pub fn report(mut self, outcome: Outcome) {
        if let Some(b) = self.breaker.take() {
            b.record(self.probe, outcome);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(b) = self.breaker.take() {
            b.record(self.probe, Outcome::Neutral);
        }
    }
}

impl Breaker {
    pub fn new(cfg: Arc<ArcSwap<BreakerConfig>>, gauge: Option<prometheus::IntGauge>) -> Self {
        let open_for = cfg.load().open_for;
        Breaker {
            cfg,
            inner: Mutex::new(Inner {
                state: State::Closed,
                open_for,
                outcomes: Window::default(),
            }),
            gauge,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    fn set(&self, inner: &mut Inner, state: State) {
        inner.state = state;
        if let Some(g) = &self.gauge {
            g.set(state.gauge());
        }
    }

    pub fn state(&self) -> State {
        self.lock().state
    }

    /// Whether [`Breaker::admit`] would let a call through now, without taking its probe.
    pub fn would_admit(&self) -> bool {
        match self.lock().state {
            State::Closed | State::HalfOpen { probe_out: false } => true,
            State::Open { until } => Instant::now() >= until,
            State::HalfOpen { probe_out: true } => false,
        }
    }

    pub fn admit(self: &Arc<Self>) -> Admission {
        let now = Instant::now();
        let mut inner = self.lock();
        let probe = match inner.state {
            State::Closed => false,
            State::Open { until } if now < until => return Admission::Refused { until },
            State::Open { .. } | State::HalfOpen { probe_out: false } => {
                self.set(&mut inner, State::HalfOpen { probe_out: true });
                true
            }
            // The probe is out: others wait for its verdict (a short, honest guess).
            State::HalfOpen { probe_out: true } => {
                return Admission::Refused {
                    until: now + Duration::from_secs(1),
                };
            }
        };
        Admission::Pass(Ticket {
            breaker: Some(self.clone()),
            probe,
        })
    }

    fn record(&self, probe: bool, outcome: Outcome) {
        let cfg = self.cfg.load();
        let now = Instant::now();
        let mut inner = self.lock();
        if probe {
            match outcome {
                Outcome::Success => {
                    inner.outcomes.clear();
                    inner.open_for = cfg.open_for;
                    self.set(&mut inner, State::Closed);
                }
                Outcome::Failure => {
                    let open_for = (inner.open_for * 2).min(cfg.max_open_for);
                    inner.open_for = open_for;
                    self.set(
                        &mut inner,
                        State::Open {
                            until: now + open_for,
                        },
                    );
                }
                Outcome::Neutral => self.set(&mut inner, State::HalfOpen { probe_out: false }),
            }
            return;
        }
        if inner.state != State::Closed || outcome == Outcome::Neutral {
            return;
        }
        inner
            .outcomes
            .record(now, outcome == Outcome::Failure, cfg.window);
        let (calls, failures) = (inner.outcomes.calls, inner.outcomes.failures);
        if calls >= u64::from(cfg.min_calls) && failures as f64 >= cfg.failure_ratio * calls as f64
        {
            inner.outcomes.clear();
            let open_for = cfg.open_for;
            inner.open_for = open_for;
            self.set(
                &mut inner,
                State::Open {
                    until: now + open_for,
                },
            );
        }
    }
}

/// Outcomes of a rolling window, kept in slices of at most `SLICE` with running totals: the
/// work and memory per call stay constant however many calls the window holds (a per-call list
/// rescanned on every call made the breaker the proxy's bottleneck under load).
#[derive(Default)]
struct Window {
    slices: VecDeque<Slice>,
    calls: u64,
    failures: u64,
}

struct Slice {
    start: Instant,
    calls: u64,
    failures: u64,
}

/// The window's resolution: an outcome leaves it at most this much late.
const SLICE: Duration = Duration::from_millis(100);

impl Window {
    fn record(&mut self, now: Instant, failed: bool, window: Duration) {
        let failed = u64::from(failed);
        match self.slices.back_mut() {
            Some(s) if now.duration_since(s.start) < SLICE => {
                s.calls += 1;
                s.failures += failed;
            }
            _ => self.slices.push_back(Slice {
                start: now,
                calls: 1,
                failures: failed,
            }),
        }
        self.calls += 1;
        self.failures += failed;
        while let Some(front) = self.slices.front() {
            if now.duration_since(front.start) <= window {
                break;
            }
            self.calls -= front.calls;
            self.failures -= front.failures;
            self.slices.pop_front();
        }
    }

    fn clear(&mut self) {
        *self = Window::default();
    }
}

/// Breakers of exactly configured models, and a bounded set of the others.
struct Map {
    /// Fx-hashed: only `provider:model` pairs whose model the config names exactly are
    /// inserted here (callers' other names, those a `*` pattern matches included, go to the
    /// bounded, SipHash-keyed `others`).
    configured: HashMap<String, Arc<Breaker>>,
    others: Lru<String, Arc<Breaker>>,
    /// Where `provider:model` is written for a lookup: reused, so that finding an existing
    /// breaker (every request but the first of an upstream) allocates nothing.
    key: String,
}

/// The largest lookup buffer `Map::key` keeps between lookups.
const MAX_KEPT_KEY: usize = 256;

/// All breakers of the process, keyed by `provider:model`. They outlive config reloads.
pub struct Breakers {
    cfg: Arc<ArcSwap<BreakerConfig>>,
    map: Mutex<Map>,
    gauge: IntGaugeVec,
}

impl Breakers {
    pub fn new(cfg: BreakerConfig, gauge: IntGaugeVec) -> Self {
        Breakers {
            cfg: Arc::new(ArcSwap::from_pointee(cfg)),
            map: Mutex::new(Map {
                configured: HashMap::default(),
                others: Lru::new(MAX_UNCONFIGURED_BREAKERS),
                key: String::new(),
            }),
            gauge,
        }
    }

    /// Applies a reloaded `[breaker]` to every breaker, existing and future. Their states and
    /// windows carry over: an upstream's health does not reset with the config.
    pub fn set_config(&self, cfg: BreakerConfig) {
        self.cfg.store(Arc::new(cfg));
    }

    /// The breaker of `provider:model`; `model_label` is the bounded metric label.
    pub fn get(&self, provider: &str, model: &str, model_label: &str) -> Option<Arc<Breaker>> {
        // The label is the model itself only for a name the config spells out; a name that a
        // `*` pattern matches is the caller's choice, as unbounded as an unknown one.
        let exact = model_label == model && !crate::names::is_pattern(model);
        let mut map = self.map.lock();
        let Map {
            configured,
            others,
            key,
        } = &mut *map;
        if key.capacity() > MAX_KEPT_KEY {
            // A caller's huge model name must not keep its buffer for the process's life.
            *key = String::new();
        }
        key.clear();
        key.push_str(provider);
        key.push(':');
        key.push_str(model);
        if exact {
            if let Some(b) = configured.get(key.as_str()) {
                return Some(b.clone());
            }
            // Only configured models get their own gauge series; others would be unbounded.
            let g = self.gauge.with_label_values(&[provider, model_label]);
            g.set(0);
            let b = Arc::new(Breaker::new(self.cfg.clone(), Some(g)));
            configured.insert(key.clone(), b.clone());
            return Some(b);
        }
        if let Some(b) = others.touch(key.as_str()) {
            return Some(b.clone());
        }
        let gauge = (model_label != "other").then(|| {
            let g = self.gauge.with_label_values(&[provider, model_label]);
            g.set(0);
            g
        });
        let (b, _) = others.entry(key, || Arc::new(Breaker::new(self.cfg.clone(), gauge)));
        Some(b.clone())
    }

    pub fn snapshot(&self) -> Vec<(String, State)> {
        let map = self.map.lock();
        let mut out: Vec<(String, State)> = map
            .configured
            .iter()
            .chain(map.others.iter())
            .map(|(k, b)| (k.clone(), b.state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            window: Duration::from_secs(30),
            min_calls: 4,
            failure_ratio: 0.5,
            open_for: Duration::from_secs(10),
            max_open_for: Duration::from_secs(25),
        }
    }

    /// A breaker on `cfg()`, with no state gauge.
    fn breaker() -> Arc<Breaker> {
        Arc::new(Breaker::new(Arc::new(ArcSwap::from_pointee(cfg())), None))
    }

    fn pass(b: &Arc<Breaker>) -> Ticket {
        match b.admit() {
            Admission::Pass(t) => t,
            Admission::Refused { .. } => panic!("refused"),
        }
    }

    fn refused(b: &Arc<Breaker>) -> bool {
        matches!(b.admit(), Admission::Refused { .. })
    }

    fn trip(b: &Arc<Breaker>) {
        for _ in 0..4 {
            pass(b).report(Outcome::Failure);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_trips_below_min_calls() {
        let b = breaker();
        for _ in 0..3 {
            pass(&b).report(Outcome::Failure);
        }
        assert_eq!(b.state(), State::Closed);
        pass(&b).report(Outcome::Failure);
        assert!(matches!(b.state(), State::Open { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn neutral_outcomes_never_trip_it() {
        let b = breaker();
        for _ in 0..100 {
            pass(&b).report(Outcome::Neutral);
            drop(pass(&b));
        }
        assert_eq!(b.state(), State::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn old_outcomes_leave_the_window() {
        let b = breaker();
        for _ in 0..3 {
            pass(&b).report(Outcome::Failure);
        }
        tokio::time::advance(Duration::from_secs(31)).await;
        pass(&b).report(Outcome::Failure);
        assert_eq!(b.state(), State::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn admits_exactly_one_probe_after_open_for() {
        let b = breaker();
        trip(&b);
        assert!(refused(&b));
        tokio::time::advance(Duration::from_secs(10)).await;
        let probe = pass(&b);
        for _ in 0..20 {
            assert!(refused(&b), "only one probe at a time");
        }
        probe.report(Outcome::Success);
        assert_eq!(b.state(), State::Closed);
        pass(&b).report(Outcome::Success);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_with_the_timer_doubled_up_to_the_cap() {
        let b = breaker();
        trip(&b);
        tokio::time::advance(Duration::from_secs(10)).await;
        pass(&b).report(Outcome::Failure);
        tokio::time::advance(Duration::from_secs(19)).await;
        assert!(refused(&b), "20 s after a failed probe, not 10");
        tokio::time::advance(Duration::from_secs(1)).await;
        pass(&b).report(Outcome::Failure);
        tokio::time::advance(Duration::from_secs(24)).await;
        assert!(refused(&b), "capped at max_open_for = 25 s");
        tokio::time::advance(Duration::from_secs(1)).await;
        pass(&b).report(Outcome::Success);
        assert_eq!(b.state(), State::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_probe_closes_the_breaker_at_its_first_content() {
        let b = breaker();
        trip(&b);
        tokio::time::advance(Duration::from_secs(10)).await;
        let stream = pass(&b).committed();
        assert_eq!(b.state(), State::Closed);
        pass(&b).report(Outcome::Success);
        // A failure later in that stream is an ordinary failure in the window.
        stream.report(Outcome::Failure);
        assert_eq!(b.state(), State::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_probe_lets_the_next_caller_probe() {
        let b = breaker();
        trip(&b);
        tokio::time::advance(Duration::from_secs(10)).await;
        drop(pass(&b));
        assert_eq!(b.state(), State::HalfOpen { probe_out: false });
        pass(&b).report(Outcome::Success);
        assert_eq!(b.state(), State::Closed);
    }
}
