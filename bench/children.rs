//! The two processes under measurement, `legate mock` and `legate serve`: started with the
//! environment the benchmark needs, their announced address read from stdout, their output
//! drained for as long as they run (a full pipe would stall them), and their memory read from
//! /proc.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::error::BenchError;

/// How long a child may take to print its listening line.
const STARTUP_LIMIT: Duration = Duration::from_secs(20);

/// Dummy provider keys: the mock checks none, but legate refuses a provider without its key.
const CHILD_ENV: [(&str, &str); 2] = [
    ("ANTHROPIC_API_KEY", "bench-anthropic-key"),
    ("OPENAI_API_KEY", "bench-openai-key"),
];
/// Warnings only: no access log (it is written at `info`).
const QUIET: &str = "warn";
/// Warnings, and the access log's one line per request.
const ACCESS_LOG: &str = "warn,legate::access=info";

/// What a `legate serve` instance records besides metrics (which are always on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observe {
    /// No access log, no trace export: the instance the main table measures.
    Off,
    /// The access log (JSON, the default format) written to a file, as a deployment that
    /// keeps its log would.
    AccessLog,
    /// Spans and GenAI metrics exported over OTLP/HTTP to a collector at this address.
    Tracing(SocketAddr),
}

impl Observe {
    fn name(self) -> &'static str {
        match self {
            Observe::Off => "off",
            Observe::AccessLog => "access-log",
            Observe::Tracing(_) => "tracing",
        }
    }
}

/// A running child; killed when dropped, or explicitly with [`Running::stop`].
pub(crate) struct Running {
    child: Child,
    pid: u32,
    /// The data-plane base URL, `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// legate's admin-plane base URL (`None` for the mock).
    pub admin_url: Option<String>,
}

impl Running {
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Kills the child and reaps it.
    pub(crate) async fn stop(mut self) {
        // Already exited is fine: nothing is left to stop.
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// Starts `legate mock --listen 127.0.0.1:0`.
pub(crate) async fn start_mock(bin: &Path) -> Result<Running, BenchError> {
    let mut command = Command::new(bin);
    command
        .args(["mock", "--listen", "127.0.0.1:0"])
        .env("LEGATE_LOG", QUIET)
        .stderr(Stdio::piped());
    start(command, "legate mock", |line| {
        let data = line.strip_prefix("legate mock listening on ")?;
        Some((data.to_owned(), None))
    })
    .await
}

/// Starts `legate serve` with a config whose providers both point at `mock_url`; the config
/// file is written into `dir`.
pub(crate) async fn start_legate(
    bin: &Path,
    dir: &Path,
    mock_url: &str,
) -> Result<Running, BenchError> {
    start_observing(bin, dir, mock_url, Observe::Off).await
}

/// [`start_legate`] with the access log or trace export on. The access log goes to
/// `access-log.jsonl` in `dir`.
pub(crate) async fn start_observing(
    bin: &Path,
    dir: &Path,
    mock_url: &str,
    observe: Observe,
) -> Result<Running, BenchError> {
    if let Some(floor) = floor(bin)? {
        return start_floor(&floor, mock_url).await;
    }
    let io = |what: String| move |source| BenchError::Io { what, source };
    let config_path = dir.join(format!("legate-bench-{}.toml", observe.name()));
    std::fs::write(
        &config_path,
        config_text(mock_url, observe, journal_size()?),
    )
    .map_err(io(format!("cannot write {}", config_path.display())))?;
    let mut command = legate_command(bin);
    command.arg("serve").arg("--config").arg(&config_path);
    if observe == Observe::AccessLog {
        let path = access_log_path(dir);
        let file = std::fs::File::create(&path)
            .map_err(io(format!("cannot create {}", path.display())))?;
        command.env("LEGATE_LOG", ACCESS_LOG).stderr(file);
    } else {
        command.env("LEGATE_LOG", QUIET).stderr(Stdio::piped());
    }
    // The mock keeps its own default.
    command.env("TOKIO_WORKER_THREADS", legate_workers());
    start(command, "legate serve", |line| {
        let rest = line.strip_prefix("legate listening on ")?;
        let (data, admin) = rest.split_once(" (admin ")?;
        Some((
            data.to_owned(),
            Some(admin.trim_end_matches(')').to_owned()),
        ))
    })
    .await
}

/// With `BENCH_FLOOR=1`, the bare hyper proxy `examples/hyper_floor.rs` (built beside the
/// legate binary by `cargo build --release --example hyper_floor`) takes legate's place, to
/// show what legate's HTTP stack costs without legate's own work.
pub(crate) fn floor(bin: &Path) -> Result<Option<std::path::PathBuf>, BenchError> {
    if std::env::var("BENCH_FLOOR").map_or(true, |v| v != "1") {
        return Ok(None);
    }
    let path = bin.with_file_name("examples").join("hyper_floor");
    if !path.exists() {
        return Err(BenchError::Startup {
            what: "hyper floor",
            detail: format!(
                "{} is missing: cargo build --release --example hyper_floor",
                path.display()
            ),
        });
    }
    Ok(Some(path))
}

/// The floor listens on one port and answers `/readyz` there itself: that is its admin plane.
async fn start_floor(floor: &Path, mock_url: &str) -> Result<Running, BenchError> {
    let mut command = Command::new(floor);
    command
        .args(["127.0.0.1:0", mock_url])
        .stderr(Stdio::piped());
    start(command, "hyper floor", |line| {
        let data = line.strip_prefix("hyper floor listening on ")?;
        Some((data.to_owned(), Some(data.to_owned())))
    })
    .await
}

/// legate's worker threads: as many as nginx has workers, or `BENCH_LEGATE_THREADS` to
/// compare others.
pub(crate) fn legate_workers() -> String {
    std::env::var("BENCH_LEGATE_THREADS").unwrap_or_else(|_| crate::nginx::WORKERS.to_string())
}

/// The command that starts legate: the binary itself, or, with `BENCH_LEGATE_CPUS` set (a
/// `taskset` CPU list such as `0`), the binary run by `taskset -c` on those CPUs, every thread
/// of it: to compare legate's workers spread over the cores with the same workers sharing one,
/// where they never move between cores. The hyper floor (`BENCH_FLOOR=1`) is started as it is.
fn legate_command(bin: &Path) -> Command {
    match legate_cpus() {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpus).arg(bin);
            command
        }
        None => Command::new(bin),
    }
}

/// The CPU list `BENCH_LEGATE_CPUS` confines legate to, if set.
pub(crate) fn legate_cpus() -> Option<String> {
    std::env::var("BENCH_LEGATE_CPUS")
        .ok()
        .map(|cpus| cpus.trim().to_owned())
        .filter(|cpus| !cpus.is_empty())
}

/// Where an [`Observe::AccessLog`] instance writes its log.
pub(crate) fn access_log_path(dir: &Path) -> std::path::PathBuf {
    dir.join("access-log.jsonl")
}

/// The bench config: both APIs to the mock, and a concurrency limit high enough that
/// admission never queues during the throughput phase; trace export when asked for.
/// `BENCH_JOURNAL_SIZE`: legate's `[journal] size` for the run (unset: legate's default,
/// 1,000; 0 turns the journal off), to see what keeping it costs. A value that is not a whole
/// number stops the run, rather than measuring the default under a name it does not have.
fn journal_size() -> Result<Option<u64>, BenchError> {
    match std::env::var("BENCH_JOURNAL_SIZE") {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| BenchError::Preflight {
                target: "BENCH_JOURNAL_SIZE",
                detail: format!("{v:?} is not a whole number of requests (0 turns it off)"),
            }),
    }
}

fn config_text(mock_url: &str, observe: Observe, journal: Option<u64>) -> String {
    let telemetry = match observe {
        Observe::Tracing(collector) => {
            format!("\n[telemetry]\notlp_endpoint = \"http://{collector}\"\n")
        }
        Observe::Off | Observe::AccessLog => String::new(),
    };
    let journal = match journal {
        Some(n) => format!("\n[journal]\nsize = {n}\n"),
        None => String::new(),
    };
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
kind = "anthropic"
base_url = "{mock_url}"
api_key_env = "ANTHROPIC_API_KEY"
max_concurrency = 4096

[providers.openai]
kind = "openai"
base_url = "{mock_url}"
api_key_env = "OPENAI_API_KEY"
max_concurrency = 4096

# Every relayed Responses answer is stored for `previous_response_id`; the default bound
# (64 MiB) would make the RSS rows measure that cache rather than legate. 4 MiB keeps the
# store in the measurement without letting it dominate it.
[responses]
max_bytes = 4194304
{telemetry}{journal}"#
    )
}

async fn start(
    mut command: Command,
    what: &'static str,
    parse: impl Fn(&str) -> Option<(String, Option<String>)>,
) -> Result<Running, BenchError> {
    // The caller chose stderr: a pipe (forwarded below) or a file.
    command
        .envs(CHILD_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|source| BenchError::Spawn { what, source })?;
    let missing = |detail: &str| BenchError::Startup {
        what,
        detail: detail.to_owned(),
    };
    let pid = child.id().ok_or_else(|| missing("exited at once"))?;
    let stdout = child.stdout.take().ok_or_else(|| missing("no stdout"))?;
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(forward(stderr, what));
    }
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(STARTUP_LIMIT, lines.next_line())
        .await
        .map_err(|_| missing("no listening line within 20 s"))?
        .map_err(|source| BenchError::Spawn { what, source })?
        .ok_or_else(|| missing("stdout closed before the listening line"))?;
    let (base_url, admin_url) =
        parse(&first).ok_or_else(|| missing(&format!("unexpected first line {first:?}")))?;
    tokio::spawn(async move {
        // Keep reading so the child never blocks on a full pipe; the content is not needed.
        while let Ok(Some(_)) = lines.next_line().await {}
    });
    Ok(Running {
        child,
        pid,
        base_url,
        admin_url,
    })
}

/// Passes a child's log lines on to our stderr, prefixed, so warnings stay visible.
async fn forward(stream: impl AsyncRead + Unpin, what: &'static str) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("[{what}] {line}");
    }
}

/// Resident and peak memory of a process, in bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    pub rss: u64,
    pub peak: u64,
}

/// Reads VmRSS and VmHWM from /proc/PID/status.
pub(crate) fn memory(pid: u32) -> Result<Memory, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
        what: format!("cannot read {path}"),
        source,
    })?;
    let field = |name: &str| -> Result<u64, BenchError> {
        parse_kib(&text, name).ok_or_else(|| BenchError::Io {
            what: format!("{path} has no readable {name} (has the process exited?)"),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        })
    };
    Ok(Memory {
        rss: field("VmRSS")?,
        peak: field("VmHWM")?,
    })
}

/// The value of a `Name:   1234 kB` line, in bytes.
fn parse_kib(status: &str, name: &str) -> Option<u64> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// CPU time (user + system) a process and the given others have used so far, from
/// `/proc/PID/stat` (in clock ticks of 10 ms); processes that are gone count nothing.
pub(crate) fn cpu_time(pids: &[u32]) -> Duration {
    let ticks: u64 = pids
        .iter()
        .filter_map(|&pid| stat_fields(pid))
        .map(|f| f.1 + f.2)
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The part of [`cpu_time`] spent in the kernel (system time): what a process's system calls
/// and the socket work they start cost, as against its own code.
pub(crate) fn system_time(pids: &[u32]) -> Duration {
    let ticks: u64 = pids
        .iter()
        .filter_map(|&pid| stat_fields(pid))
        .map(|f| f.2)
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The processes whose parent is `pid` (nginx's workers).
pub(crate) fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| stat_fields(child).is_some_and(|f| f.0 == pid))
        .collect()
}

/// (parent pid, utime, stime in ticks) from `/proc/PID/stat`. The command name may contain
/// spaces and parentheses, so the fields are counted from the last `)`.
fn stat_fields(pid: u32) -> Option<(u32, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15), numbered from 1 with pid.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime, stime))
}

/// Time from starting `legate serve` to its first `/readyz` 200, once per start; each
/// instance is stopped before the next starts.
pub(crate) async fn cold_starts(
    bin: &Path,
    dir: &Path,
    mock_url: &str,
    times: u32,
) -> Result<Vec<Duration>, BenchError> {
    let mut out = Vec::new();
    for _ in 0..times {
        let started = std::time::Instant::now();
        let legate = start_legate(bin, dir, mock_url).await?;
        let ready = ready(&legate).await;
        legate.stop().await;
        out.push(ready?.saturating_duration_since(started));
    }
    Ok(out)
}

/// Polls `/readyz` on the admin plane until it answers 200; when it did.
async fn ready(legate: &Running) -> Result<std::time::Instant, BenchError> {
    let admin = legate
        .admin_url
        .as_deref()
        .ok_or(BenchError::Protocol("legate printed no admin address"))?;
    let addr = crate::wire::address(admin)?;
    let request = crate::wire::request("GET", "/readyz", &addr.to_string(), &[], "");
    let until = std::time::Instant::now() + STARTUP_LIMIT;
    loop {
        let mut conn = crate::wire::Conn::open(addr).await?;
        if conn.exchange(&request).await?.status == 200 {
            return Ok(std::time::Instant::now());
        }
        if std::time::Instant::now() > until {
            return Err(BenchError::Startup {
                what: "legate serve",
                detail: "/readyz never answered 200".to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
