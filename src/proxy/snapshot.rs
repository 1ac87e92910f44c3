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

    /// `lgt_`, the prefix in 12 hex digits, the counter in at least 8.
    pub fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut id = String::with_capacity(4 + 12 + 16);
        id.push_str("lgt_");
        push_hex(&mut id, self.prefix, 12);
        push_hex(&mut id, n, 8);
        id
    }
}

/// `v` in lowercase hex, zero-padded to `width` digits, like `{:0width$x}` without the
/// formatting machinery (a thousand instructions per request id).
fn push_hex(out: &mut String, v: u64, width: u32) {
    let digits = (64 - v.leading_zeros()).div_ceil(4).max(width);
    for i in (0..digits).rev() {
        let nibble = (v >> (i * 4)) & 0xf;
        out.push(char::from(b"0123456789abcdef"[nibble as usize]));
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_written_like_the_formatter_writes_it() {
        for (v, width) in [
            (0u64, 8),
            (1, 8),
            (0xabc, 12),
            (0xffff_ffff, 8),
            (0x1_0000_0000, 8),
            (u64::MAX, 8),
            (0xffff_ffff_ffff, 12),
        ] {
            let mut s = String::new();
            push_hex(&mut s, v, width);
            assert_eq!(s, format!("{v:0w$x}", w = width as usize));
        }
    }

    #[test]
    fn request_ids_keep_their_shape() {
        let ids = RequestIds::new();
        let a = ids.next_id();
        let b = ids.next_id();
        assert_eq!(a.len(), 24);
        assert!(a.starts_with("lgt_") && a.ends_with("00000001"), "{a}");
        assert_eq!(&a[..16], &b[..16]);
        assert!(b.ends_with("00000002"), "{b}");
    }
}
