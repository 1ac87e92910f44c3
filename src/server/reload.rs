//! Config reload (SIGHUP or `POST /admin/reload`): the config is re-read from where it came
//! from, validated, and swapped whole and atomically. Requests and streams in flight keep the
//! snapshot they started with; new requests use the new one. An invalid config is refused and
//! the old one stays. Breaker states and the retry budget carry over. The listen addresses are
//! bound once: changing them needs a restart, which the reload reports.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use tokio::task::JoinHandle;

use crate::config::{Config, ConfigErrors};
use crate::proxy::{Proxy, Snapshot};

/// Where a reload reads the config from (the same place `serve` read it at start).
pub type ConfigSource = Arc<dyn Fn() -> Result<Config, ConfigErrors> + Send + Sync>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    Applied {
        config_hash: String,
        /// Settings that changed but only take effect after a restart.
        restart_required: Vec<String>,
    },
    Refused(Vec<String>),
}

pub struct Reloader {
    source: Option<ConfigSource>,
    proxy: Arc<Proxy>,
    listen: SocketAddr,
    admin_listen: SocketAddr,
    /// `max_connections`, `admin_max_connections`: each plane's cap is fixed at start.
    caps: (usize, usize),
    /// `server.worker_threads`: the workers are started once.
    worker_threads: usize,
    ratelimit: crate::config::RateLimitConfig,
    /// `[responses] store`: the conversation store is made once.
    responses_store: crate::config::StoreKind,
    /// `[log]`, `[telemetry]`, `[journal]` are applied once, at start.
    observe: crate::config::observe::ObserveConfig,
    watchers: Mutex<Vec<JoinHandle<()>>>,
    /// Serialises reloads: two at once would race on the snapshot swap.
    busy: Mutex<()>,
}

impl Reloader {
    /// The data plane's workers, as started (`server.worker_threads` or its override).
    pub fn worker_threads(&self) -> usize {
        self.worker_threads
    }

    pub fn new(
        source: Option<ConfigSource>,
        proxy: Arc<Proxy>,
        started_with: &Config,
        watchers: Vec<JoinHandle<()>>,
    ) -> Self {
        Reloader {
            source,
            proxy,
            listen: started_with.server.listen,
            admin_listen: started_with.server.admin_listen,
            caps: (
                started_with.server.limits.max_connections,
                started_with.server.limits.admin_max_connections,
            ),
            worker_threads: started_with.server.worker_threads,
            ratelimit: started_with.ratelimit.clone(),
            responses_store: started_with.responses.store,
            observe: started_with.observe.clone(),
            watchers: Mutex::new(watchers),
            busy: Mutex::new(()),
        }
    }

    pub fn reload(&self) -> ReloadOutcome {
        let _busy = self.busy.lock();
        let outcome = self.try_reload();
        let result = match &outcome {
            ReloadOutcome::Applied { .. } => "ok",
            ReloadOutcome::Refused(_) => "error",
        };
        self.proxy
            .metrics
            .config_reloads
            .with_label_values(&[result])
            .inc();
        outcome
    }

    fn try_reload(&self) -> ReloadOutcome {
        let Some(source) = &self.source else {
            return ReloadOutcome::Refused(vec![
                "legate was started without a config source to re-read".to_string(),
            ]);
        };
        let cfg = match source() {
            Ok(cfg) => cfg,
            Err(errors) => {
                let lines: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
                for line in &lines {
                    tracing::error!(problem = %line, "config reload refused; the running config stays");
                }
                return ReloadOutcome::Refused(lines);
            }
        };
        // The data plane keeps listening where it started until a restart: the rule that a
        // non-loopback address needs [[clients]] holds for that address, whatever the new
        // file says its next one will be.
        if !crate::loopback::is_loopback_ip(self.listen.ip()) && cfg.clients.is_empty() {
            let line = format!(
                "server.listen: the data plane listens on `{}`, reachable from other hosts, \
                 until a restart; a config without [[clients]] keys cannot apply to it",
                self.listen
            );
            tracing::error!(problem = %line, "config reload refused; the running config stays");
            return ReloadOutcome::Refused(vec![line]);
        }
        let mut restart_required = Vec::new();
        if cfg.server.listen != self.listen {
            restart_required.push("server.listen".to_string());
        }
        if cfg.server.admin_listen != self.admin_listen {
            restart_required.push("server.admin_listen".to_string());
        }
        let l = &cfg.server.limits;
        if l.max_connections != self.caps.0 {
            restart_required.push("server.max_connections".to_string());
        }
        if l.admin_max_connections != self.caps.1 {
            restart_required.push("server.admin_max_connections".to_string());
        }
        if cfg.server.worker_threads != self.worker_threads {
            restart_required.push("server.worker_threads".to_string());
        }
        // The bucket store is chosen once: its buckets must not vanish with a reload.
        if cfg.ratelimit.store != self.ratelimit.store {
            restart_required.push("ratelimit.store".to_string());
        }
        if cfg.ratelimit.redis_url != self.ratelimit.redis_url {
            restart_required.push("ratelimit.redis_url".to_string());
        }
        let (now, then) = (&cfg.observe, &self.observe);
        if now.log != then.log {
            restart_required.push("log".to_string());
        }
        if now.telemetry != then.telemetry {
            restart_required.push("telemetry".to_string());
        }
        // capture and capture_bytes apply to new requests at once; the ring is sized at start.
        if now.journal.size != then.journal.size {
            restart_required.push("journal.size".to_string());
        }
        // The conversation store is made once (its kind, and Redis's connections); its
        // bounds are applied below, once the reload is sure to go through.
        if cfg.responses.store != self.responses_store {
            restart_required.push("responses.store".to_string());
        }
        let responses = (cfg.responses.max_bytes, cfg.responses.ttl);
        let breaker = cfg.breaker.clone();
        let ratio = cfg.retry.budget_ratio;
        let snapshot = match Snapshot::new(Arc::new(cfg), &self.proxy.lanes) {
            Ok(mut s) => {
                s.keep_parts_of(&self.proxy.snapshot.load());
                s
            }
            Err(e) => {
                tracing::error!(problem = %e, "config reload refused; the running config stays");
                return ReloadOutcome::Refused(vec![e]);
            }
        };
        let fresh: Vec<JoinHandle<()>> = snapshot
            .upstreams
            .values()
            .filter_map(|u| u.spawn_key_watch())
            .collect();
        let config_hash = snapshot.hash.clone();
        self.proxy.breakers.set_config(breaker);
        // A provider sent to another endpoint (its URL, kind or platform settings) starts
        // with its breakers closed: forgotten once the new config is in place, so that only
        // requests made before it (still on the old endpoint) can report to the old key.
        let before = self.proxy.snapshot.load_full();
        let moved: Vec<String> = snapshot
            .cfg
            .providers
            .iter()
            .filter(|(name, p)| {
                before.cfg.providers.get(*name).is_some_and(|old| {
                    old.base_url != p.base_url
                        || old.kind != p.kind
                        || format!("{:?}", old.platform) != format!("{:?}", p.platform)
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        let removed: Vec<String> = before
            .cfg
            .providers
            .keys()
            .filter(|name| !snapshot.cfg.providers.contains_key(*name))
            .cloned()
            .collect();
        self.proxy.budget.set_ratio(ratio);
        let (max_bytes, ttl) = responses;
        let fixed = self.proxy.conversations.reconfigure(max_bytes, ttl);
        restart_required.extend(fixed.into_iter().map(str::to_owned));
        self.proxy.snapshot.store(Arc::new(snapshot));
        for name in &moved {
            self.proxy.breakers.forget_provider(name);
        }
        let providers = &self.proxy.snapshot.load().cfg.providers;
        self.proxy
            .breakers
            .providers_now(|p| providers.contains_key(p));
        for name in &removed {
            self.proxy.breakers.forget_removed(name);
        }
        // A key file the new config keeps is watched by the watcher already running (the cell
        // is shared, `Lanes::key`): `fresh` holds the new files' only. The others run on until
        // the last config using their cell is gone (a watcher holds its cell weakly), so that a
        // request still on an old config (queued, or retrying after a backoff) sends the key a
        // rotation brought; those that ended are let go.
        {
            let mut w = self.watchers.lock();
            w.retain(|h| !h.is_finished());
            w.extend(fresh);
        }
        for key in &restart_required {
            tracing::warn!(setting = %key, "changed in the config, but takes effect only after a restart");
        }
        tracing::info!(config_hash = %config_hash, "config reloaded");
        ReloadOutcome::Applied {
            config_hash,
            restart_required,
        }
    }

    pub fn stop_watchers(&self) {
        let handles = std::mem::take(&mut *self.watchers.lock());
        for h in handles {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::proxy::Snapshot;

    const CLIENTS: &str = "[[clients]]\ntenant = \"a\"\nkey_sha256 = \"f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4\"\n";

    fn config(toml: &str) -> Config {
        crate::config::load_str(toml, &HashMap::new()).unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// Started on a non-loopback address with client keys, legate keeps that address until a
    /// restart: a reload that drops the keys (saying its next address is loopback) would leave
    /// the port open to anyone, and is refused.
    #[tokio::test]
    async fn keys_guarding_a_public_listener_stay_until_a_restart() {
        let started = config(&format!("[server]\nlisten = \"10.1.2.3:8787\"\n{CLIENTS}"));
        let (proxy, _) = proxy_on(&started);
        let next = Arc::new(parking_lot::Mutex::new(String::new()));
        let read = next.clone();
        let source: ConfigSource =
            Arc::new(move || crate::config::load_str(&read.lock(), &HashMap::new()));
        let reloader = Reloader::new(Some(source), proxy, &started, Vec::new());
        *next.lock() = "[server]\nlisten = \"127.0.0.1:8787\"\n".to_owned();
        match reloader.reload() {
            ReloadOutcome::Refused(lines) => {
                assert!(lines[0].contains("10.1.2.3:8787"), "{lines:?}");
            }
            other => panic!("{other:?}"),
        }
        // With the keys kept, the reload goes through (the address waits for a restart).
        *next.lock() = format!("[server]\nlisten = \"127.0.0.1:8787\"\n{CLIENTS}");
        match reloader.reload() {
            ReloadOutcome::Applied {
                restart_required, ..
            } => assert_eq!(restart_required, ["server.listen"]),
            other => panic!("{other:?}"),
        }
    }

    /// A reload that keeps a provider's key file keeps its key cell and the one watcher of
    /// it: a hundred reloads while an old config's request was in flight ran a hundred
    /// watchers of the same file, four reads a second each.
    #[tokio::test]
    async fn reloads_that_keep_a_key_file_keep_one_watcher() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let key = dir.path().join("key");
        std::fs::write(&key, "sk-ant-one\n").unwrap_or_else(|e| panic!("{e}"));
        let toml = format!(
            "[providers.anthropic]\nkind = \"anthropic\"\nbase_url = \"http://127.0.0.1:9\"\napi_key_file = \"{}\"\n",
            key.display()
        );
        let started = config(&toml);
        let (proxy, watchers) = proxy_on(&started);
        assert_eq!(watchers.len(), 1);
        // The first config's upstream stays in use (a request in flight holds it).
        let held = proxy.snapshot.load_full();
        let source: ConfigSource = Arc::new(move || config_result(&toml));
        let reloader = Reloader::new(Some(source), proxy, &started, watchers);
        for _ in 0..100 {
            assert!(matches!(reloader.reload(), ReloadOutcome::Applied { .. }));
        }
        assert_eq!(reloader.watchers.lock().len(), 1);
        drop(held);
        reloader.stop_watchers();
    }

    /// A proxy on config `started`, as `serve` makes it, and its key watchers.
    fn proxy_on(started: &Config) -> (Arc<Proxy>, Vec<JoinHandle<()>>) {
        let registry = prometheus::Registry::new();
        let metrics =
            Arc::new(crate::telemetry::Metrics::new(&registry).unwrap_or_else(|e| panic!("{e}")));
        let lanes = Arc::new(crate::upstream::Lanes::new(metrics.clone()));
        let snapshot =
            Snapshot::new(Arc::new(started.clone()), &lanes).unwrap_or_else(|e| panic!("{e}"));
        let watchers = snapshot
            .upstreams
            .values()
            .filter_map(|u| u.spawn_key_watch())
            .collect();
        let ledger = Arc::new(crate::meter::Ledger::default());
        let ip = started.server.listen.ip();
        (
            Arc::new(Proxy::new(snapshot, lanes, metrics, ledger, ip)),
            watchers,
        )
    }

    fn config_result(toml: &str) -> Result<Config, crate::config::ConfigErrors> {
        crate::config::load_str(toml, &HashMap::new())
    }
}
