//! From measurements to table rows: which statistic goes in which row, and which rows are
//! judged against the product targets.

use std::time::Duration;

use crate::Plan;
use crate::load::Outcome;
use crate::pair::Pair;
use crate::phases::{CONCURRENCY, RATES, Results};
use crate::report::{self, Row};

/// Added latency (p99 at the highest rate, and stream time to first byte) must stay under this.
const ADDED_LIMIT_MS: f64 = 1.0;
/// legate's resident memory after the run must stay under this many bytes (40 MB).
const RSS_LIMIT_BYTES: u64 = 40_000_000;
/// Requests legate must have served for the memory target to apply.
const RSS_AFTER_REQUESTS: u64 = 10_000;

/// Sorted samples of both sides.
struct Sorted {
    direct: Vec<Duration>,
    legate: Vec<Duration>,
}

impl Sorted {
    fn of(pair: &Pair<Outcome>) -> Sorted {
        let sort = |o: &Outcome| {
            let mut samples = o.samples.clone();
            samples.sort_unstable();
            samples
        };
        Sorted {
            direct: sort(&pair.direct),
            legate: sort(&pair.legate),
        }
    }

    fn at(&self, p: f64) -> (Option<Duration>, Option<Duration>) {
        (
            report::percentile(&self.direct, p),
            report::percentile(&self.legate, p),
        )
    }

    /// A row for percentile `p`, with the legate − direct difference.
    fn row(&self, metric: String, p: f64) -> Row {
        let (d, l) = self.at(p);
        Row::plain(metric, report::ms(d), report::ms(l), report::added_ms(d, l))
    }

    /// Whether the added time at percentile `p` is under the limit, with no failed request.
    fn added_under_limit(&self, p: f64, pair: &Pair<Outcome>) -> bool {
        let (d, l) = self.at(p);
        let clean = pair.direct.errors == 0 && pair.legate.errors == 0;
        clean && report::signed_diff_ms(d, l).is_some_and(|added| added < ADDED_LIMIT_MS)
    }
}

impl Results {
    /// Failed requests anywhere in the run.
    pub(crate) fn failed(&self) -> u64 {
        let pairs = self
            .latency
            .iter()
            .map(|(_, pair)| pair)
            .chain([&self.ttfb]);
        let measured: u64 = pairs.map(|p| p.direct.errors + p.legate.errors).sum();
        let throughput =
            self.throughput.direct.outcome.errors + self.throughput.legate.outcome.errors;
        measured + throughput + self.warm_errors
    }

    /// The first failure of the run, to explain a non-zero [`Results::failed`].
    pub(crate) fn first_error(&self) -> Option<&str> {
        let pairs = self
            .latency
            .iter()
            .map(|(_, pair)| pair)
            .chain([&self.ttfb]);
        pairs
            .flat_map(|p| [&p.direct, &p.legate])
            .chain([
                &self.throughput.direct.outcome,
                &self.throughput.legate.outcome,
            ])
            .find_map(|o| o.first_error.as_deref())
            .or(self.first_warm_error.as_deref())
    }

    /// The results table, in the order the phases ran.
    pub(crate) fn rows(&self, plan: Plan) -> Vec<Row> {
        let mut rows = Vec::new();
        for (rate, pair) in &self.latency {
            rows.extend(latency_rows(plan, *rate, pair));
        }
        rows.extend(self.ttfb_rows(plan));
        rows.push(self.throughput_row());
        rows.extend(self.memory_rows(plan));
        rows
    }

    fn ttfb_rows(&self, plan: Plan) -> Vec<Row> {
        let sorted = Sorted::of(&self.ttfb);
        let target = "added < 1 ms";
        [50.0, 99.0]
            .into_iter()
            .map(|p| {
                let met = plan.judged.then(|| sorted.added_under_limit(p, &self.ttfb));
                sorted
                    .row(format!("stream time to first byte p{p}"), p)
                    .judged(target, met)
            })
            .collect()
    }

    fn throughput_row(&self) -> Row {
        let (d, l) = (
            self.throughput.direct.per_second(),
            self.throughput.legate.per_second(),
        );
        let change = if d > 0.0 {
            format!("{:+.1} %", (l - d) / d * 100.0)
        } else {
            "n/a".to_owned()
        };
        Row::plain(
            format!("throughput, {CONCURRENCY} concurrent, closed loop"),
            format!("{} req/s", report::thousands(d.round() as u64)),
            format!("{} req/s", report::thousands(l.round() as u64)),
            change,
        )
    }

    fn memory_rows(&self, plan: Plan) -> Vec<Row> {
        let enough = self.served >= RSS_AFTER_REQUESTS;
        let met = (plan.judged && enough).then_some(self.at_end.rss < RSS_LIMIT_BYTES);
        vec![
            Row::plain(
                "legate RSS after start-up".to_owned(),
                "—".to_owned(),
                report::megabytes(self.at_start.rss),
                "—".to_owned(),
            ),
            Row::plain(
                format!(
                    "legate RSS after {} requests",
                    report::thousands(self.served)
                ),
                "—".to_owned(),
                report::megabytes(self.at_end.rss),
                "—".to_owned(),
            )
            .judged("< 40 MB after 10,000 requests", met),
            Row::plain(
                "legate peak RSS (VmHWM)".to_owned(),
                "—".to_owned(),
                report::megabytes(self.at_end.peak),
                "—".to_owned(),
            ),
        ]
    }
}

/// p50, p99 (judged at the highest rate), max and request counts at one open-loop rate.
fn latency_rows(plan: Plan, rate: u32, pair: &Pair<Outcome>) -> Vec<Row> {
    let sorted = Sorted::of(pair);
    let rate_name = format!("{} req/s per side", report::thousands(u64::from(rate)));
    let judged_rate = RATES.last().is_some_and(|&last| last == rate);
    let mut p99 = sorted.row(format!("latency p99 @ {rate_name}"), 99.0);
    if judged_rate {
        let met = plan.judged.then(|| sorted.added_under_limit(99.0, pair));
        p99 = p99.judged("added < 1 ms", met);
    }
    let (max_d, max_l) = sorted.at(100.0);
    let count = |o: &Outcome| format!("{} ok / {} failed", o.ok, o.errors);
    vec![
        sorted.row(format!("latency p50 @ {rate_name}"), 50.0),
        p99,
        Row::plain(
            format!("latency max @ {rate_name}"),
            report::ms(max_d),
            report::ms(max_l),
            "—".to_owned(),
        ),
        Row::plain(
            format!("requests @ {rate_name}"),
            count(&pair.direct),
            count(&pair.legate),
            "—".to_owned(),
        ),
    ]
}
