//! Which `legate` binary a run measures.
//!
//! `cargo bench` builds the `legate` it hands a benchmark (`CARGO_BIN_EXE_legate`) with the
//! package's dev-dependencies' features unified in: tokio's `test-util`, which makes every
//! clock read and timer check whether the clock is paused, and its `process` driver, whose
//! locks every runtime park takes. That binary runs more than the one `cargo build --release`
//! ships, so a judged run (`--bench`) builds the release binary itself and measures that;
//! `BENCH_LEGATE_BIN` names another one instead (`ab.py` does), and the smoke run
//! (`cargo test --all-targets`) keeps cargo's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::BenchError;

/// The binary to measure, and how it was chosen (for the machine line).
pub(crate) struct Legate {
    pub(crate) path: PathBuf,
    pub(crate) origin: &'static str,
}

/// The binary a run measures: `BENCH_LEGATE_BIN`, else for a judged run the release build
/// (built now, copied into `dir` so that a build meanwhile cannot swap it mid-run), else
/// cargo's.
pub(crate) fn choose(judged: bool, dir: &Path) -> Result<Legate, BenchError> {
    if let Some(path) = std::env::var_os("BENCH_LEGATE_BIN") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(BenchError::Preflight {
                target: "BENCH_LEGATE_BIN",
                detail: format!("{} is not a file", path.display()),
            });
        }
        return Ok(Legate {
            path,
            origin: "BENCH_LEGATE_BIN",
        });
    }
    if !judged {
        return Ok(Legate {
            path: PathBuf::from(env!("CARGO_BIN_EXE_legate")),
            origin: "cargo's bench build",
        });
    }
    let built = build_release()?;
    let path = dir.join("legate");
    std::fs::copy(&built, &path).map_err(|source| BenchError::Io {
        what: format!("cannot copy {} into the run's directory", built.display()),
        source,
    })?;
    Ok(Legate {
        path,
        origin: "release build",
    })
}

/// Runs `cargo build --release --bin legate` in this package (cargo's progress goes to
/// stderr) and returns the executable it reports.
fn build_release() -> Result<PathBuf, BenchError> {
    eprintln!("bench: building the release binary (cargo build --release --bin legate)");
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--bin",
            "legate",
            "--message-format=json",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
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
    executable(&messages).ok_or_else(|| BenchError::Preflight {
        target: "cargo build --release",
        detail: "no legate executable among its messages".to_owned(),
    })
}

/// The `legate` binary's path from cargo's JSON messages (one object per line).
fn executable(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "legate")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
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
