//! Seeing every request (SPEC §12): the access log, the request journal and OpenTelemetry
//! export, all fed from one set of facts per request (`facts`), gathered through a shared
//! handle (`request`) and reported once, when the request is over.
//!
//! The request path only ever records into memory: the log line is one write to stderr, the
//! journal a push into a bounded ring, spans a non-blocking push into a bounded queue.

pub mod capture;
pub mod facts;
pub mod journal;
pub mod logfmt;
pub mod otel;
pub mod request;
pub mod request_id;
pub mod traceparent;

use std::sync::Arc;

use prometheus::{IntCounterVec, Opts, Registry};

use crate::config::observe::ObserveConfig;
#[cfg(test)]
use facts::Facts;
use journal::Journal;
pub use request::RequestObs;
pub use request_id::RequestId;

/// Per server: where finished requests are reported.
pub struct Observer {
    journal: Journal,
    otel: Option<otel::Otel>,
}

impl Observer {
    /// Reports to the journal only (tests and tools that start no exporter).
    pub fn journal_only(size: usize) -> Self {
        Observer {
            journal: Journal::new(size),
            otel: None,
        }
    }

    /// Builds the journal and, if configured, starts export (inside the Tokio runtime).
    /// Registers `legate_telemetry_dropped_total` on `registry`.
    pub fn start(cfg: &ObserveConfig, registry: &Registry) -> Result<Self, String> {
        let dropped = IntCounterVec::new(
            Opts::new(
                "legate_telemetry_dropped_total",
                "Spans or metric streams dropped because the collector was slow, down, or the queue was full",
            ),
            &["signal"],
        )
        .map_err(|e| e.to_string())?;
        registry
            .register(Box::new(dropped.clone()))
            .map_err(|e| format!("metrics: {e}"))?;
        for signal in ["spans", "metrics"] {
            dropped.with_label_values(&[signal]);
        }
        let otel = if cfg.telemetry.enabled() {
            Some(otel::Otel::start(&cfg.telemetry, &dropped)?)
        } else {
            None
        };
        Ok(Observer {
            journal: Journal::new(cfg.journal.size),
            otel,
        })
    }

    /// Whether requests get trace ids (span export is on).
    pub fn tracing(&self) -> bool {
        self.otel.as_ref().is_some_and(otel::Otel::traces_on)
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    #[cfg(test)]
    pub(crate) fn report(&self, facts: Facts, capture: journal::Captured) {
        self.report_entry(Arc::new(journal::Entry { facts, capture }));
    }

    /// One finished request: the access-log line, the journal entry, the spans and metrics.
    /// The record is rendered only for a log line that is written (the macro evaluates its
    /// fields only when the access log is enabled); the journal keeps the entry itself.
    pub(crate) fn report_entry(&self, entry: Arc<journal::Entry>) {
        let facts = &entry.facts;
        tracing::info!(
            target: "legate::access",
            record = %serde_json::Value::Object(facts.record()),
            "request"
        );
        if let Some(o) = &self.otel {
            o.record(facts);
        }
        self.journal.push_entry(entry);
    }

    /// Exports what is still queued, within a bounded wait.
    pub async fn shutdown(&self) {
        if let Some(o) = &self.otel {
            o.shutdown(otel::SHUTDOWN_WAIT).await;
        }
    }
}

/// Shared by the proxy and the admin plane.
pub type SharedObserver = Arc<Observer>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_stays_within_its_bound_under_10000_requests() {
        let observer = Observer::journal_only(1000);
        for i in 0..10_000 {
            let mut f = Facts::new(
                RequestId::new(0, i),
                "anthropic",
                "POST".into(),
                "/v1/messages".into(),
                std::time::Instant::now(),
            );
            f.status = Some(200);
            observer.report(f, (None, None));
            assert!(observer.journal().len() <= 1000);
        }
        assert_eq!(observer.journal().len(), 1000);
        let id = |n| RequestId::new(0, n).render();
        assert!(observer.journal().get(&id(8999)).is_none());
        assert!(observer.journal().get(&id(9000)).is_some());
    }
}
