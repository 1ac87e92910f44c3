//! What a request sees of the process's state at its start: one loaded config with the
//! upstreams built from it (swapped whole on reload), and the request ids.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Config;
use crate::observe::RequestId;
use crate::route::Labels;
use crate::upstream::{Lanes, Upstream};

/// Everything that comes from one loaded config. Swapped whole, so a request sees one
/// consistent config from start to end.
pub struct Snapshot {
    pub cfg: Arc<Config>,
    /// Keyed by configured provider names only: Fx-hashed, as nothing a caller sends is ever
    /// inserted.
    pub upstreams: HashMap<String, Arc<Upstream>>,
    pub labels: Labels,
    pub hash: String,
    /// Each `[[clients]]` tenant's part of the request-body budget, when there are several
    /// (keyed by configured names only).
    pub buffer_parts: HashMap<String, Arc<crate::proxy::buffers::TenantPart>>,
    /// The same for the answers held whole.
    pub answer_parts: HashMap<String, Arc<crate::proxy::buffers::TenantPart>>,
    /// The same for the local token estimates counted at once: half of them per tenant, so
    /// that one tenant's huge count requests leave the others a turn.
    pub estimate_parts: HashMap<String, Arc<tokio::sync::Semaphore>>,
}

impl Snapshot {
    pub fn new(cfg: Arc<Config>, lanes: &Lanes) -> Result<Self, String> {
        let mut upstreams = HashMap::default();
        for (name, p) in &cfg.providers {
            let up = Upstream::new(p, &cfg.shedding, lanes, cfg.server.worker_threads)
                .map_err(|e| format!("providers.{name}: {e}"))?;
            upstreams.insert(name.clone(), Arc::new(up));
        }
        // Every upstream was made: now the config may change what the running one shares.
        lanes.settle(
            cfg.providers.iter().map(|(name, p)| {
                let kept = upstreams
                    .get(name)
                    .and_then(|u| u.cloud.as_ref())
                    .map(crate::cloud::CloudProvider::kept);
                (name.as_str(), p.max_concurrency, kept)
            }),
            cfg.shedding.queue_limit,
        );
        let labels = Labels::from_config(&cfg);
        let hash = crate::config::render::config_hash(&cfg);
        let buffer_parts = tenant_parts(&cfg, cfg.server.max_body_bytes);
        let answer_parts = tenant_parts(&cfg, crate::proxy::upread::WHOLE_BODY_LIMIT);
        let estimate_parts = answer_parts
            .keys()
            .map(|t| {
                let half = crate::proxy::estimate::CONCURRENT / 2;
                (t.clone(), Arc::new(tokio::sync::Semaphore::new(half)))
            })
            .collect();
        Ok(Snapshot {
            cfg,
            upstreams,
            labels,
            hash,
            buffer_parts,
            answer_parts,
            estimate_parts,
        })
    }

    /// `[[clients]]` name several tenants, who share the provider keys: a stored response
    /// legate does not keep for the caller's tenant is not asked of the provider (it may be
    /// another tenant's), since the provider would answer for it to anyone holding the key.
    pub fn several_tenants(&self) -> bool {
        !self.buffer_parts.is_empty()
    }

    /// Keeps the parts of `old`'s tenants that are still configured, with this config's bound:
    /// fresh parts at zero would let a tenant hold its half again beside what its requests in
    /// flight hold of the old one.
    pub fn keep_parts_of(&mut self, old: &Snapshot) {
        for (mine, theirs) in [
            (&mut self.buffer_parts, &old.buffer_parts),
            (&mut self.answer_parts, &old.answer_parts),
        ] {
            for (tenant, part) in mine.iter_mut() {
                if let Some(kept) = theirs.get(tenant) {
                    kept.set_max(part.max_now());
                    *part = kept.clone();
                }
            }
        }
        // Always the same size: the old gate, with the counts running in it, is kept.
        for (tenant, gate) in self.estimate_parts.iter_mut() {
            if let Some(kept) = old.estimate_parts.get(tenant) {
                *gate = kept.clone();
            }
        }
    }

    /// `tenant`'s part of the local token estimates (None: it may take them all).
    pub fn estimate_part(&self, tenant: &str) -> Option<Arc<tokio::sync::Semaphore>> {
        if self.estimate_parts.is_empty() {
            return None;
        }
        self.estimate_parts.get(tenant).cloned()
    }

    /// `tenant`'s part of the answers' budget (None: it has the whole).
    pub fn answer_part(&self, tenant: &str) -> Option<Arc<crate::proxy::buffers::TenantPart>> {
        if self.answer_parts.is_empty() {
            return None;
        }
        self.answer_parts.get(tenant).cloned()
    }

    /// `tenant`'s part of the request-body budget (None: it has the whole).
    pub fn buffer_part(&self, tenant: &str) -> Option<Arc<crate::proxy::buffers::TenantPart>> {
        if self.buffer_parts.is_empty() {
            return None;
        }
        self.buffer_parts.get(tenant).cloned()
    }
}

/// Half of `max_buffered_bytes` per tenant (at least `one`: one whole body, or answer) when
/// `[[clients]]` name more than one tenant; none with one tenant, who has nobody to crowd out.
fn tenant_parts(
    cfg: &Config,
    one: usize,
) -> HashMap<String, Arc<crate::proxy::buffers::TenantPart>> {
    let mut parts = HashMap::default();
    let tenants: std::collections::BTreeSet<&str> =
        cfg.clients.iter().map(|c| c.tenant.as_str()).collect();
    if tenants.len() < 2 {
        return parts;
    }
    let limits = &cfg.server.limits;
    let max = (limits.max_buffered_bytes / 2)
        .max(one)
        .min(limits.max_buffered_bytes);
    for t in tenants {
        parts.insert(t.to_owned(), crate::proxy::buffers::TenantPart::new(max));
    }
    parts
}

/// Request ids: a random per-process prefix and a counter, unique without a syscall per request.
pub struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl RequestIds {
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        RequestIds {
            prefix: h.finish() & 0xffff_ffff_ffff,
            next: AtomicU64::new(1),
        }
    }

    /// How many ids have been handed out: one per request the data plane has seen, so a value
    /// that has not moved means no request arrived in between.
    pub fn issued(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    pub fn next_id(&self) -> RequestId {
        RequestId::new(self.prefix, self.next.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::RequestIds;

    /// The text of an id is `RequestId`'s (tested there); here, that ids count on from the
    /// counter under the process's prefix, wrapping at the end.
    #[test]
    fn request_ids_count_on_under_one_prefix() {
        for (prefix, n) in [(0, 0), (0x1234_5678_9abc, 0xffff_ffff), (0xabc, u64::MAX)] {
            let ids = RequestIds {
                prefix,
                next: AtomicU64::new(n),
            };
            assert!(ids.next_id().is(&format!("lgt_{prefix:012x}{n:08x}")));
            assert_eq!(ids.next.load(Ordering::Relaxed), n.wrapping_add(1));
            assert_eq!(ids.issued(), n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod parts_tests {
    use std::collections::HashMap as StdMap;
    use std::sync::Arc;

    use super::Snapshot;
    use crate::proxy::buffers::{BufferBudget, BufferShare};

    fn snapshot(toml: &str) -> Snapshot {
        let env: StdMap<String, String> = StdMap::new();
        let cfg = crate::config::load_str(toml, &env).unwrap_or_else(|e| panic!("{e:?}"));
        let registry = prometheus::Registry::new();
        let metrics = crate::telemetry::Metrics::new(&registry).unwrap_or_else(|e| panic!("{e}"));
        let lanes = crate::upstream::Lanes::new(Arc::new(metrics));
        Snapshot::new(Arc::new(cfg), &lanes).unwrap_or_else(|e| panic!("{e}"))
    }

    const TWO: &str = "[server]\nmax_buffered_bytes = 1000\nmax_body_bytes = 100\n[[clients]]\ntenant = \"a\"\nkey_sha256 = \"f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4\"\n[[clients]]\ntenant = \"b\"\nkey_sha256 = \"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\"\n";

    #[test]
    fn a_reload_keeps_what_requests_in_flight_hold_of_a_tenants_part() {
        let old = snapshot(TWO);
        let budget = Arc::new(BufferBudget::default());
        let mut held = BufferShare::new(budget.clone()).within(old.buffer_part("a"));
        assert!(held.take(500, 1000));
        let mut new =
            snapshot(&TWO.replace("max_buffered_bytes = 1000", "max_buffered_bytes = 800"));
        new.keep_parts_of(&old);
        // The half of the new bound (400) is held already by the request from before.
        let mut more = BufferShare::new(budget.clone()).within(new.buffer_part("a"));
        assert!(!more.take(1, 1000));
        let mut other = BufferShare::new(budget).within(new.buffer_part("b"));
        assert!(other.take(400, 1000));
        drop(held);
        assert!(more.take(400, 1000));
        // One tenant, or none: no parts.
        assert!(snapshot("").buffer_part("default").is_none());
    }

    #[test]
    fn each_of_several_tenants_has_half_of_the_estimates_kept_over_a_reload() {
        let half = crate::proxy::estimate::CONCURRENT / 2;
        let old = snapshot(TWO);
        let gate = old.estimate_part("a").unwrap_or_else(|| panic!("no part"));
        assert_eq!(gate.available_permits(), half);
        let running = gate.clone().try_acquire_owned();
        assert!(running.is_ok());
        let mut new = snapshot(TWO);
        new.keep_parts_of(&old);
        // The count running since before the reload still holds its turn.
        let kept = new.estimate_part("a").unwrap_or_else(|| panic!("no part"));
        assert_eq!(kept.available_permits(), half - 1);
        let other = new.estimate_part("b").map(|g| g.available_permits());
        assert_eq!(other, Some(half));
        assert!(snapshot("").estimate_part("default").is_none());
        assert!(new.estimate_part("nobody").is_none());
    }
}

#[cfg(test)]
mod lanes_tests {
    use std::collections::HashMap as StdMap;
    use std::sync::Arc;

    use futures_util::FutureExt;

    use super::Snapshot;
    use crate::config::Priority;

    /// A config that cannot be made into upstreams (here: a CA file gone between its check
    /// and its use) changes nothing the running one shares: a provider's `max_concurrency`
    /// stays as it was, where the refused config had resized its gate already.
    #[tokio::test]
    async fn a_refused_config_leaves_the_gates_as_they_were() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ca = dir.path().join("ca.pem");
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&ca, made.cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        let env: StdMap<String, String> = StdMap::new();
        let load = |toml: &str| {
            Arc::new(crate::config::load_str(toml, &env).unwrap_or_else(|e| panic!("{e:?}")))
        };
        let registry = prometheus::Registry::new();
        let metrics = crate::telemetry::Metrics::new(&registry).unwrap_or_else(|e| panic!("{e}"));
        let lanes = crate::upstream::Lanes::new(Arc::new(metrics));
        let one = "[providers.anthropic]\nkind = \"anthropic\"\nbase_url = \"http://127.0.0.1:9\"\nmax_concurrency = 1\n";
        let running = Snapshot::new(load(one), &lanes).unwrap_or_else(|e| panic!("{e}"));
        let refused = load(&format!(
            "{}\n[providers.openai]\nkind = \"openai\"\nbase_url = \"https://127.0.0.1:9\"\nca_file = \"{}\"\n",
            one.replace("max_concurrency = 1", "max_concurrency = 4"),
            ca.display()
        ));
        std::fs::remove_file(&ca).unwrap_or_else(|e| panic!("{e}"));
        assert!(Snapshot::new(refused, &lanes).is_err());
        let gate = running.upstreams["anthropic"].gate.clone();
        let _first = gate.acquire(Priority::Interactive).await;
        assert!(
            gate.acquire(Priority::Interactive).now_or_never().is_none(),
            "a second request got a slot: the refused config's max_concurrency applies"
        );
    }
}
