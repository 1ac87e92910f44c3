//! The three load shapes: open loop at a fixed rate (latency without coordinated omission),
//! sequential streams (time to first byte), and a closed loop at fixed concurrency
//! (throughput). Each runs one bounded slice against one target; the caller alternates slices
//! between targets so machine noise falls on both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::client::{self, Client, Target};
use crate::error::BenchError;

/// What one slice of load produced.
#[derive(Debug, Default)]
pub struct Outcome {
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
    pub fn absorb(&mut self, other: Outcome) {
        self.samples.extend(other.samples);
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.worst_lag = self.worst_lag.max(other.worst_lag);
    }
}

/// Open loop: a request starts at every scheduled instant `k / rate` whether or not earlier
/// ones finished, and its latency runs from that instant to the last body byte, so a stall
/// shows up in every request it delays instead of hiding as a pause in the schedule.
///
/// The schedule runs on a blocking thread with `std::thread::sleep`, whose precision (tens of
/// microseconds) is far finer than the tokio timer's millisecond wheel.
pub async fn open_loop(
    client: &Client,
    target: &Target,
    rate: u32,
    length: Duration,
) -> Result<Outcome, BenchError> {
    let count = (f64::from(rate) * length.as_secs_f64()).round() as u64;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let handle = Handle::current();
    let (client, target) = (client.clone(), target.clone());
    let scheduler = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let mut lag = Duration::ZERO;
        let mut tasks: Vec<JoinHandle<_>> = Vec::new();
        for k in 0..count {
            let due = start + period.mul_f64(k as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            lag = lag.max(Instant::now().saturating_duration_since(due));
            let request = target.message(false);
            let client = client.clone();
            tasks.push(handle.spawn(async move {
                client::complete(&client, request?).await?;
                Ok::<_, BenchError>(Some(due.elapsed()))
            }));
        }
        (tasks, lag)
    });
    let (tasks, lag) = scheduler.await.map_err(join_failed)?;
    let mut outcome = Outcome {
        worst_lag: lag,
        ..Outcome::default()
    };
    for task in tasks {
        outcome.record(task.await.map_err(join_failed)?);
    }
    Ok(outcome)
}

/// Sequential streaming requests, one at a time: time from sending to the first body byte.
pub async fn stream_ttfb(
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

/// Closed loop: `concurrency` workers each send the next request as soon as the previous one
/// finished, until `length` has passed. Returns the outcome and the wall time it took (the
/// last requests end a little after `length`).
pub async fn closed_loop(
    client: &Client,
    target: &Target,
    concurrency: usize,
    length: Duration,
) -> Result<(Outcome, Duration), BenchError> {
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, target) = (client.clone(), target.clone());
        let (stop, ok) = (Arc::clone(&stop), Arc::clone(&ok));
        workers.push(tokio::spawn(async move {
            let mut failed = Outcome::default();
            while !stop.load(Ordering::Relaxed) {
                let result = match target.message(false) {
                    Ok(request) => client::complete(&client, request).await,
                    Err(e) => Err(e),
                };
                match result {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failed.record(Err(e)),
                }
            }
            failed
        }));
    }
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut outcome = Outcome::default();
    for worker in workers {
        outcome.absorb(worker.await.map_err(join_failed)?);
    }
    outcome.ok = ok.load(Ordering::Relaxed);
    Ok((outcome, start.elapsed()))
}

fn join_failed(e: tokio::task::JoinError) -> BenchError {
    BenchError::Task(e)
}
