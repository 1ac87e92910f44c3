//! The order of the run: preflight, then several samples of (latency at a fixed rate on
//! `/v1/messages` and on `/v1/responses`, throughput), then stream time to first byte on both
//! APIs, then enough extra requests for the memory reading. Every phase mixes the sides, request by request where the load shape allows it
//! (open loop, streams) and slice by slice where it does not (closed loop), so the machine's
//! noise falls on all of them; repeating whole samples shows how much a number moves.

use std::time::{Duration, Instant};

use crate::Plan;
use crate::children::{self, Memory};
use crate::client::{self, Api, Target};
use crate::error::BenchError;
use crate::load::{self, Outcome, Split};
use crate::pair::{LEGATE, interleaved, order};
use crate::report;
use crate::wire::Conn;

/// Open-loop rate per side, requests per second; it carries the latency target.
pub(crate) const RATE: u32 = 1_000;
/// Connections per side in the open loop, like an outside load generator's fixed pool.
pub(crate) const OPEN_CONNECTIONS: usize = 100;
/// Connections (and concurrent requests) per side in the closed-loop throughput phase.
pub(crate) const CONCURRENCY: usize = 32;
/// Upper bound on the extra throughput-slice rounds run to reach `Plan::min_requests`.
const MAX_TOP_UP_ROUNDS: u32 = 600;

/// One side's closed-loop slices: requests, wall time, and the CPU its process used.
#[derive(Debug, Default)]
pub(crate) struct Throughput {
    pub outcome: Outcome,
    pub elapsed: Duration,
    /// CPU of the side's own process over its slices, lead-ins included.
    pub cpu: Duration,
    /// The system (kernel) part of `cpu`.
    pub system: Duration,
    /// Every request of those slices, lead-ins included (what `cpu` was spent on).
    pub all_requests: u64,
    /// The mock's CPU over the side's slices (for the direct side, the same as `cpu`), and the
    /// load generator's: whether a proxy changes what the other two spend per request.
    pub mock_cpu: Duration,
    pub client_cpu: Duration,
    /// Wall time of the slices, lead-ins included (what the three processes' CPU is set
    /// against to say how busy the cores were).
    pub wall: Duration,
}

impl Throughput {
    pub(crate) fn per_second(&self) -> f64 {
        self.outcome.ok as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// One side's open loop: the measured outcome and the CPU its process used for all of it.
#[derive(Debug, Default)]
pub(crate) struct Latency {
    pub outcome: Outcome,
    pub cpu: Duration,
    pub all_requests: u64,
}

/// One sample: latency on each API and throughput, per side.
#[derive(Debug)]
pub(crate) struct Sample {
    /// `POST /v1/messages`.
    pub latency: Vec<Latency>,
    /// `POST /v1/responses`.
    pub responses: Vec<Latency>,
    pub throughput: Vec<Throughput>,
}

/// How long after the load legate's memory is read a second time: legate hands freed heap
/// pages back to the system after a whole check period without requests
/// (`legate::server::release`), so one to two periods after the last one.
pub(crate) const SETTLE: Duration =
    Duration::from_secs(3 * legate::server::release::CHECK_EVERY.as_secs());

/// Everything measured in one run.
#[derive(Debug)]
pub(crate) struct Results {
    pub sides: usize,
    pub samples: Vec<Sample>,
    /// Stream time to first byte on `/v1/messages`, per side.
    pub ttfb: Vec<Outcome>,
    /// The same on `/v1/responses`.
    pub responses_ttfb: Vec<Outcome>,
    /// Successful requests legate served in the whole run, warm-ups included.
    pub served: u64,
    /// Requests that failed during warm-ups (measured failures are in the outcomes).
    pub warm_errors: u64,
    pub first_warm_error: Option<String>,
    pub at_start: Memory,
    /// Read the moment the last request is answered.
    pub at_end: Memory,
    /// Read [`SETTLE`] later, once legate has seen a quiet period and handed back what it
    /// freed.
    pub settled: Memory,
    pub cold_starts: Vec<Duration>,
}

/// Running count of what legate served and what failed outside the measurements.
#[derive(Default)]
pub(crate) struct Tally {
    served: u64,
    warm_errors: u64,
    first_warm_error: Option<String>,
}

impl Tally {
    /// Requests that failed outside the measurements, and the first one's error.
    pub(crate) fn warm_failures(self) -> (u64, Option<String>) {
        (self.warm_errors, self.first_warm_error)
    }

    fn warm(&mut self, side: usize, outcome: &Outcome) {
        self.warm_errors += outcome.errors;
        if self.first_warm_error.is_none() {
            self.first_warm_error.clone_from(&outcome.first_error);
        }
        self.measured(side, outcome);
    }

    /// Counts a split slice and returns its measured part.
    pub(crate) fn split(&mut self, side: usize, split: Split) -> Outcome {
        self.warm(side, &split.lead_in);
        self.measured(side, &split.measured);
        split.measured
    }

    fn measured(&mut self, side: usize, outcome: &Outcome) {
        if side == LEGATE {
            self.served += outcome.ok;
        }
    }
}

/// One plain and one streaming request of each API to each side, so a broken setup fails with
/// a clear message before any measurement.
pub(crate) async fn preflight(targets: &[Target]) -> Result<(), BenchError> {
    for target in targets {
        for api in [Api::Messages, Api::Responses] {
            let target = target.speaking(api);
            let failed = |e: BenchError| BenchError::Preflight {
                target: target.label,
                detail: format!("{}: {e}", api.path()),
            };
            let mut conn = target.connect().await.map_err(failed)?;
            client::complete(&mut conn, target.message(false))
                .await
                .map_err(failed)?;
            client::first_byte(&mut conn, target.message(true))
                .await
                .map_err(failed)?;
        }
    }
    Ok(())
}

/// The same sides, sending `/v1/responses`.
fn responses(targets: &[Target]) -> Vec<Target> {
    targets.iter().map(|t| t.speaking(Api::Responses)).collect()
}

/// Runs every phase in order and reads legate's memory at the end; `procs` are the process
/// ids whose CPU counts for each side.
pub(crate) async fn all(
    plan: Plan,
    targets: &[Target],
    procs: &[Vec<u32>],
    at_start: Memory,
    cold_starts: Vec<Duration>,
) -> Result<Results, BenchError> {
    let mut tally = Tally::default();
    let mut pools = Vec::new();
    for target in targets {
        pools.push(target.connections(CONCURRENCY).await?);
    }
    let mut samples = Vec::new();
    for n in 0..plan.samples {
        eprintln!("bench: sample {} of {}", n + 1, plan.samples);
        let messages = latency(plan, targets, procs, &mut tally).await?;
        let responses = latency(plan, &responses(targets), procs, &mut tally).await?;
        let throughput = throughput(plan, targets, procs, &mut pools, &mut tally).await?;
        samples.push(Sample {
            latency: messages,
            responses,
            throughput,
        });
    }
    let ttfb = streams(plan, targets, &mut tally).await?;
    let responses_ttfb = streams(plan, &responses(targets), &mut tally).await?;
    top_up(plan, &targets[LEGATE], &mut pools[LEGATE], &mut tally).await?;
    let at_end = children::memory(procs[LEGATE][0])?;
    tokio::time::sleep(SETTLE).await;
    let settled = children::memory(procs[LEGATE][0])?;
    eprintln!(
        "bench: legate served {} requests; RSS {} at the end of the load, {} {} s later (peak {})",
        tally.served,
        report::mebibytes(at_end.rss),
        report::mebibytes(settled.rss),
        SETTLE.as_secs(),
        report::mebibytes(settled.peak)
    );
    Ok(Results {
        sides: targets.len(),
        samples,
        ttfb,
        responses_ttfb,
        served: tally.served,
        warm_errors: tally.warm_errors,
        first_warm_error: tally.first_warm_error,
        at_start,
        at_end,
        settled,
        cold_starts,
    })
}

fn rounds(total: Duration, slice: Duration) -> u64 {
    let n = (total.as_secs_f64() / slice.as_secs_f64().max(1e-3)).round();
    (n as u64).max(1)
}

/// Open loop over `targets` (each side's process ids in `procs`, in the same order), counted in
/// `tally` by position.
pub(crate) async fn latency(
    plan: Plan,
    targets: &[Target],
    procs: &[Vec<u32>],
    tally: &mut Tally,
) -> Result<Vec<Latency>, BenchError> {
    eprintln!(
        "bench:   open loop at {RATE} req/s per side over {OPEN_CONNECTIONS} connections, {}",
        targets.first().map_or("", |t| t.api().path())
    );
    let before: Vec<Duration> = procs.iter().map(|p| children::cpu_time(p)).collect();
    let splits =
        load::open_loop(targets, OPEN_CONNECTIONS, RATE, plan.warmup, plan.per_rate).await?;
    let mut out = Vec::new();
    for (side, split) in splits.into_iter().enumerate() {
        let cpu = children::cpu_time(&procs[side]).saturating_sub(before[side]);
        let all_requests = split.lead_in.ok
            + split.lead_in.errors
            + split.measured.ok
            + split.measured.errors
            + OPEN_CONNECTIONS as u64;
        out.push(Latency {
            outcome: tally.split(side, split),
            cpu,
            all_requests,
        });
    }
    eprintln!(
        "bench:     worst scheduler lag {:?}",
        out.iter()
            .map(|l| l.outcome.worst_lag)
            .max()
            .unwrap_or_default()
    );
    Ok(out)
}

async fn streams(
    plan: Plan,
    targets: &[Target],
    tally: &mut Tally,
) -> Result<Vec<Outcome>, BenchError> {
    eprintln!(
        "bench: {} sequential streams per side, time to first byte, {}",
        plan.streams,
        targets.first().map_or("", |t| t.api().path())
    );
    let sides = targets.len();
    let mut conns = Vec::new();
    for target in targets {
        conns.push(target.connect().await?);
    }
    let mut result: Vec<Outcome> = (0..sides).map(|_| Outcome::default()).collect();
    let total = sides as u64 * u64::from(plan.stream_warmup + plan.streams);
    for k in 0..total {
        let side = interleaved(k, sides);
        let one = load::stream_ttfb(&mut conns[side], &targets[side], 1).await?;
        if k < sides as u64 * u64::from(plan.stream_warmup) {
            tally.warm(side, &one);
        } else {
            tally.measured(side, &one);
            result[side].absorb(one);
        }
    }
    Ok(result)
}

async fn throughput(
    plan: Plan,
    targets: &[Target],
    procs: &[Vec<u32>],
    pools: &mut [Vec<Conn>],
    tally: &mut Tally,
) -> Result<Vec<Throughput>, BenchError> {
    eprintln!("bench:   closed loop, {CONCURRENCY} connections per side");
    let sides = targets.len();
    let mut result: Vec<Throughput> = (0..sides).map(|_| Throughput::default()).collect();
    let me = [std::process::id()];
    let (own_before, mut requests) = (children::cpu_time(&me), 0);
    for round in 0..rounds(plan.throughput, plan.throughput_slice) {
        for side in order(round, sides) {
            let conns = std::mem::take(&mut pools[side]);
            let cpu_before = children::cpu_time(&procs[side]);
            let system_before = children::system_time(&procs[side]);
            let (mock_before, client_before) =
                (children::cpu_time(&procs[0]), children::cpu_time(&me));
            let started = Instant::now();
            let (lead_in, length) = (plan.lead_in, plan.throughput_slice);
            let (slice, elapsed, back) =
                load::closed_loop(&targets[side], conns, lead_in, length).await?;
            pools[side] = back;
            let total = &mut result[side];
            total.wall += started.elapsed();
            total.mock_cpu += children::cpu_time(&procs[0]).saturating_sub(mock_before);
            total.client_cpu += children::cpu_time(&me).saturating_sub(client_before);
            total.cpu += children::cpu_time(&procs[side]).saturating_sub(cpu_before);
            total.system += children::system_time(&procs[side]).saturating_sub(system_before);
            total.all_requests += slice.lead_in.ok + slice.measured.ok;
            requests += slice.lead_in.ok + slice.measured.ok;
            let measured = tally.split(side, slice);
            total.outcome.absorb(measured);
            total.elapsed += elapsed;
        }
    }
    let rates: Vec<String> = result
        .iter()
        .zip(targets)
        .map(|(t, target)| format!("{} {:.0} req/s", target.label, t.per_second()))
        .collect();
    eprintln!("bench:     {}", rates.join(", "));
    // Per side: what the mock and the load generator spent per request while that side ran,
    // and how busy the cores were (all three processes' CPU over cores × wall time).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let per = |d: Duration, t: &Throughput| d.as_secs_f64() * 1e6 / t.all_requests.max(1) as f64;
    let spent: Vec<String> = result
        .iter()
        .zip(targets)
        .enumerate()
        .map(|(i, (t, target))| {
            let proxy = if i == 0 { Duration::ZERO } else { t.cpu };
            let busy = (t.mock_cpu + t.client_cpu + proxy).as_secs_f64()
                / (cores * t.wall.as_secs_f64().max(f64::EPSILON));
            format!(
                "{}: mock {:.1} µs, load generator {:.1} µs, cores {:.0} % busy",
                target.label,
                per(t.mock_cpu, t),
                per(t.client_cpu, t),
                busy * 100.0
            )
        })
        .collect();
    eprintln!("bench:     per request {}", spent.join("; "));
    // The load generator shares the cores: what it spends per request is taken from the sides.
    let own = children::cpu_time(&me).saturating_sub(own_before);
    eprintln!(
        "bench:     load generator CPU per request {:.3} ms",
        own.as_secs_f64() * 1e3 / requests.max(1) as f64
    );
    Ok(result)
}

/// More closed-loop requests through legate until it has served `plan.min_requests`.
async fn top_up(
    plan: Plan,
    legate: &Target,
    pool: &mut Vec<Conn>,
    tally: &mut Tally,
) -> Result<(), BenchError> {
    let mut round = 0;
    while tally.served < plan.min_requests && round < MAX_TOP_UP_ROUNDS {
        let conns = std::mem::take(pool);
        let length = plan.throughput_slice;
        let (extra, _, back) = load::closed_loop(legate, conns, Duration::ZERO, length).await?;
        *pool = back;
        tally.split(LEGATE, extra);
        round += 1;
    }
    Ok(())
}
