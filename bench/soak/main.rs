//! legate's soak (`cargo bench --bench soak`): `legate serve` in front of `legate mock`, both on
//! loopback, under a bounded mix of ordinary, streaming and abandoning callers, callers
//! inventing model names, failing upstreams (529s, cut streams, hangs, oversized events, error
//! bodies echoing the key) and hostile peers (silent, slowloris, stalled and oversized bodies,
//! crowds of large uploads) — and a check that what SPEC §14 bounds stays bounded: resident
//! memory flat after warm-up, open descriptors and connections within their caps and back to
//! where they started once the load stops, breakers and ledger within their sizes, `/healthz`
//! always answering, and the provider key never reaching a caller.
//!
//! `-- --secs N` sets the run's length (default 60 s; `SOAK_SECS` too), `-- --interval N` the
//! sampling period (default: a tenth of the run, 2–10 s). Samples and the verdict go to stdout
//! as Markdown tables; the exit status is non-zero when a bound is exceeded. Run without
//! `--bench` (as `cargo test --all-targets` does) it is a smoke run of a few seconds that
//! judges only the hard caps.

mod procs;
mod sample;
mod traffic;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sample::{Health, Sample};
use tokio_util::sync::CancellationToken;
use traffic::{KINDS, Traffic};

/// Growth of resident memory allowed between the end of warm-up and the end of the run.
const RSS_GROWTH_MAX_KIB: u64 = 32 << 10;
/// Resident memory never to be passed (request bodies together are bounded at 8 MiB here).
const RSS_MAX_KIB: u64 = 256 << 10;
/// Descriptors beyond the two planes' caps and one upstream connection per data connection.
const FD_SLACK: u64 = 64;
/// Breakers beyond the bound of unconfigured names, for configured ones.
const BREAKERS_MAX: u64 = 1024 + 16;
/// Ledger entries per tenant: the bound of unconfigured names, plus the configured models'
/// entries (kept apart) and the `provider:other` fold entries.
const LEDGER_MAX: u64 = 1024 + 16;
/// Once the load stops, how long connections and descriptors get to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(15);

struct Plan {
    strict: bool,
    run: Duration,
    interval: Duration,
}

impl Plan {
    fn from_args() -> Plan {
        let args: Vec<String> = std::env::args().collect();
        let strict = args.iter().any(|a| a == "--bench");
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .and_then(|v| v.parse::<u64>().ok())
        };
        let env_secs = std::env::var("SOAK_SECS").ok().and_then(|v| v.parse().ok());
        let secs = value("--secs")
            .or(env_secs)
            .unwrap_or(if strict { 60 } else { 6 });
        let interval = value("--interval").unwrap_or((secs / 10).clamp(2, 10));
        Plan {
            strict,
            run: Duration::from_secs(secs),
            interval: Duration::from_secs(interval),
        }
    }
}

fn main() -> ExitCode {
    let plan = Plan::from_args();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("soak: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&plan)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(plan: &Plan) -> Result<bool, String> {
    let bin = Path::new(env!("CARGO_BIN_EXE_legate"));
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let mock = procs::start_mock(bin).await?;
    let legate = procs::start_legate(bin, dir.path(), &mock.url).await?;
    // Idle connections are dropped before legate's `connection_idle_timeout` (5 s) closes
    // them: otherwise a request may be written on one just as legate closes it.
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| format!("client: {e}"))?;
    http.put(format!("{}/_mock/script", mock.url))
        .body(traffic::mock_script())
        .send()
        .await
        .map_err(|e| format!("mock script: {e}"))?;
    eprintln!(
        "soak: {} s against legate pid {} ({}), sampling every {} s",
        plan.run.as_secs(),
        legate.pid,
        legate.url,
        plan.interval.as_secs()
    );
    let watch = Watch {
        admin: legate.admin_url.clone().ok_or("no admin address")?,
        pid: legate.pid,
        started: Instant::now(),
        health: Arc::new(Health::default()),
        http: http.clone(),
    };
    let stop = CancellationToken::new();
    let traffic = Arc::new(Traffic {
        http,
        rough: reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| format!("client: {e}"))?,
        addr: legate.url.trim_start_matches("http://").to_string(),
        url: legate.url.clone(),
        stop: stop.clone(),
        tallies: Arc::new(Default::default()),
    });
    let baseline = watch.take(&traffic).await;
    let prober = tokio::spawn(sample::probe_health(
        watch.admin.clone(),
        watch.health.clone(),
        stop.clone(),
    ));
    let loops = traffic.spawn_all();

    println!("{}", Sample::header());
    println!("{}", baseline.row());
    let mut samples = vec![baseline.clone()];
    while watch.started.elapsed() < plan.run {
        let left = plan.run.saturating_sub(watch.started.elapsed());
        tokio::time::sleep(plan.interval.min(left)).await;
        let s = watch.take(&traffic).await;
        println!("{}", s.row());
        samples.push(s);
    }
    stop.cancel();
    for l in loops {
        let _ = tokio::time::timeout(Duration::from_secs(15), l).await;
    }
    let _ = prober.await;
    let settled = watch.settle(&traffic, &baseline).await;
    println!("{}", settled.row());

    let ok = judge(plan, &samples, &baseline, &settled, &traffic);
    legate.stop().await;
    mock.stop().await;
    Ok(ok)
}

/// How the run reads legate.
struct Watch {
    admin: String,
    pid: u32,
    started: Instant,
    health: Arc<Health>,
    http: reqwest::Client,
}

impl Watch {
    async fn take(&self, traffic: &Traffic) -> Sample {
        let at = self.started.elapsed();
        let done = outcomes(traffic);
        sample::take(&self.http, self.pid, &self.admin, at, &self.health, done).await
    }

    /// Once the load is gone, connections and descriptors should return to where they
    /// started: waits for that, up to `SETTLE_LIMIT`, and returns the last sample.
    async fn settle(&self, traffic: &Traffic, baseline: &Sample) -> Sample {
        let since = Instant::now();
        loop {
            let s = self.take(traffic).await;
            let done = s.data_conns == 0 && s.fds <= baseline.fds + 8;
            if done || since.elapsed() > SETTLE_LIMIT {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn outcomes(t: &Traffic) -> u64 {
    t.tallies
        .iter()
        .map(|k| {
            k.expected.load(std::sync::atomic::Ordering::Relaxed)
                + k.unexpected.load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum()
}

/// Prints the callers' outcomes and the bounds, observed against allowed; true when every
/// judged bound holds.
fn judge(
    plan: &Plan,
    samples: &[Sample],
    baseline: &Sample,
    settled: &Sample,
    t: &Traffic,
) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "\n| callers | as expected | otherwise | otherwise, by status (0: no answer) |\n|---|---|---|---|"
    );
    let (mut expected, mut unexpected) = (0, 0);
    for (name, k) in KINDS.iter().zip(t.tallies.iter()) {
        let (e, u) = (k.expected.load(Relaxed), k.unexpected.load(Relaxed));
        let by_status = k.otherwise.lock().map_or(String::new(), |m| {
            m.iter()
                .map(|(s, n)| format!("{s}×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        println!("| {name} | {e} | {u} | {by_status} |");
        expected += e;
        unexpected += u;
    }
    let leaks: u64 = t.tallies.iter().map(|k| k.leaks.load(Relaxed)).sum();
    let max = |f: fn(&Sample) -> u64| samples.iter().map(f).max().unwrap_or(0);
    // Warm-up: the first quarter of the run.
    let warm = samples
        .iter()
        .find(|s| s.at >= plan.run / 4)
        .map_or(baseline.rss_kib, |s| s.rss_kib);
    let last = samples.last().map_or(0, |s| s.rss_kib);
    let fd_cap = 2 * procs::MAX_CONNECTIONS + procs::ADMIN_MAX_CONNECTIONS + FD_SLACK;
    // (what, observed, bound, judged in a smoke run too)
    let checks: [(&str, u64, u64, bool); 11] = [
        ("RSS max (KiB)", max(|s| s.rss_kib), RSS_MAX_KIB, true),
        (
            "RSS growth after warm-up (KiB)",
            last.saturating_sub(warm),
            RSS_GROWTH_MAX_KIB,
            false,
        ),
        ("open fds max", max(|s| s.fds), fd_cap, true),
        (
            "open fds after the load, over the start",
            settled.fds.saturating_sub(baseline.fds),
            8,
            true,
        ),
        (
            "data connections max",
            max(|s| s.data_conns),
            procs::MAX_CONNECTIONS,
            true,
        ),
        (
            "data connections after the load",
            settled.data_conns,
            0,
            true,
        ),
        ("breakers max", max(|s| s.breakers), BREAKERS_MAX, true),
        ("ledger entries max", max(|s| s.ledger), LEDGER_MAX, true),
        ("/healthz failures", settled.health_failures, 0, false),
        ("provider key seen by a caller", leaks, 0, true),
        (
            "unexpected outcomes (per mille)",
            unexpected * 1000 / (expected + unexpected).max(1),
            10,
            false,
        ),
    ];
    println!("\n| bound | observed | allowed | judged | holds |\n|---|---|---|---|---|");
    let mut ok = true;
    for (what, seen, bound, always) in checks {
        let judged = always || plan.strict;
        let holds = seen <= bound;
        ok &= holds || !judged;
        println!(
            "| {what} | {seen} | {bound} | {} | {} |",
            if judged { "yes" } else { "no (smoke run)" },
            if holds { "yes" } else { "**no**" }
        );
    }
    if expected == 0 {
        println!("\nno caller was served: the run proves nothing");
        ok = false;
    }
    println!("\nsoak {}", if ok { "passed" } else { "FAILED" });
    ok
}
