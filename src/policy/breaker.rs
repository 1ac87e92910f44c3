//! One circuit breaker per upstream (provider + model). Closed: outcomes are kept for a rolling
//! window and it opens when at least `min_calls` calls saw `failure_ratio` failures. Open:
//! calls are refused without touching the upstream. After `open_for`: exactly one probe passes,
//! however many callers arrive; its success closes the breaker, its failure reopens it for
//! twice as long (up to `max_open_for`). Only provider-side failures count; callers' mistakes,
//! 429s and disconnects are neutral. The breakers of a process are kept in `breakers`.

use std::collections::VecDeque;

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus::IntGauge;
use tokio::time::Instant;

use crate::config::BreakerConfig;

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

/// Where a breaker shows its state in `legate_breaker_state`.
pub enum Series {
    /// A model labelled `other`: no series (its names are the callers' and unbounded).
    None,
    /// An exactly configured model: the series is this breaker's alone.
    Own(IntGauge),
    /// A name a configured `*` pattern matches: the pattern's series, shared with every other
    /// breaker under that pattern.
    Shared(Arc<SharedSeries>),
}

/// The series of one `(provider, pattern)` label. It shows the worst state among the live
/// breakers under the pattern: open if any is open, else half-open if any is, else closed. A
/// series that each breaker set to its own state showed whichever wrote last (a new breaker's
/// closed hid an open one). The breakers in each state are counted, changed only when a
/// breaker's state changes or it is dropped, never per call.
pub struct SharedSeries {
    gauge: IntGauge,
    /// Live breakers open, and half-open.
    counts: Mutex<[u32; 2]>,
}

impl SharedSeries {
    pub fn new(gauge: IntGauge) -> Self {
        gauge.set(0);
        SharedSeries {
            gauge,
            counts: Mutex::new([0, 0]),
        }
    }

    /// One breaker under the pattern went from `was` to `now`.
    fn moved(&self, was: State, now: State) {
        let slot = |s: State| match s {
            State::Closed => None,
            State::Open { .. } => Some(0),
            State::HalfOpen { .. } => Some(1),
        };
        let (from, to) = (slot(was), slot(now));
        if from == to {
            return;
        }
        let mut counts = self.counts.lock();
        if let Some(i) = from {
            counts[i] = counts[i].saturating_sub(1);
        }
        if let Some(i) = to {
            counts[i] += 1;
        }
        // The values of `State::gauge`: 1 open, 2 half-open, 0 closed.
        let worst = match *counts {
            [open, _] if open > 0 => 1,
            [_, half_open] if half_open > 0 => 2,
            _ => 0,
        };
        self.gauge.set(worst);
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
    series: Series,
}

impl Drop for Breaker {
    /// A breaker forgotten (the least recently used of the unconfigured ones) no longer counts
    /// in its pattern's series.
    fn drop(&mut self) {
        if let Series::Shared(s) = &self.series {
            s.moved(self.inner.get_mut().state, State::Closed);
        }
    }
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

impl Ticket {
    /// This call is its half-open breaker's one probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
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
        if self.probe
            && let Some(b) = self.breaker.take()
        {
            b.record(true, Outcome::Success, Instant::now());
            return Ticket {
                breaker: Some(b),
                probe: false,
            };
        }
        self
    }

    pub fn report(self, outcome: Outcome) {
        self.report_at(outcome, Instant::now());
    }

    /// `report`, with the caller's reading of the clock.
    pub fn report_at(mut self, outcome: Outcome, now: Instant) {
        if let Some(b) = self.breaker.take() {
            b.record(self.probe, outcome, now);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(b) = self.breaker.take() {
            b.record(self.probe, Outcome::Neutral, Instant::now());
        }
    }
}

impl Breaker {
    pub fn new(cfg: Arc<ArcSwap<BreakerConfig>>, series: Series) -> Self {
        let open_for = cfg.load().open_for;
        Breaker {
            cfg,
            inner: Mutex::new(Inner {
                state: State::Closed,
                open_for,
                outcomes: Window::default(),
            }),
            series,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    fn set(&self, inner: &mut Inner, state: State) {
        let was = std::mem::replace(&mut inner.state, state);
        match &self.series {
            Series::None => {}
            Series::Own(g) => g.set(state.gauge()),
            Series::Shared(s) => s.moved(was, state),
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
        self.admit_at(Instant::now())
    }

    /// `admit`, with the caller's reading of the clock.
    pub fn admit_at(self: &Arc<Self>, now: Instant) -> Admission {
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

    fn record(&self, probe: bool, outcome: Outcome, now: Instant) {
        let cfg = self.cfg.load();
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
        Arc::new(Breaker::new(
            Arc::new(ArcSwap::from_pointee(cfg())),
            Series::None,
        ))
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
