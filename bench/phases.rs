//! The order of the run: preflight, latency at each fixed rate, stream time to first byte,
//! throughput, then enough extra requests for the memory reading. Every phase mixes the two
//! sides in ABBA order, request by request where the load shape allows it (open loop, streams)
//! and slice by slice where it does not (closed loop), so the machine's noise falls on both.

use std::time::Duration;

use crate::Plan;
use crate::children::{self, Memory};
use crate::client::{self, Client, Target};
use crate::error::BenchError;
use crate::load::{self, Outcome, Split};
use crate::pair::{Pair, Side, interleaved, order};
use crate::report;

/// Open-loop rates, requests per second; the last one carries the latency target.
pub(crate) const RATES: [u32; 2] = [200, 1_000];
/// Workers in the closed-loop throughput phase.
pub(crate) const CONCURRENCY: usize = 32;
/// Requests [`preflight`] sends through legate.
const PREFLIGHT_REQUESTS: u64 = 2;
/// Upper bound on the extra throughput-slice rounds run to reach `Plan::min_requests`.
const MAX_TOP_UP_ROUNDS: u32 = 600;

/// Requests carried by closed-loop throughput slices on one side.
#[derive(Debug, Default)]
pub(crate) struct Throughput {
    pub outcome: Outcome,
    pub elapsed: Duration,
}

impl Throughput {
    pub(crate) fn per_second(&self) -> f64 {
        self.outcome.ok as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// Everything measured in one run.
#[derive(Debug)]
pub(crate) struct Results {
    pub latency: Vec<(u32, Pair<Outcome>)>,
    pub ttfb: Pair<Outcome>,
    pub throughput: Pair<Throughput>,
    /// Successful requests legate served in the whole run, warm-ups included.
    pub served: u64,
    /// Requests that failed during warm-ups (measured failures are in the outcomes).
    pub warm_errors: u64,
    pub first_warm_error: Option<String>,
    pub at_start: Memory,
    pub at_end: Memory,
}

/// Running count of what legate served and what failed outside the measurements.
#[derive(Default)]
struct Tally {
    served: u64,
    warm_errors: u64,
    first_warm_error: Option<String>,
}

impl Tally {
    fn warm(&mut self, side: Side, outcome: &Outcome) {
        self.warm_errors += outcome.errors;
        if self.first_warm_error.is_none() {
            self.first_warm_error.clone_from(&outcome.first_error);
        }
        self.measured(side, outcome);
    }

    /// Counts a split slice and returns its measured part.
    fn split(&mut self, side: Side, split: Split) -> Outcome {
        self.warm(side, &split.lead_in);
        self.measured(side, &split.measured);
        split.measured
    }

    fn measured(&mut self, side: Side, outcome: &Outcome) {
        if matches!(side, Side::Legate) {
            self.served += outcome.ok;
        }
    }
}

/// One plain and one streaming request to each side, so a broken setup fails with a clear
/// message before any measurement.
pub(crate) async fn preflight(client: &Client, targets: &Pair<Target>) -> Result<(), BenchError> {
    for target in [&targets.direct, &targets.legate] {
        let failed = |e: BenchError| BenchError::Preflight {
            target: target.label,
            detail: e.to_string(),
        };
        client::complete(client, target.message(false)?)
            .await
            .map_err(failed)?;
        client::first_byte(client, target.message(true)?)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

/// Runs every phase in order and reads legate's memory at the end.
pub(crate) async fn all(
    plan: Plan,
    client: &Client,
    targets: &Pair<Target>,
    legate_pid: u32,
    at_start: Memory,
) -> Result<Results, BenchError> {
    let mut tally = Tally {
        served: PREFLIGHT_REQUESTS,
        ..Tally::default()
    };
    let mut latency = Vec::new();
    for rate in RATES {
        let pair = latency_at(plan, client, targets, rate, &mut tally).await?;
        latency.push((rate, pair));
    }
    let ttfb = streams(plan, client, targets, &mut tally).await?;
    let throughput = throughput(plan, client, targets, &mut tally).await?;
    top_up(plan, client, &targets.legate, &mut tally).await?;
    let at_end = children::memory(legate_pid)?;
    eprintln!(
        "bench: legate served {} requests; RSS {} (peak {})",
        tally.served,
        report::megabytes(at_end.rss),
        report::megabytes(at_end.peak)
    );
    Ok(Results {
        latency,
        ttfb,
        throughput,
        served: tally.served,
        warm_errors: tally.warm_errors,
        first_warm_error: tally.first_warm_error,
        at_start,
        at_end,
    })
}

fn rounds(total: Duration, slice: Duration) -> u64 {
    let n = (total.as_secs_f64() / slice.as_secs_f64().max(1e-3)).round();
    (n as u64).max(1)
}

async fn latency_at(
    plan: Plan,
    client: &Client,
    targets: &Pair<Target>,
    rate: u32,
    tally: &mut Tally,
) -> Result<Pair<Outcome>, BenchError> {
    eprintln!("bench: open loop at {rate} req/s per side, interleaved");
    let split = load::open_loop(client, targets, rate, plan.warmup, plan.per_rate).await?;
    let result = Pair {
        direct: tally.split(Side::Direct, split.direct),
        legate: tally.split(Side::Legate, split.legate),
    };
    eprintln!(
        "bench:   {} + {} requests measured, worst scheduler lag {:?}",
        result.direct.ok + result.direct.errors,
        result.legate.ok + result.legate.errors,
        result.direct.worst_lag.max(result.legate.worst_lag)
    );
    Ok(result)
}

async fn streams(
    plan: Plan,
    client: &Client,
    targets: &Pair<Target>,
    tally: &mut Tally,
) -> Result<Pair<Outcome>, BenchError> {
    eprintln!(
        "bench: {} sequential streams per side, time to first byte",
        plan.streams
    );
    let mut result: Pair<Outcome> = Pair::default();
    let total = 2 * u64::from(plan.stream_warmup + plan.streams);
    for k in 0..total {
        let side = interleaved(k);
        let one = load::stream_ttfb(client, targets.get(side), 1).await?;
        if k < 2 * u64::from(plan.stream_warmup) {
            tally.warm(side, &one);
        } else {
            tally.measured(side, &one);
            result.get_mut(side).absorb(one);
        }
    }
    Ok(result)
}

async fn throughput(
    plan: Plan,
    client: &Client,
    targets: &Pair<Target>,
    tally: &mut Tally,
) -> Result<Pair<Throughput>, BenchError> {
    eprintln!("bench: closed loop, {CONCURRENCY} concurrent requests");
    for side in order(0) {
        let target = targets.get(side);
        let (warm, _) =
            load::closed_loop(client, target, CONCURRENCY, plan.warmup, Duration::ZERO).await?;
        tally.split(side, warm);
    }
    let mut result: Pair<Throughput> = Pair::default();
    for round in 0..rounds(plan.throughput, plan.throughput_slice) {
        for side in order(round) {
            let target = targets.get(side);
            let (lead_in, length) = (plan.lead_in, plan.throughput_slice);
            let (slice, elapsed) =
                load::closed_loop(client, target, CONCURRENCY, lead_in, length).await?;
            let measured = tally.split(side, slice);
            let total = result.get_mut(side);
            total.outcome.absorb(measured);
            total.elapsed += elapsed;
        }
    }
    eprintln!(
        "bench:   {:.0} req/s direct, {:.0} req/s via legate",
        result.direct.per_second(),
        result.legate.per_second()
    );
    Ok(result)
}

/// More closed-loop requests through legate until it has served `plan.min_requests`.
async fn top_up(
    plan: Plan,
    client: &Client,
    legate: &Target,
    tally: &mut Tally,
) -> Result<(), BenchError> {
    let mut round = 0;
    while tally.served < plan.min_requests && round < MAX_TOP_UP_ROUNDS {
        let length = plan.throughput_slice;
        let (extra, _) =
            load::closed_loop(client, legate, CONCURRENCY, Duration::ZERO, length).await?;
        tally.split(Side::Legate, extra);
        round += 1;
    }
    Ok(())
}
