//! Which tenant each relayed response belongs to, apart from what the conversation store keeps
//! of it. With several tenants, who share the provider key, legate asks the provider about a
//! response only for the tenant whose request made it. The store's entry says so while it is
//! kept; this record says so beyond that: after the entry is evicted or expires (the provider
//! keeps a stored response for weeks), and for a relayed stream from its `response.created`
//! event on, before it completes (a background response polled, or cancelled, while it runs)
//! or when it fails (and is never kept).
//!
//! Bounded by count ([`MAX_OWNERS`], the oldest forgotten first: its id is then as unknown as
//! one never seen), in this process only: another replica knows the ids its own store holds.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

/// Ids remembered: an id of about 50 bytes, twice (map and order), and the map's slot, about
/// 200 bytes each, so at most a few MiB.
pub const MAX_OWNERS: usize = 16_384;

#[derive(Default)]
struct Inner {
    /// Ids come from providers (and, looked up, from callers): SipHash.
    map: HashMap<Arc<str>, Arc<str>>,
    order: VecDeque<Arc<str>>,
    /// The tenants' names, shared by their ids (at most [`NAMES`] of them; beyond, an id
    /// gets a copy of its own).
    names: Vec<Arc<str>>,
}

/// Tenant names shared: a config names a handful, and reloads may rename a few.
const NAMES: usize = 64;

pub struct Owners {
    max: usize,
    inner: Mutex<Inner>,
}

impl Default for Owners {
    fn default() -> Self {
        Owners::new(MAX_OWNERS)
    }
}

impl Owners {
    pub fn new(max: usize) -> Self {
        Owners {
            max,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// `id` was made for `tenant`'s request. The first word stands: a provider's ids are
    /// unique, and no later request may claim one.
    pub fn record(&self, id: &str, tenant: &str) {
        let mut inner = self.inner.lock();
        if inner.map.contains_key(id) || self.max == 0 {
            return;
        }
        while inner.order.len() >= self.max {
            if let Some(old) = inner.order.pop_front() {
                inner.map.remove(&old);
            }
        }
        let id: Arc<str> = Arc::from(id);
        let tenant = match inner.names.iter().find(|t| &***t == tenant) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = Arc::from(tenant);
                if inner.names.len() < NAMES {
                    inner.names.push(t.clone());
                }
                t
            }
        };
        inner.order.push_back(id.clone());
        inner.map.insert(id, tenant);
    }

    /// Whether `id` is known to be `tenant`'s.
    pub fn is(&self, id: &str, tenant: &str) -> bool {
        self.inner
            .lock()
            .map
            .get(id)
            .is_some_and(|t| &**t == tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_first_tenants_and_the_oldest_are_forgotten_past_the_bound() {
        let owners = Owners::new(3);
        owners.record("r1", "team-a");
        owners.record("r1", "team-b");
        assert!(owners.is("r1", "team-a"));
        assert!(!owners.is("r1", "team-b"));
        assert!(!owners.is("r9", "team-a"));
        owners.record("r2", "team-b");
        owners.record("r3", "team-a");
        owners.record("r4", "team-a");
        assert!(!owners.is("r1", "team-a"), "the oldest goes past the bound");
        assert!(owners.is("r2", "team-b") && owners.is("r4", "team-a"));
        assert_eq!(owners.inner.lock().map.len(), 3);
        assert_eq!(owners.inner.lock().order.len(), 3);
    }
}
