//! The three load shapes: open loop at a fixed rate (latency without coordinated omission),
//! sequential streams (time to first byte), and a closed loop at fixed concurrency
//! (throughput). Each is bounded in time or count. The open loop interleaves both sides itself;
//! the caller alternates the others between sides so machine noise falls on both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::client::{self, Client, Target};
use crate::error::BenchError;
use crate::pair::{Pair, interleaved};

/// What one slice of load produced.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// One duration per successful request (latency or time to first byte).
    pub samples: Vec<Duration>,
    /// Requests that completed with status 200.
    pub ok: u64,
    /// Requests that failed; the first error is kept to explain them.
    pub errors: u64,
    pub first_error: Option<String>,
    /// How far behind its scheduled instant the open-loop scheduler was at worst.
    pub worst_lag: Duration,
}

impl Outcome {
    fn record(&mut self, result: Result<Option<Duration>, BenchError>) {
        match result {
            Ok(sample) => {
                self.ok += 1;
                self.samples.extend(sample);
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// Folds another slice's outcome into this one.
    pub(crate) fn absorb(&mut self, other: Outcome) {
        self.samples.extend(other.samples);
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.worst_lag = self.worst_lag.max(other.worst_lag);
    }
}

/// One run of load, split in two: the lead-in (warm-up), run but not measured, and the
/// measured part.
#[derive(Debug, Default)]
pub(crate) struct Split {
    pub lead_in: Outcome,
    pub measured: Outcome,
}

/// Open loop on both sides at once, `rate` requests per second each: a request starts at
/// every scheduled instant whether or not earlier ones finished, the sides taking turns
/// request by request (ABBA), and its latency runs from that instant to the last body byte.
/// A stall therefore shows up in every request it delays instead of hiding as a pause in the
/// schedule, and a stall of the machine (another process, the hypervisor) lands on both sides
/// at the same moment instead of on whichever side happened to be running. Requests scheduled
/// within `lead_in` warm both sides up and are only counted.
///
/// The schedule runs on a blocking thread with `std::thread::sleep`, whose precision (tens of
/// microseconds) is far finer than the tokio timer's millisecond wheel.
pub(crate) async fn open_loop(
    client: &Client,
    targets: &Pair<Target>,
    rate: u32,
    lead_in: Duration,
    length: Duration,
) -> Result<Pair<Split>, BenchError> {
    let combined = 2.0 * f64::from(rate);
    let unmeasured = (combined * lead_in.as_secs_f64()).round() as u64;
    let count = unmeasured + (combined * length.as_secs_f64()).round() as u64;
    let period = Duration::from_secs_f64(1.0 / combined.max(1.0));
    let handle = Handle::current();
    let (client, targets) = (client.clone(), targets.clone());
    let scheduler = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let mut lag = Duration::ZERO;
        let mut tasks: Vec<JoinHandle<_>> = Vec::new();
        for k in 0..count {
            let due = start + period.mul_f64(k as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if k >= unmeasured {
                lag = lag.max(Instant::now().saturating_duration_since(due));
            }
            let request = targets.get(interleaved(k)).message(false);
            let client = client.clone();
            tasks.push(handle.spawn(async move {
                client::complete(&client, request?).await?;
                Ok::<_, BenchError>(Some(due.elapsed()))
            }));
        }
        (tasks, lag)
    });
    let (tasks, lag) = scheduler.await.map_err(BenchError::Task)?;
    let mut split: Pair<Split> = Pair::default();
    for (k, task) in (0..).zip(tasks) {
        let result = task.await.map_err(BenchError::Task)?;
        let side = split.get_mut(interleaved(k));
        if k < unmeasured {
            side.lead_in.record(result);
        } else {
            side.measured.record(result);
        }
    }
    split.direct.measured.worst_lag = lag;
    split.legate.measured.worst_lag = lag;
    Ok(split)
}

/// Sequential streaming requests, one at a time: time from sending to the first body byte.
pub(crate) async fn stream_ttfb(
    client: &Client,
    target: &Target,
    count: u32,
) -> Result<Outcome, BenchError> {
    let mut outcome = Outcome::default();
    for _ in 0..count {
        let result = match target.message(true) {
            Ok(request) => client::first_byte(client, request).await.map(Some),
            Err(e) => Err(e),
        };
        outcome.record(result);
    }
    Ok(outcome)
}

/// Closed loop on one side: `concurrency` workers each send the next request as soon as the
/// previous one finished, for `lead_in` and then `length`. Requests that end within the
/// lead-in are only counted; the measured part comes with its wall time (the last requests
/// end a little after `length`).
///
/// The lead-in matters because the sides run in turns here: a process that sat idle while the
/// other side was measured is cold, and on small virtual machines its first answers after a
/// second of idleness take several milliseconds. That is an artefact of taking turns, not a
/// property of steady load, so it is kept out of both sides alike.
pub(crate) async fn closed_loop(
    client: &Client,
    target: &Target,
    concurrency: usize,
    lead_in: Duration,
    length: Duration,
) -> Result<(Split, Duration), BenchError> {
    let measure_from = Instant::now() + lead_in;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, target) = (client.clone(), target.clone());
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let mut split = Split::default();
            while !stop.load(Ordering::Relaxed) {
                let result = match target.message(false) {
                    Ok(request) => client::complete(&client, request).await,
                    Err(e) => Err(e),
                };
                let part = if Instant::now() < measure_from {
                    &mut split.lead_in
                } else {
                    &mut split.measured
                };
                // Throughput counts requests; their durations are not kept.
                part.record(result.map(|()| None));
            }
            split
        }));
    }
    tokio::time::sleep_until((measure_from + length).into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = Split::default();
    for worker in workers {
        let split = worker.await.map_err(BenchError::Task)?;
        total.lead_in.absorb(split.lead_in);
        total.measured.absorb(split.measured);
    }
    Ok((total, measure_from.elapsed()))
}
