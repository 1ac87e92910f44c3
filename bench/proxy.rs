//! legate's overhead benchmark (`cargo bench --bench proxy`): the same load against
//! `legate mock` directly, through `legate serve` in front of it, and through nginx in front
//! of it when nginx is installed, side by side, on `/v1/messages` and `/v1/responses`, judged
//! against the product targets (added p99 at most 0.3 ms at 1,000 req/s and no worse than
//! nginx's, throughput at least half the bare mock's and nginx's, CPU per request at most
//! 1.5 × nginx's, added stream time to first byte at most 0.3 ms, RSS at most 20 MiB after
//! 10,000 requests, cold start at most 50 ms). A second table shows what the access log and
//! OTLP trace export add (legate with each on vs both off).
//!
//! Progress goes to stderr; the Markdown results tables and the machine line go to stdout.
//! `--quick` (or `BENCH_QUICK=1`) runs one short sample. Run without `--bench` (as
//! `cargo test --all-targets` does) it is a smoke run of a few seconds that checks the
//! machinery and judges nothing.

mod binary;
mod children;
mod client;
mod error;
mod load;
mod nginx;
mod observe;
mod pair;
mod phases;
mod report;
mod results;
mod sink;
mod wire;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use children::Running;
use client::Target;
use error::BenchError;

/// How long each phase runs.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The name printed with the results.
    pub name: &'static str,
    /// Whether the results may be judged against the targets (a release build, full length).
    pub judged: bool,
    pub warmup: Duration,
    /// Measured open-loop time per sample, every side interleaved.
    pub per_rate: Duration,
    /// How many times the latency and throughput phases are repeated.
    pub samples: u32,
    /// How many times legate is started to time its cold start.
    pub cold_starts: u32,
    /// Unmeasured load at the start of every throughput slice, so the side that sat idle is
    /// warm again.
    pub lead_in: Duration,
    pub stream_warmup: u32,
    pub streams: u32,
    pub throughput: Duration,
    pub throughput_slice: Duration,
    /// Requests legate must have served before its memory is read.
    pub min_requests: u64,
}

impl Plan {
    fn choose(args: &[String], quick_env: bool) -> Plan {
        let benching = args.iter().any(|a| a == "--bench");
        let quick = quick_env || args.iter().any(|a| a == "--quick");
        match (benching, quick) {
            (true, false) => Plan {
                name: "full run",
                judged: true,
                warmup: Duration::from_secs(1),
                per_rate: Duration::from_secs(5),
                samples: 3,
                cold_starts: 5,
                lead_in: Duration::from_millis(250),
                stream_warmup: 30,
                streams: 300,
                throughput: Duration::from_secs(3),
                throughput_slice: Duration::from_secs(1),
                min_requests: 10_000,
            },
            (true, true) => Plan {
                name: "quick run (--quick)",
                judged: true,
                warmup: Duration::from_millis(200),
                per_rate: Duration::from_secs(1),
                samples: 1,
                cold_starts: 3,
                lead_in: Duration::from_millis(100),
                stream_warmup: 10,
                streams: 60,
                throughput: Duration::from_secs(1),
                throughput_slice: Duration::from_millis(250),
                min_requests: 10_000,
            },
            (false, _) => Plan {
                name: "smoke run (not judged; run with cargo bench for results)",
                judged: false,
                warmup: Duration::from_millis(50),
                per_rate: Duration::from_millis(200),
                samples: 1,
                cold_starts: 1,
                lead_in: Duration::from_millis(20),
                stream_warmup: 2,
                streams: 10,
                throughput: Duration::from_millis(200),
                throughput_slice: Duration::from_millis(100),
                min_requests: 500,
            },
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick_env = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let plan = Plan::choose(&args, quick_env);
    if let Err(e) = report::self_check().and_then(|()| wire::self_check()) {
        eprintln!("bench: internal check failed: {e}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(plan)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("bench: {failed} requests failed; the results above are not trustworthy");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the children, measures, prints the table; returns the number of failed requests.
async fn run(plan: Plan) -> Result<u64, BenchError> {
    let dir = tempfile::tempdir().map_err(|source| BenchError::Io {
        what: "cannot create a temporary directory".to_owned(),
        source,
    })?;
    let legate = binary::choose(plan.judged, dir.path()).await?;
    let bin = legate.path.as_path();
    let load_before = report::load_average();
    eprintln!(
        "bench: {} with {} ({}; 1-min load average {load_before})",
        plan.name,
        bin.display(),
        legate.origin
    );
    let mock = children::start_mock(bin).await?;
    let result = with_mock(plan, bin, dir.path(), &mock).await;
    mock.stop().await;
    let tables = result?;
    println!("{}", report::table(&tables.main, &tables.names));
    println!("{}", report::table(&tables.observe, &observe::NAMES));
    println!(
        "{}",
        report::machine_line(plan.name, &load_before, legate.origin)
    );
    if let Some(note) = report::busy_note(&load_before) {
        println!("\n{note}");
    }
    Ok(tables.failed)
}

/// What a run prints: the main table (with its column names), the observability table, and
/// how many requests failed in either.
struct Tables {
    main: Vec<report::Row>,
    names: Vec<&'static str>,
    observe: Vec<report::Row>,
    failed: u64,
}

/// Everything that needs the mock: legate's cold starts, then legate (and nginx) in front of
/// it for the measurements.
async fn with_mock(
    plan: Plan,
    bin: &Path,
    dir: &Path,
    mock: &Running,
) -> Result<Tables, BenchError> {
    client::script_mock(&mock.base_url, client::MOCK_SCRIPT).await?;
    let cold = children::cold_starts(bin, dir, &mock.base_url, plan.cold_starts).await?;
    let legate = children::start_legate(bin, dir, &mock.base_url).await?;
    let nginx = match nginx::find() {
        Some(path) => match nginx::start(&path, dir, &mock.base_url) {
            Ok(n) => Some(n),
            Err(e) => {
                legate.stop().await;
                return Err(e);
            }
        },
        None => {
            eprintln!("bench: nginx is not installed; measuring without it");
            None
        }
    };
    eprintln!(
        "bench: mock at {}, legate at {}{}",
        mock.base_url,
        legate.base_url,
        nginx
            .as_ref()
            .map(|n| format!(", nginx at {}", n.base_url))
            .unwrap_or_default()
    );
    let result = measure(plan, mock, &legate, nginx.as_ref(), cold).await;
    if let Some(n) = nginx {
        n.stop();
    }
    let result = match result {
        Ok(main) => observe::run(plan, bin, dir, &mock.base_url, &legate)
            .await
            .map(|observed| (main, observed)),
        Err(e) => Err(e),
    };
    legate.stop().await;
    let ((main, names, failed), observed) = result?;
    if let Some(first) = observed.first_error() {
        eprintln!("bench: first failure (access log and tracing): {first}");
    }
    Ok(Tables {
        main,
        names,
        observe: observe::rows(&observed),
        failed: failed + observed.failed(),
    })
}

async fn measure(
    plan: Plan,
    mock: &Running,
    legate: &Running,
    nginx: Option<&nginx::Nginx>,
    cold: Vec<Duration>,
) -> Result<(Vec<report::Row>, Vec<&'static str>, u64), BenchError> {
    let mut targets = vec![
        Target::new("mock", &mock.base_url)?,
        Target::new("legate", &legate.base_url)?,
    ];
    let mut procs = vec![vec![mock.pid()], vec![legate.pid()]];
    if let Some(n) = nginx {
        targets.push(Target::new("nginx", &n.base_url)?);
        let mut family = vec![n.pid()];
        family.extend(children::children_of(n.pid()));
        procs.push(family);
    }
    let names = pair::NAMES[..targets.len()].to_vec();
    phases::preflight(&targets).await?;
    let at_start = children::memory(legate.pid())?;
    let results = phases::all(plan, &targets, &procs, at_start, cold).await?;
    let failed = results.failed();
    if let Some(first) = results.first_error() {
        eprintln!("bench: first failure: {first}");
    }
    Ok((results.rows(plan), names, failed))
}
