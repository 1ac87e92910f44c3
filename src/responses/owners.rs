//! Which tenant each relayed response belongs to, apart from what the conversation store keeps
//! of it. With several tenants, who share the provider key, legate asks the provider about a
//! response only for the tenant whose request made it. The store's entry says so while it is
//! kept; this record says so beyond that: after the entry is evicted or expires (the provider
//! keeps a stored response for weeks), and for a relayed stream from its `response.created`
//! event on, before it completes (a background response polled, or cancelled, while it runs)
//! or when it fails (and is never kept).
//!
//! Bounded by count ([`MAX_OWNERS`]): past it, the oldest id of the tenant with the most is
//! forgotten (then as unknown as one never seen), so that one busy tenant cannot push the
//! others' ids out. Only ids a path can name are recorded (at most [`MAX_ID`] bytes of
//! `[A-Za-z0-9_-]`). An id that comes back for another tenant (a provider that reissues ids,
//! or lets callers choose them) is nobody's from then on. In this process only: another
//! replica knows the ids its own store holds.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

/// Ids remembered: an id of at most [`MAX_ID`] bytes, its map slot and its place in its
/// tenant's order, at most about 250 bytes each, so at most about 4 MiB.
pub const MAX_OWNERS: usize = 16_384;

/// The longest id recorded: OpenAI's are `resp_` and 48 hex digits or so; a longer one is
/// not recorded (asked only while the store keeps it).
pub const MAX_ID: usize = 128;

/// Tenants with ids recorded: a config names a handful; beyond this, a new tenant's ids are
/// not recorded.
const MAX_TENANTS: usize = 1024;

struct Claim {
    tenant: Arc<str>,
    /// Claimed for another tenant too: nobody's.
    contested: bool,
}

/// One tenant's ids, oldest first.
struct Queue {
    tenant: Arc<str>,
    ids: VecDeque<Arc<str>>,
}

#[derive(Default)]
struct Inner {
    /// Ids come from providers (and, looked up, from callers): SipHash. Each id is in the
    /// queue of the tenant that claimed it first.
    map: HashMap<Arc<str>, Claim>,
    queues: Vec<Queue>,
}

pub struct Owners {
    max: usize,
    inner: Mutex<Inner>,
}

impl Default for Owners {
    fn default() -> Self {
        Owners::new(MAX_OWNERS)
    }
}

/// An id a path can name, short enough to keep.
pub(crate) fn recordable(id: &str) -> bool {
    (1..=MAX_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Owners {
    pub fn new(max: usize) -> Self {
        Owners {
            max,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// `id` was made for `tenant`'s request.
    pub fn record(&self, id: &str, tenant: &str) {
        if !recordable(id) || self.max == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(claim) = inner.map.get_mut(id) {
            claim.contested |= &*claim.tenant != tenant;
            return;
        }
        if inner.map.len() >= self.max {
            inner.forget_one();
        }
        let at = match inner.queues.iter().position(|q| &*q.tenant == tenant) {
            Some(at) => at,
            None if inner.queues.len() < MAX_TENANTS => {
                inner.queues.push(Queue {
                    tenant: Arc::from(tenant),
                    ids: VecDeque::new(),
                });
                inner.queues.len() - 1
            }
            None => return,
        };
        let id: Arc<str> = Arc::from(id);
        let queue = &mut inner.queues[at];
        queue.ids.push_back(id.clone());
        let claim = Claim {
            tenant: queue.tenant.clone(),
            contested: false,
        };
        inner.map.insert(id, claim);
    }

    /// Whether `id` is known to be `tenant`'s (and nobody else's).
    pub fn is(&self, id: &str, tenant: &str) -> bool {
        self.inner
            .lock()
            .map
            .get(id)
            .is_some_and(|c| !c.contested && &*c.tenant == tenant)
    }
}

impl Inner {
    /// Forgets the oldest id of the tenant with the most.
    fn forget_one(&mut self) {
        let Some(at) = (0..self.queues.len()).max_by_key(|&i| self.queues[i].ids.len()) else {
            return;
        };
        if let Some(old) = self.queues[at].ids.pop_front() {
            self.map.remove(&old);
        }
        if self.queues[at].ids.is_empty() {
            self.queues.swap_remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_the_tenant_with_the_most_forgets_its_oldest() {
        let owners = Owners::new(4);
        owners.record("r1", "team-a");
        assert!(owners.is("r1", "team-a"));
        assert!(!owners.is("r1", "team-b"));
        assert!(!owners.is("r9", "team-a"));
        // team-b records many: its own oldest go, never team-a's one.
        for i in 2..10 {
            owners.record(&format!("r{i}"), "team-b");
        }
        assert!(owners.is("r1", "team-a"));
        assert!(!owners.is("r6", "team-b"), "team-b's oldest went");
        assert!(owners.is("r7", "team-b") && owners.is("r9", "team-b"));
        let inner = owners.inner.lock();
        assert_eq!(inner.map.len(), 4);
        let queued: usize = inner.queues.iter().map(|q| q.ids.len()).sum();
        assert_eq!(queued, 4);
    }

    #[test]
    fn an_id_claimed_for_two_tenants_is_nobodys() {
        let owners = Owners::new(10);
        owners.record("r1", "team-a");
        owners.record("r1", "team-a");
        assert!(owners.is("r1", "team-a"));
        owners.record("r1", "team-b");
        assert!(!owners.is("r1", "team-a"));
        assert!(!owners.is("r1", "team-b"));
    }

    #[test]
    fn only_ids_a_path_can_name_are_recorded() {
        let owners = Owners::new(10);
        let long = "r".repeat(MAX_ID + 1);
        for id in ["", "resp/../x", "r 1", "ré", long.as_str()] {
            owners.record(id, "team-a");
            assert!(!owners.is(id, "team-a"), "{id}");
        }
        assert!(owners.inner.lock().map.is_empty());
        let longest = "r".repeat(MAX_ID);
        owners.record(&longest, "team-a");
        assert!(owners.is(&longest, "team-a"));
    }
}
