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
    /// A connection could not be opened, written or read.
    Wire(std::io::Error),
    /// The response was not the HTTP/1.1 the client understands.
    Protocol(&'static str),
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
            BenchError::Wire(e) => write!(f, "connection failed: {e}"),
            BenchError::Protocol(what) => write!(f, "unexpected response: {what}"),
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
            BenchError::Wire(e) => Some(e),
            BenchError::Task(e) => Some(e),
            BenchError::Startup { .. }
            | BenchError::Protocol(_)
            | BenchError::Status(_)
            | BenchError::EmptyStream
            | BenchError::Timeout(_)
            | BenchError::Preflight { .. } => None,
        }
    }
}
