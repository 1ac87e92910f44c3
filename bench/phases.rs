//! The order of the run: preflight, latency at each fixed rate, stream time to first byte,
//! throughput, then enough extra requests for the memory reading. Every phase alternates
//! between the two targets in ABBA order (direct, legate, legate, direct, …) so drift in the
//! machine's load falls evenly on both sides.

use std::time::Duration;

use crate::Plan;
use crate::children::{self, Memory};
use crate::client::{self, Client, Target};
use crate::error::BenchError;
use crate::load::{self, Outcome};

/// Open-loop rates, requests per second; the last one carries the latency target.
pub const RATES: [u32; 2] = [200, 1_000];
/// Workers in the closed-loop throughput phase.
pub const CONCURRENCY: usize = 32;
/// Upper bound on the extra throughput-slice rounds run to reach `Plan::min_requests`.
const MAX_TOP_UP_ROUNDS: u32 = 600;

/// The same thing for each side of the comparison.
#[derive(Debug, Default)]
pub struct Pair<T> {
    pub direct: T,
    pub legate: T,
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Direct,
    Legate,
}

impl<T> Pair<T> {
    fn get(&self, side: Side) -> &T {
        match side {
            Side::Direct => &self.direct,
            Side::Legate => &self.legate,
        }
    }

    fn get_mut(&mut self, side: Side) -> &mut T {
        match side {
            Side::Direct => &mut self.direct,
            Side::Legate => &mut self.legate,
        }
    }
}

/// ABBA: which side goes first alternates every round.
fn order(round: u32) -> [Side; 2] {
    if round % 2 == 0 {
        [Side::Direct, Side::Legate]
    } else {
        [Side::Legate, Side::Direct]
    }
}

/// Requests carried by closed-loop throughput slices on one side.
#[derive(Debug, Default)]
pub struct Throughput {
    pub outcome: Outcome,
    pub elapsed: Duration,
}

impl Throughput {
    pub fn per_second(&self) -> f64 {
        self.outcome.ok as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// Everything measured in one run.
#[derive(Debug)]
pub struct Results {
    pub latency: Vec<(u32, Pair<Outcome>)>,
    pub ttfb: Pair<Outcome>,
    pub throughput: Pair<Throughput>,
    /// Successful requests legate served in the whole run, warm-ups included.
    pub served: u64,
    /// Requests that failed during warm-ups (measured failures are in the outcomes).
    pub warm_errors: u64,
    pub at_start: Memory,
    pub at_end: Memory,
}

/// Running count of what legate served and what failed outside the measurements.
#[derive(Default)]
struct Tally {
    served: u64,
    warm_errors: u64,
}

impl Tally {
    fn warm(&mut self, side: Side, outcome: &Outcome) {
        self.warm_errors += outcome.errors;
        self.measured(side, outcome);
    }

    fn measured(&mut self, side: Side, outcome: &Outcome) {
        if matches!(side, Side::Legate) {
            self.served += outcome.ok;
        }
    }
}

/// One plain and one streaming request to each side, so a broken setup fails with a clear
/// message before any measurement.
pub async fn preflight(client: &Client, targets: &Pair<Target>) -> Result<(), BenchError> {
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
pub async fn all(
    plan: Plan,
    client: &Client,
    targets: &Pair<Target>,
    legate_pid: u32,
    at_start: Memory,
) -> Result<Results, BenchError> {
    let mut tally = Tally {
        served: 2,
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
        tally.served, at_end.rss, at_end.peak
    );
    Ok(Results {
        latency,
        ttfb,
        throughput,
        served: tally.served,
        warm_errors: tally.warm_errors,
        at_start,
        at_end,
    })
}

fn rounds(total: Duration, slice: Duration) -> u32 {
    let n = (total.as_secs_f64() / slice.as_secs_f64().max(1e-3)).round();
    (n as u32).max(1)
}

async fn latency_at(
    plan: Plan,
    client: &Client,
    targets: &Pair<Target>,
    rate: u32,
    tally: &mut Tally,
) -> Result<Pair<Outcome>, BenchError> {
    eprintln!("bench: open loop at {rate} req/s");
    for side in order(0) {
        let warm = load::open_loop(client, targets.get(side), rate, plan.warmup).await?;
        tally.warm(side, &warm);
    }
    let mut result: Pair<Outcome> = Pair::default();
    for round in 0..rounds(plan.per_rate, plan.slice) {
        for side in order(round) {
            let slice = load::open_loop(client, targets.get(side), rate, plan.slice).await?;
            tally.measured(side, &slice);
            result.get_mut(side).absorb(slice);
        }
    }
    eprintln!(
        "bench:   {} + {} requests, worst scheduler lag {:?}",
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
    for i in 0..plan.stream_warmup + plan.streams {
        for side in order(i) {
            let one = load::stream_ttfb(client, targets.get(side), 1).await?;
            if i < plan.stream_warmup {
                tally.warm(side, &one);
            } else {
                tally.measured(side, &one);
                result.get_mut(side).absorb(one);
            }
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
        let (warm, _) = load::closed_loop(client, target, CONCURRENCY, plan.warmup).await?;
        tally.warm(side, &warm);
    }
    let mut result: Pair<Throughput> = Pair::default();
    for round in 0..rounds(plan.throughput, plan.throughput_slice) {
        for side in order(round) {
            let target = targets.get(side);
            let (slice, elapsed) =
                load::closed_loop(client, target, CONCURRENCY, plan.throughput_slice).await?;
            tally.measured(side, &slice);
            let total = result.get_mut(side);
            total.outcome.absorb(slice);
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
        let (extra, _) = load::closed_loop(client, legate, CONCURRENCY, length).await?;
        tally.warm(Side::Legate, &extra);
        round += 1;
    }
    Ok(())
}
