//! From measurements to table rows: which statistic goes in which row, and which rows are
//! judged against the product targets. A statistic measured once per sample is shown as the
//! median over the samples with their range in parentheses, and judged on the median.

use std::time::Duration;

use crate::Plan;
use crate::client::Api;
use crate::load::Outcome;
use crate::pair::{DIRECT, LEGATE, NGINX};
use crate::phases::{CONCURRENCY, OPEN_CONNECTIONS, RATE, Results, SETTLE};
use crate::phases::{Latency, Sample};
use crate::report::{self, Row};

/// Added latency (p99 at the open-loop rate, stream time to first byte) must stay under this.
const ADDED_LIMIT_MS: f64 = 0.3;
/// Closed-loop throughput through legate, as a share of the bare mock's, must reach this.
const THROUGHPUT_SHARE: f64 = 0.5;
/// legate's CPU per request may be at most this multiple of nginx's.
const CPU_VS_NGINX: f64 = 1.5;
/// legate's resident memory after the run must stay under this many bytes (20 MiB).
const RSS_LIMIT_BYTES: u64 = 20 << 20;
/// Requests legate must have served for the memory target to apply.
const RSS_AFTER_REQUESTS: u64 = 10_000;
/// Cold start to the first `/readyz` 200 must stay under this.
const COLD_START_LIMIT_MS: f64 = 50.0;

/// Median, smallest and largest of per-sample values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    min: f64,
    max: f64,
    n: usize,
}

pub(crate) fn spread(values: &[f64]) -> Option<Spread> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[v.len() - 1],
        n: v.len(),
    })
}

/// `0.470 ms`, or `0.470 ms (0.410–0.520)` over several samples; `sign` prints `+`/`−`.
pub(crate) fn show(s: Option<Spread>, unit: &str, digits: usize, sign: bool) -> String {
    let Some(s) = s else {
        return "n/a".to_owned();
    };
    let f = |x: f64| {
        if sign {
            format!("{x:+.digits$}")
        } else {
            format!("{x:.digits$}")
        }
    };
    if s.n > 1 {
        format!("{}{unit} ({}–{})", f(s.median), f(s.min), f(s.max))
    } else {
        format!("{}{unit}", f(s.median))
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn percentile_ms(o: &Outcome, p: f64) -> f64 {
    let mut samples = o.samples.clone();
    samples.sort_unstable();
    report::percentile(&samples, p).map_or(f64::NAN, ms)
}

/// The open-loop measurement of one API in a sample.
fn of_api(s: &Sample, api: Api) -> &[Latency] {
    match api {
        Api::Messages => &s.latency,
        Api::Responses => &s.responses,
    }
}

fn judge(plan: Plan, ok: Option<bool>) -> Option<bool> {
    if plan.judged { ok } else { None }
}

impl Results {
    fn outcomes(&self) -> impl Iterator<Item = &Outcome> {
        let sampled = self.samples.iter().flat_map(|s| {
            s.latency
                .iter()
                .chain(&s.responses)
                .map(|l| &l.outcome)
                .chain(s.throughput.iter().map(|t| &t.outcome))
        });
        sampled.chain(&self.ttfb).chain(&self.responses_ttfb)
    }

    /// Failed requests anywhere in the run.
    pub(crate) fn failed(&self) -> u64 {
        self.outcomes().map(|o| o.errors).sum::<u64>() + self.warm_errors
    }

    /// The first failure of the run, to explain a non-zero [`Results::failed`].
    pub(crate) fn first_error(&self) -> Option<&str> {
        self.outcomes()
            .find_map(|o| o.first_error.as_deref())
            .or(self.first_warm_error.as_deref())
    }

    /// Per-sample values of `f(sample, side)`.
    fn per_sample(&self, side: usize, f: impl Fn(&Sample, usize) -> f64) -> Vec<f64> {
        self.samples.iter().map(|s| f(s, side)).collect()
    }

    /// Per-sample `f(side) − f(mock)`.
    fn added(&self, side: usize, f: impl Fn(&Sample, usize) -> f64) -> Vec<f64> {
        self.samples
            .iter()
            .map(|s| f(s, side) - f(s, DIRECT))
            .collect()
    }

    /// The results table, in the order the phases ran.
    pub(crate) fn rows(&self, plan: Plan) -> Vec<Row> {
        let mut rows = self.latency_rows(plan, Api::Messages);
        rows.extend(self.ttfb_rows(plan, Api::Messages));
        rows.extend(self.latency_rows(plan, Api::Responses));
        rows.extend(self.ttfb_rows(plan, Api::Responses));
        rows.extend(self.throughput_rows(plan));
        rows.extend(self.memory_rows(plan));
        rows
    }

    fn latency_rows(&self, plan: Plan, api: Api) -> Vec<Row> {
        let at = format!(
            "{} @ {} req/s per side, {OPEN_CONNECTIONS} connections",
            api.path(),
            report::thousands(u64::from(RATE))
        );
        let mut rows = Vec::new();
        for (name, p) in [("p50", 50.0), ("p99", 99.0), ("max", 100.0)] {
            let f = |s: &Sample, side: usize| percentile_ms(&of_api(s, api)[side].outcome, p);
            let cells = (0..self.sides)
                .map(|side| show(spread(&self.per_sample(side, f)), " ms", 3, false))
                .collect();
            let added: Vec<Option<Spread>> = (1..self.sides)
                .map(|side| spread(&self.added(side, f)))
                .collect();
            let row = Row::plain(
                format!("latency {name} {at}"),
                cells,
                added.iter().map(|a| show(*a, " ms", 3, true)).collect(),
            );
            rows.push(if p == 99.0 {
                let legate = added[LEGATE - 1].map(|s| s.median);
                let nginx = added.get(NGINX - 1).and_then(|a| a.map(|s| s.median));
                let clean = self
                    .samples
                    .iter()
                    .all(|s| of_api(s, api).iter().all(|l| l.outcome.errors == 0));
                let met = legate
                    .map(|l| clean && l <= ADDED_LIMIT_MS && nginx.is_none_or(|n| l <= n.max(0.0)));
                row.judged("added ≤ 0.3 ms and ≤ nginx's", judge(plan, met))
            } else {
                row
            });
        }
        let count = |side: usize| {
            let (ok, failed) = self.samples.iter().fold((0, 0), |(ok, failed), s| {
                let o = &of_api(s, api)[side].outcome;
                (ok + o.ok, failed + o.errors)
            });
            format!("{ok} ok / {failed} failed")
        };
        rows.push(Row::plain(
            format!("requests {at}"),
            (0..self.sides).map(count).collect(),
            vec!["—".to_owned(); self.sides - 1],
        ));
        let cpu = |s: &Sample, side: usize| {
            let l = &of_api(s, api)[side];
            ms(l.cpu) / l.all_requests.max(1) as f64
        };
        rows.push(self.cpu_row(plan, format!("proxy CPU per request {at}"), cpu, false));
        rows
    }

    /// CPU per request of each proxy, with legate's as a multiple of nginx's; `judged` rows
    /// carry the target. The mock's own CPU is shown only when it served one side alone.
    fn cpu_row(
        &self,
        plan: Plan,
        metric: String,
        f: impl Fn(&Sample, usize) -> f64 + Copy,
        judged: bool,
    ) -> Row {
        let cells = (0..self.sides)
            .map(|side| {
                if side == DIRECT && !judged {
                    "—".to_owned()
                } else {
                    show(spread(&self.per_sample(side, f)), " ms", 3, false)
                }
            })
            .collect();
        let ratio: Vec<f64> = self
            .samples
            .iter()
            .filter(|_| self.sides > NGINX)
            .map(|s| f(s, LEGATE) / f(s, NGINX))
            .collect();
        let mut added = vec!["—".to_owned(); self.sides - 1];
        let ratio = spread(&ratio);
        if let Some(r) = ratio {
            added[LEGATE - 1] = format!("{} × nginx", show(Some(r), "", 2, false));
        }
        let row = Row::plain(metric, cells, added);
        if judged {
            let met = ratio.map(|r| r.median <= CPU_VS_NGINX);
            row.judged("≤ 1.5 × nginx's", judge(plan, met))
        } else {
            row
        }
    }

    fn ttfb_rows(&self, plan: Plan, api: Api) -> Vec<Row> {
        let ttfb = match api {
            Api::Messages => &self.ttfb,
            Api::Responses => &self.responses_ttfb,
        };
        [("p50", 50.0), ("p99", 99.0)]
            .into_iter()
            .map(|(name, p)| {
                let at: Vec<f64> = ttfb.iter().map(|o| percentile_ms(o, p)).collect();
                let one = |x: f64| show(spread(&[x]), " ms", 3, false);
                let added: Vec<f64> = at.iter().skip(1).map(|x| x - at[DIRECT]).collect();
                let clean = ttfb.iter().all(|o| o.errors == 0);
                let met = clean && added[LEGATE - 1] <= ADDED_LIMIT_MS;
                Row::plain(
                    format!("stream time to first byte {name}, {}", api.path()),
                    at.iter().map(|x| one(*x)).collect(),
                    added
                        .iter()
                        .map(|x| show(spread(&[*x]), " ms", 3, true))
                        .collect(),
                )
                .judged("added ≤ 0.3 ms", judge(plan, Some(met)))
            })
            .collect()
    }

    fn throughput_rows(&self, plan: Plan) -> Vec<Row> {
        let rate = |s: &Sample, side: usize| s.throughput[side].per_second();
        let cells = (0..self.sides)
            .map(|side| show(spread(&self.per_sample(side, rate)), " req/s", 0, false))
            .collect();
        let share = |side: usize| {
            let v: Vec<f64> = self
                .samples
                .iter()
                .map(|s| rate(s, side) / rate(s, DIRECT))
                .collect();
            spread(&v)
        };
        let shares: Vec<Option<Spread>> = (1..self.sides).map(share).collect();
        let legate = shares[LEGATE - 1].map(|s| s.median);
        let nginx = shares.get(NGINX - 1).and_then(|s| s.map(|s| s.median));
        let met = legate.map(|l| l >= THROUGHPUT_SHARE && nginx.is_none_or(|n| l >= n));
        let throughput = Row::plain(
            format!("throughput, {CONCURRENCY} connections, closed loop"),
            cells,
            shares
                .iter()
                .map(|s| format!("{} × mock", show(*s, "", 2, false)))
                .collect(),
        )
        .judged("≥ 0.5 × mock and ≥ nginx", judge(plan, met));
        let cpu = |s: &Sample, side: usize| {
            let t = &s.throughput[side];
            ms(t.cpu) / t.all_requests.max(1) as f64
        };
        let cpu = self.cpu_row(
            plan,
            format!("CPU per request at max load ({CONCURRENCY} connections)"),
            cpu,
            true,
        );
        // Which side of the system-call boundary the CPU went: the proxy's own code (user), or
        // the kernel's work for its system calls and sockets (system).
        let split = |system: bool| {
            move |s: &Sample, side: usize| {
                let t = &s.throughput[side];
                let part = if system {
                    t.system
                } else {
                    t.cpu.saturating_sub(t.system)
                };
                ms(part) / t.all_requests.max(1) as f64
            }
        };
        let user = self.cpu_row(plan, "of which user time".to_owned(), split(false), false);
        let system = self.cpu_row(plan, "of which system time".to_owned(), split(true), false);
        vec![throughput, cpu, user, system]
    }

    fn memory_rows(&self, plan: Plan) -> Vec<Row> {
        let enough = self.served >= RSS_AFTER_REQUESTS;
        let met = enough.then_some(self.settled.rss < RSS_LIMIT_BYTES);
        let legate_only = |value: String| {
            let mut cells = vec!["—".to_owned(); self.sides];
            cells[LEGATE] = value;
            cells
        };
        let dashes = vec!["—".to_owned(); self.sides - 1];
        let cold: Vec<f64> = self.cold_starts.iter().copied().map(ms).collect();
        let cold = spread(&cold);
        let cold_met = cold.map(|c| c.median <= COLD_START_LIMIT_MS);
        vec![
            Row::plain(
                "legate RSS after start-up".to_owned(),
                legate_only(report::mebibytes(self.at_start.rss)),
                dashes.clone(),
            ),
            Row::plain(
                format!(
                    "legate RSS after {} requests, as the load ends",
                    report::thousands(self.served)
                ),
                legate_only(report::mebibytes(self.at_end.rss)),
                dashes.clone(),
            ),
            Row::plain(
                format!("legate RSS {} s after the load", SETTLE.as_secs()),
                legate_only(report::mebibytes(self.settled.rss)),
                dashes.clone(),
            )
            .judged("≤ 20 MiB after 10,000 requests", judge(plan, met)),
            Row::plain(
                "legate peak RSS (VmHWM)".to_owned(),
                legate_only(report::mebibytes(self.settled.peak)),
                dashes.clone(),
            ),
            Row::plain(
                format!(
                    "legate cold start to /readyz 200 ({} starts)",
                    self.cold_starts.len()
                ),
                legate_only(show(cold, " ms", 1, false)),
                dashes,
            )
            .judged("≤ 50 ms", judge(plan, cold_met)),
        ]
    }
}
