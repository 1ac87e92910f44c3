//! The cost of legate's request observability: the same open loop on `/v1/messages` through
//! three legate instances in front of the same mock — the one the main table measures (access
//! log and trace export off), one writing the access log to a file, one exporting spans over
//! OTLP/HTTP to a local sink ([`crate::sink`]) — interleaved request by request, so the
//! difference between the columns is what each feature adds.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Plan;
use crate::children::{self, Observe, Running};
use crate::client::Target;
use crate::error::BenchError;
use crate::phases::{self, Latency, OPEN_CONNECTIONS, RATE, Tally};
use crate::report::{self, Row};
use crate::results::{ms, percentile_ms, show, spread};
use crate::sink;

/// Column names: the instance with both off first, the differences are taken against it.
pub(crate) const NAMES: [&str; 3] = [
    "legate, access log and tracing off",
    "with access log",
    "with OTLP tracing",
];

/// Largest `/metrics` page read for the dropped-span counter.
const MAX_METRICS: u64 = 1 << 20;

/// One open loop per sample, one entry per instance, plus what the instances wrote.
#[derive(Debug)]
pub(crate) struct Observed {
    pub samples: Vec<Vec<Latency>>,
    pub warm_errors: u64,
    pub first_warm_error: Option<String>,
}

impl Observed {
    /// Failed requests anywhere in this phase.
    pub(crate) fn failed(&self) -> u64 {
        let measured: u64 = self
            .samples
            .iter()
            .flatten()
            .map(|l| l.outcome.errors)
            .sum();
        measured + self.warm_errors
    }

    pub(crate) fn first_error(&self) -> Option<&str> {
        self.samples
            .iter()
            .flatten()
            .find_map(|l| l.outcome.first_error.as_deref())
            .or(self.first_warm_error.as_deref())
    }
}

/// Starts the sink and the two observing instances beside `legate` (observability off),
/// measures, stops them.
pub(crate) async fn run(
    plan: Plan,
    bin: &Path,
    dir: &Path,
    mock_url: &str,
    legate: &Running,
) -> Result<Observed, BenchError> {
    let sink = sink::start().await?;
    let logging = children::start_observing(bin, dir, mock_url, Observe::AccessLog).await?;
    let tracing = children::start_observing(bin, dir, mock_url, Observe::Tracing(sink.addr)).await;
    let tracing = match tracing {
        Ok(t) => t,
        Err(e) => {
            logging.stop().await;
            return Err(e);
        }
    };
    let result = measure(plan, [legate, &logging, &tracing]).await;
    // Spans still queued leave within the exporter's next batch; give them a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dropped = dropped_spans(&tracing).await;
    logging.stop().await;
    tracing.stop().await;
    let lines = std::fs::read(children::access_log_path(dir))
        .map(|log| log.iter().filter(|b| **b == b'\n').count())
        .unwrap_or(0);
    eprintln!(
        "bench:     access log: {lines} lines; OTLP sink: {} exports, {} KiB; spans dropped: {}",
        sink.received.exports.load(Ordering::Relaxed),
        sink.received.bytes.load(Ordering::Relaxed) >> 10,
        dropped.map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
    );
    result
}

async fn measure(plan: Plan, instances: [&Running; 3]) -> Result<Observed, BenchError> {
    let mut targets = Vec::new();
    for (running, label) in instances
        .iter()
        .zip(["legate", "legate+log", "legate+otlp"])
    {
        targets.push(Target::new(label, &running.base_url)?);
    }
    let procs: Vec<Vec<u32>> = instances.iter().map(|r| vec![r.pid()]).collect();
    phases::preflight(&targets).await?;
    eprintln!("bench: access log and tracing, off vs on");
    let mut tally = Tally::default();
    let mut samples = Vec::new();
    for n in 0..plan.samples {
        eprintln!("bench:   sample {} of {}", n + 1, plan.samples);
        samples.push(phases::latency(plan, &targets, &procs, &mut tally).await?);
    }
    let (warm_errors, first_warm_error) = tally.warm_failures();
    Ok(Observed {
        samples,
        warm_errors,
        first_warm_error,
    })
}

/// `legate_telemetry_dropped_total{signal="spans"}` from the instance's `/metrics`; `None`
/// when it cannot be read (0 when the counter has no sample yet).
async fn dropped_spans(legate: &Running) -> Option<u64> {
    let admin = crate::wire::address(legate.admin_url.as_deref()?).ok()?;
    let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
    let request = format!("GET /metrics HTTP/1.1\r\nhost: {admin}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut page = Vec::new();
    let mut limited = stream.take(MAX_METRICS);
    tokio::time::timeout(Duration::from_secs(5), limited.read_to_end(&mut page))
        .await
        .ok()?
        .ok()?;
    let page = String::from_utf8_lossy(&page);
    let sample = page
        .lines()
        .find_map(|l| l.strip_prefix(r#"legate_telemetry_dropped_total{signal="spans"} "#));
    Some(sample.and_then(|v| v.trim().parse().ok()).unwrap_or(0))
}

/// The rows of the second table: latency and CPU per request of each instance, and what the
/// access log and tracing add over the instance with both off.
pub(crate) fn rows(observed: &Observed) -> Vec<Row> {
    let at = format!(
        "/v1/messages @ {} req/s per side, {OPEN_CONNECTIONS} connections",
        report::thousands(u64::from(RATE))
    );
    let per_sample = |side: usize, f: &dyn Fn(&Latency) -> f64| -> Vec<f64> {
        observed.samples.iter().map(|s| f(&s[side])).collect()
    };
    let row = |metric: String, f: &dyn Fn(&Latency) -> f64| {
        let cells = (0..NAMES.len())
            .map(|side| show(spread(&per_sample(side, f)), " ms", 3, false))
            .collect();
        let added = (1..NAMES.len())
            .map(|side| {
                let diff: Vec<f64> = observed
                    .samples
                    .iter()
                    .map(|s| f(&s[side]) - f(&s[0]))
                    .collect();
                show(spread(&diff), " ms", 3, true)
            })
            .collect();
        Row::plain(metric, cells, added)
    };
    let mut out = Vec::new();
    for (name, p) in [("p50", 50.0), ("p99", 99.0), ("max", 100.0)] {
        let f = move |l: &Latency| percentile_ms(&l.outcome, p);
        out.push(row(format!("latency {name} {at}"), &f));
    }
    let cpu = |l: &Latency| ms(l.cpu) / l.all_requests.max(1) as f64;
    out.push(row(format!("CPU per request {at}"), &cpu));
    let count = |side: usize| {
        let (ok, failed) = observed.samples.iter().fold((0, 0), |(ok, failed), s| {
            (ok + s[side].outcome.ok, failed + s[side].outcome.errors)
        });
        format!("{ok} ok / {failed} failed")
    };
    out.push(Row::plain(
        format!("requests {at}"),
        (0..NAMES.len()).map(count).collect(),
        vec!["—".to_owned(); NAMES.len() - 1],
    ));
    out
}
