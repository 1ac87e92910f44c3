//! Responses deleted while their own stream still ran. A relayed (or translated) response is
//! kept when its stream ends; a DELETE that the provider answered before then found nothing
//! to delete here, and the entry kept afterwards would have outlived the caller's delete: a
//! later turn on a translated step rebuilt from it, within `ttl`. The ids deleted are
//! remembered, and an entry under one of them is not kept.
//!
//! Bounded by count ([`MAX_TOMBSTONES`], the oldest forgotten first): an id matters only while
//! its stream runs, and ids are unique per response. Only ids a path can name are recorded.
//! In this process only: a replica does not see another's deletes (nor its streams).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// Ids remembered: at most [`super::owners::MAX_ID`] bytes each, about 300 KiB in all.
pub const MAX_TOMBSTONES: usize = 1024;

#[derive(Default)]
struct Inner {
    ids: HashSet<Arc<str>>,
    order: VecDeque<Arc<str>>,
}

#[derive(Default)]
pub struct Tombstones {
    /// Set by the first delete: until then a kept response costs one atomic load here.
    any: AtomicBool,
    inner: Mutex<Inner>,
}

impl Tombstones {
    /// `id` was deleted: an entry kept under it from now on is dropped.
    pub fn bury(&self, id: &str) {
        if !super::owners::recordable(id) {
            return;
        }
        let mut inner = self.inner.lock();
        let id: Arc<str> = Arc::from(id);
        if inner.ids.insert(id.clone()) {
            inner.order.push_back(id);
        }
        while inner.order.len() > MAX_TOMBSTONES {
            if let Some(old) = inner.order.pop_front() {
                inner.ids.remove(&old);
            }
        }
        self.any.store(true, Ordering::Release);
    }

    /// Whether `id` was deleted.
    pub fn buried(&self, id: &str) -> bool {
        self.any.load(Ordering::Acquire) && self.inner.lock().ids.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_remembered_within_the_bound_oldest_forgotten_first() {
        let t = Tombstones::default();
        assert!(!t.buried("resp_1"));
        t.bury("resp_1");
        t.bury("resp_1");
        assert!(t.buried("resp_1"));
        t.bury("not/a path id");
        assert!(!t.buried("not/a path id"));
        for i in 0..MAX_TOMBSTONES {
            t.bury(&format!("resp_x{i}"));
        }
        assert!(!t.buried("resp_1"), "the oldest went");
        assert!(t.buried("resp_x0"));
        assert_eq!(t.inner.lock().ids.len(), MAX_TOMBSTONES);
        assert_eq!(t.inner.lock().order.len(), MAX_TOMBSTONES);
    }
}
