//! Which `legate` binary a run measures.
//!
//! `cargo bench` builds the `legate` it hands a benchmark (`CARGO_BIN_EXE_legate`) with the
//! package's dev-dependencies' features unified in: tokio's `test-util`, which makes every
//! clock read and timer check whether the clock is paused, and its `process` driver, whose
//! locks every runtime park takes. That binary runs more than the one `cargo build --release`
//! ships, so a judged run (`--bench`) builds the release binary itself and measures that;
//! `BENCH_LEGATE_BIN` names another one instead (`ab.py` does), and the smoke run
//! (`cargo test --all-targets`) keeps cargo's.
//!
//! Both profiles write `target/release/legate` (the bench profile's output directory is
//! `release`), so after a judged run that path holds the release build until cargo links its
//! own there again: `cargo bench` with no `--bench` runs the soak after this benchmark, on the
//! release build.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// The longest a run waits, after building, for the machine's load to come down.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// The binary to measure, and how it was chosen (for the machine line).
pub(crate) struct Legate {
    pub(crate) path: PathBuf,
    pub(crate) origin: &'static str,
}

/// The binary a run measures, copied into `dir` so that a build meanwhile cannot swap it
/// mid-run: `BENCH_LEGATE_BIN`, else for a judged run the release build (built now), else
/// cargo's.
pub(crate) async fn choose(judged: bool, dir: &Path) -> Result<Legate, BenchError> {
    let (from, origin) = if let Some(path) = std::env::var_os("BENCH_LEGATE_BIN") {
        (PathBuf::from(path), "BENCH_LEGATE_BIN")
    } else if judged {
        (build_release().await?, "release build")
    } else {
        return Ok(Legate {
            path: PathBuf::from(env!("CARGO_BIN_EXE_legate")),
            origin: "the build cargo made for this run",
        });
    };
    let path = dir.join("legate");
    std::fs::copy(&from, &path).map_err(|source| BenchError::Io {
        what: format!("cannot copy {} into the run's directory", from.display()),
        source,
    })?;
    Ok(Legate { path, origin })
}

/// Runs `cargo build --release --bin legate` in this package (cargo's progress goes to
/// stderr) and returns the executable it reports. When it compiled anything, waits (at most
/// [`SETTLE_LIMIT`]) for the load average to come down, so that the run does not start on
/// the build's heat and its machine line does not report the build as other work.
async fn build_release() -> Result<PathBuf, BenchError> {
    eprintln!("bench: building the release binary (cargo build --release --bin legate)");
    // The cargo that runs this benchmark (it sets CARGO), else the one that built it.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let mut cmd = tokio::process::Command::new(cargo);
    // What cargo set for running this benchmark (legate's package facts, its OUT_DIR) is not
    // the environment a build from a shell has. Build scripts that watch such a variable
    // (ring's watches CARGO_PKG_NAME) would run again, and everything above them be compiled
    // again, here and once more at the next build from a shell.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(run_only) {
            cmd.env_remove(name);
        }
    }
    let out = cmd
        .args(["build", "--release", "--locked", "--bin", "legate"])
        .arg("--message-format=json")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .map_err(|source| BenchError::Spawn {
            what: "cargo build --release",
            source,
        })?;
    let messages = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(BenchError::Preflight {
            target: "cargo build --release",
            detail: format!("{}; {}", out.status, rendered_errors(&messages)),
        });
    }
    let (path, fresh) = executable(&messages).ok_or_else(|| BenchError::Preflight {
        target: "cargo build --release",
        detail: "no legate executable among its messages".to_owned(),
    })?;
    if !fresh {
        settle().await;
    }
    Ok(path)
}

/// Whether cargo sets the variable `name` for a benchmark it runs (and a shell has not got it).
fn run_only(name: &str) -> bool {
    ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_EXE_"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || [
            "OUT_DIR",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
        ]
        .contains(&name)
}

/// Waits until the 1-minute load average is under half the cores, or [`SETTLE_LIMIT`].
async fn settle() {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let started = Instant::now();
    eprintln!("bench: waiting for the build's load to come down (at most {SETTLE_LIMIT:?})");
    while started.elapsed() < SETTLE_LIMIT {
        let load: f64 = crate::report::load_average().parse().unwrap_or(0.0);
        if load < cores / 2.0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The `legate` binary's path from cargo's JSON messages (one object per line), and whether
/// cargo found it up to date.
fn executable(messages: &str) -> Option<(PathBuf, bool)> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "legate")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .find_map(|m| {
            let path = PathBuf::from(m["executable"].as_str()?);
            Some((path, m["fresh"].as_bool().unwrap_or(false)))
        })
}

/// The compiler's rendered errors among cargo's JSON messages, for a failed build.
fn rendered_errors(messages: &str) -> String {
    let errors: Vec<String> = messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-message" && m["message"]["level"] == "error")
        .filter_map(|m| m["message"]["rendered"].as_str().map(str::to_owned))
        .collect();
    if errors.is_empty() {
        "see cargo's output above".to_owned()
    } else {
        errors.join("\n")
    }
}
