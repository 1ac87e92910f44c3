//! What the soak watches while it runs: legate's resident memory and open descriptors (from
//! /proc), its open-connection gauges (from `/metrics`), the size of the state keyed by
//! caller-chosen names (breakers in `/admin/state`, ledger entries in `/admin/usage`), and
//! whether `/healthz` answers — each probe on a new connection, so a full data plane or a crowd
//! of hostile peers would show here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::procs;

/// One row of the table.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    pub(crate) at: Duration,
    pub(crate) rss_kib: u64,
    pub(crate) fds: u64,
    pub(crate) data_conns: u64,
    pub(crate) admin_conns: u64,
    pub(crate) breakers: u64,
    pub(crate) ledger: u64,
    /// Slowest `/healthz` answer since the previous sample, in ms.
    pub(crate) health_max_ms: u64,
    /// `/healthz` probes that failed or took over 2 s, in all.
    pub(crate) health_failures: u64,
    /// Caller outcomes so far, every kind together.
    pub(crate) outcomes: u64,
}

impl Sample {
    pub(crate) fn header() -> &'static str {
        "| t (s) | RSS (MiB) | fds | data conns | admin conns | breakers | ledger entries | /healthz max (ms) | /healthz failures | outcomes |\n|---|---|---|---|---|---|---|---|---|---|"
    }

    pub(crate) fn row(&self) -> String {
        format!(
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.at.as_secs(),
            self.rss_kib as f64 / 1024.0,
            self.fds,
            self.data_conns,
            self.admin_conns,
            self.breakers,
            self.ledger,
            self.health_max_ms,
            self.health_failures,
            self.outcomes
        )
    }
}

/// The `/healthz` prober's findings, read and reset by each sample.
#[derive(Default)]
pub(crate) struct Health {
    max_ms: AtomicU64,
    failures: AtomicU64,
}

/// Probes `/healthz` every 500 ms, each time on a new connection, until `stop`.
pub(crate) async fn probe_health(admin: String, health: Arc<Health>, stop: CancellationToken) {
    let Ok(http) = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
    else {
        return;
    };
    while !stop.is_cancelled() {
        let started = Instant::now();
        let r = http
            .get(format!("{admin}/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        let ms = started.elapsed().as_millis() as u64;
        match r {
            Ok(r) if r.status() == 200 => {
                health.max_ms.fetch_max(ms, Ordering::Relaxed);
            }
            _ => {
                health.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// Reads one sample of legate (`pid`, admin plane at `admin`).
pub(crate) async fn take(
    http: &reqwest::Client,
    pid: u32,
    admin: &str,
    at: Duration,
    health: &Health,
    outcomes: u64,
) -> Sample {
    let metrics = get_text(http, &format!("{admin}/metrics")).await;
    let gauge = |plane: &str| {
        let name = format!("legate_connections{{plane=\"{plane}\"}}");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    let state = get_json(http, &format!("{admin}/admin/state")).await;
    let usage = get_json(http, &format!("{admin}/admin/usage")).await;
    let ledger = usage["tenants"]
        .as_object()
        .map(|t| {
            t.values()
                .filter_map(|m| m.as_object())
                .map(|m| m.len() as u64)
                .sum()
        })
        .unwrap_or(0);
    Sample {
        at,
        rss_kib: procs::rss_kib(pid).unwrap_or(0),
        fds: procs::open_fds(pid).unwrap_or(0),
        data_conns: gauge("data"),
        admin_conns: gauge("admin"),
        breakers: state["breakers"].as_array().map_or(0, |b| b.len() as u64),
        ledger,
        health_max_ms: health.max_ms.swap(0, Ordering::Relaxed),
        health_failures: health.failures.load(Ordering::Relaxed),
        outcomes,
    }
}

async fn get_text(http: &reqwest::Client, url: &str) -> String {
    match http.get(url).timeout(Duration::from_secs(5)).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    serde_json::from_str(&get_text(http, url).await).unwrap_or_default()
}
