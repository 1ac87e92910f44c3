//! The benchmark's one error type: everything that can stop a run or fail a single request.

use std::fmt;
use std::time::Duration;

/// Why a run could not go on, or why one request did not count as a success.
#[derive(Debug)]
pub(crate) enum BenchError {
    /// A child process could not be started or its output could not be read.
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
    /// A child started but never announced its address (it exited, or printed something else).
    Startup { what: &'static str, detail: String },
    /// A file the run needs (config, /proc) could not be written or read.
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A request could not be built (bad URI or header).
    Request(http::Error),
    /// The client failed before a response arrived (connect, write, protocol).
    Client(hyper_util::client::legacy::Error),
    /// The response body broke off.
    Body(hyper::Error),
    /// The response arrived with a status other than 200.
    Status(http::StatusCode),
    /// A streaming response ended before any body byte.
    EmptyStream,
    /// No complete answer within the per-request limit.
    Timeout(Duration),
    /// A check before the measurements failed; the message says which.
    Preflight {
        target: &'static str,
        detail: String,
    },
    /// A load task panicked or was cancelled.
    Task(tokio::task::JoinError),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Spawn { what, source } => write!(f, "cannot start {what}: {source}"),
            BenchError::Startup { what, detail } => write!(f, "{what} did not start: {detail}"),
            BenchError::Io { what, source } => write!(f, "{what}: {source}"),
            BenchError::Request(e) => write!(f, "cannot build the request: {e}"),
            BenchError::Client(e) => write!(f, "request failed: {e}"),
            BenchError::Body(e) => write!(f, "response body broke off: {e}"),
            BenchError::Status(s) => write!(f, "unexpected status {s}"),
            BenchError::EmptyStream => write!(f, "stream ended before its first byte"),
            BenchError::Timeout(d) => write!(f, "no complete answer within {d:?}"),
            BenchError::Preflight { target, detail } => write!(f, "{target}: {detail}"),
            BenchError::Task(e) => write!(f, "a load task died: {e}"),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BenchError::Spawn { source, .. } | BenchError::Io { source, .. } => Some(source),
            BenchError::Request(e) => Some(e),
            BenchError::Client(e) => Some(e),
            BenchError::Body(e) => Some(e),
            BenchError::Task(e) => Some(e),
            BenchError::Startup { .. }
            | BenchError::Status(_)
            | BenchError::EmptyStream
            | BenchError::Timeout(_)
            | BenchError::Preflight { .. } => None,
        }
    }
}
