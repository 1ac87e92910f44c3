//! The three load shapes: open loop at a fixed rate over a fixed set of connections (latency
//! without coordinated omission), sequential streams (time to first byte), and a closed loop
//! at fixed concurrency (throughput). Each is bounded in time or count. The open loop
//! interleaves the sides itself; the caller alternates the others between sides so machine
//! noise falls on all of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::client::{self, Target};
use crate::error::BenchError;
use crate::pair::interleaved;
use crate::wire::Conn;

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

/// A request's place in the open-loop schedule: its number and its instant.
type Slot = (u64, Instant);

/// Open loop on every side at once, `rate` requests per second each, over `conns` keep-alive
/// connections per side (like an outside load generator with a fixed connection count): a
/// request starts at its scheduled instant whether or not earlier ones finished, the sides
/// take turns request by request, each side's requests go round its connections, and a
/// request's latency runs from its scheduled instant to the last body byte. A stall therefore
/// shows up in every request it delays (including requests queued behind it on the same
/// connection) instead of hiding as a pause in the schedule, and a stall of the machine lands
/// on every side at the same moment. Requests scheduled within `lead_in` are only counted.
///
/// The schedule runs on a blocking thread with `std::thread::sleep`, whose precision (tens of
/// microseconds) is far finer than the tokio timer's millisecond wheel.
pub(crate) async fn open_loop(
    targets: &[Target],
    conns: usize,
    rate: u32,
    lead_in: Duration,
    length: Duration,
) -> Result<Vec<Split>, BenchError> {
    let sides = targets.len();
    let combined = sides as f64 * f64::from(rate);
    let unmeasured = (combined * lead_in.as_secs_f64()).round() as u64;
    let count = unmeasured + (combined * length.as_secs_f64()).round() as u64;
    let period = Duration::from_secs_f64(1.0 / combined.max(1.0));
    let mut senders: Vec<Vec<mpsc::UnboundedSender<Slot>>> = Vec::with_capacity(sides);
    let mut workers = Vec::new();
    for (side, target) in targets.iter().enumerate() {
        let mut per_side = Vec::with_capacity(conns);
        for conn in target.connections(conns).await? {
            let (tx, rx) = mpsc::unbounded_channel();
            per_side.push(tx);
            workers.push((side, tokio::spawn(serve_slots(target.clone(), conn, rx))));
        }
        senders.push(per_side);
    }
    let scheduler = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let mut lag = Duration::ZERO;
        let mut next_conn = vec![0usize; sides];
        for k in 0..count {
            let due = start + period.mul_f64(k as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if k >= unmeasured {
                lag = lag.max(Instant::now().saturating_duration_since(due));
            }
            let side = interleaved(k, sides);
            let conn = next_conn[side];
            next_conn[side] = (conn + 1) % conns;
            // A worker that died has already recorded why; its slots are simply not sent.
            let _ = senders[side][conn].send((k, due));
        }
        lag
    });
    let lag = scheduler.await.map_err(BenchError::Task)?;
    let mut splits: Vec<Split> = (0..sides).map(|_| Split::default()).collect();
    for (side, worker) in workers {
        for (k, result) in worker.await.map_err(BenchError::Task)? {
            let split = &mut splits[side];
            if k < unmeasured {
                split.lead_in.record(result);
            } else {
                split.measured.record(result);
            }
        }
    }
    for split in &mut splits {
        split.measured.worst_lag = lag;
    }
    Ok(splits)
}

/// One open-loop connection: answers its slots in order until the schedule ends. A failed
/// request leaves the connection in an unknown state, so the next one opens a fresh one.
async fn serve_slots(
    target: Target,
    conn: Conn,
    mut slots: mpsc::UnboundedReceiver<Slot>,
) -> Vec<(u64, Result<Option<Duration>, BenchError>)> {
    let mut results = Vec::new();
    let mut conn = Some(conn);
    while let Some((k, due)) = slots.recv().await {
        let result = match conn.take() {
            Some(c) => Ok(c),
            None => target.connect().await,
        };
        let result = match result {
            Ok(mut c) => {
                let r = client::complete(&mut c, target.message(false)).await;
                if r.is_ok() {
                    conn = Some(c);
                }
                r.map(|()| Some(due.elapsed()))
            }
            Err(e) => Err(e),
        };
        results.push((k, result));
    }
    results
}

/// Sequential streaming requests on one connection: time from sending to the first body byte.
pub(crate) async fn stream_ttfb(
    conn: &mut Conn,
    target: &Target,
    count: u32,
) -> Result<Outcome, BenchError> {
    let mut outcome = Outcome::default();
    for _ in 0..count {
        let result = client::first_byte(conn, target.message(true)).await;
        let failed = result.is_err();
        outcome.record(result.map(Some));
        if failed {
            *conn = target.connect().await?;
        }
    }
    Ok(outcome)
}

/// Closed loop on one side over the given connections: each sends the next request as soon
/// as the previous one finished, for `lead_in` and then `length`. Requests that end within the
/// lead-in are only counted; the measured part comes with its wall time (the last requests end
/// a little after `length`). The connections are handed back for the next slice.
///
/// The lead-in matters because the sides run in turns here: a process that sat idle while the
/// other side was measured is cold, and on small virtual machines its first answers after a
/// second of idleness take several milliseconds. That is an artefact of taking turns, not a
/// property of steady load, so it is kept out of every side alike.
pub(crate) async fn closed_loop(
    target: &Target,
    conns: Vec<Conn>,
    lead_in: Duration,
    length: Duration,
) -> Result<(Split, Duration, Vec<Conn>), BenchError> {
    let measure_from = Instant::now() + lead_in;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::with_capacity(conns.len());
    for mut conn in conns {
        let target = target.clone();
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let mut split = Split::default();
            while !stop.load(Ordering::Relaxed) {
                let result = client::complete(&mut conn, target.message(false)).await;
                let part = if Instant::now() < measure_from {
                    &mut split.lead_in
                } else {
                    &mut split.measured
                };
                let failed = result.is_err();
                // Throughput counts requests; their durations are not kept.
                part.record(result.map(|()| None));
                if failed {
                    match target.connect().await {
                        Ok(c) => conn = c,
                        Err(e) => return (split, Err(e)),
                    }
                }
            }
            (split, Ok(conn))
        }));
    }
    tokio::time::sleep_until((measure_from + length).into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = Split::default();
    let mut back = Vec::with_capacity(workers.len());
    for worker in workers {
        let (split, conn) = worker.await.map_err(BenchError::Task)?;
        total.lead_in.absorb(split.lead_in);
        total.measured.absorb(split.measured);
        back.push(conn?);
    }
    Ok((total, measure_from.elapsed(), back))
}
