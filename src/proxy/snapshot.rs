//! What a request sees of the process's state at its start: one loaded config with the
//! upstreams built from it (swapped whole on reload), and the request ids.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Config;
use crate::route::Labels;
use crate::upstream::{Lanes, Upstream};

/// Everything that comes from one loaded config. Swapped whole, so a request sees one
/// consistent config from start to end.
pub struct Snapshot {
    pub cfg: Arc<Config>,
    pub upstreams: HashMap<String, Arc<Upstream>>,
    pub labels: Labels,
    pub hash: String,
}

impl Snapshot {
    pub fn new(cfg: Arc<Config>, lanes: &Lanes) -> Result<Self, String> {
        let mut upstreams = HashMap::new();
        for (name, p) in &cfg.providers {
            let up = Upstream::new(p, &cfg.shedding, lanes)
                .map_err(|e| format!("providers.{name}: {e}"))?;
            upstreams.insert(name.clone(), Arc::new(up));
        }
        let labels = Labels::from_config(&cfg);
        let hash = crate::config::render::config_hash(&cfg);
        Ok(Snapshot {
            cfg,
            upstreams,
            labels,
            hash,
        })
    }
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

    pub fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("lgt_{:012x}{:08x}", self.prefix, n)
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}
