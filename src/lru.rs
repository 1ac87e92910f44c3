//! A small least-recently-used map for state keyed by caller-chosen strings (SPEC §14): at
//! most `cap` entries, the least recently used one evicted to make room. Touching and
//! inserting are O(log n): the order is a tree of use ticks.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

pub struct Lru<K, V> {
    map: HashMap<K, (V, u64)>,
    order: BTreeMap<u64, K>,
    tick: u64,
    cap: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V> Lru<K, V> {
    pub fn new(cap: usize) -> Self {
        Lru {
            map: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            cap: cap.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The value of `key`, marked as just used, if present. Borrowed keys need no owned copy:
    /// the hit path allocates nothing.
    pub fn touch<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let (value, used) = self.map.get_mut(key)?;
        Self::mark(&mut self.order, &mut self.tick, used);
        Some(value)
    }

    /// The entry of `key`, marked as just used; created by `make` if absent, evicting the
    /// least recently used entry first when full (returned to the caller).
    pub fn entry(&mut self, key: &K, make: impl FnOnce() -> V) -> (&mut V, Option<(K, V)>) {
        let mut evicted = None;
        if self.map.len() >= self.cap
            && !self.map.contains_key(key)
            && let Some((_, oldest)) = self.order.pop_first()
        {
            evicted = self.map.remove(&oldest).map(|(v, _)| (oldest, v));
        }
        let value = match self.map.entry(key.clone()) {
            Entry::Occupied(o) => {
                let (value, used) = o.into_mut();
                Self::mark(&mut self.order, &mut self.tick, used);
                value
            }
            Entry::Vacant(v) => {
                self.tick += 1;
                self.order.insert(self.tick, key.clone());
                &mut v.insert((make(), self.tick)).0
            }
        };
        (value, evicted)
    }

    /// Moves an entry last used at `used` to the end of the order. An entry that is already
    /// the most recently used (the usual case: the same model asked for again and again)
    /// stays where it is, without the two tree operations.
    fn mark(order: &mut BTreeMap<u64, K>, tick: &mut u64, used: &mut u64) {
        if *used == *tick {
            return;
        }
        *tick += 1;
        let old = std::mem::replace(used, *tick);
        if let Some(k) = order.remove(&old) {
            order.insert(*tick, k);
        }
    }

    /// Keeps only the entries whose key `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.map.retain(|k, _| keep(k));
        let map = &self.map;
        self.order.retain(|_, k| map.contains_key(k));
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter().map(|(k, (v, _))| (k, v))
    }
}

/// A pair of strings looked up without owning them: `(String, String)` keys borrow as
/// `dyn StrPair`, so a hit on `Lru<(String, String), _>` needs no copy of either string.
pub trait StrPair {
    fn pair(&self) -> (&str, &str);
}

impl StrPair for (String, String) {
    fn pair(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl StrPair for (&str, &str) {
    fn pair(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> std::borrow::Borrow<dyn StrPair + 'a> for (String, String) {
    fn borrow(&self) -> &(dyn StrPair + 'a) {
        self
    }
}

// Hashes as `(String, String)` does (a tuple of `str`s), as `Borrow` requires.
impl std::hash::Hash for dyn StrPair + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.pair().hash(state);
    }
}

impl PartialEq for dyn StrPair + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.pair() == other.pair()
    }
}

impl Eq for dyn StrPair + '_ {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_of_strings_is_found_by_borrowed_halves() {
        let mut lru: Lru<(String, String), u32> = Lru::new(2);
        *lru.entry(&("t".into(), "p:m".into()), || 0).0 += 1;
        *lru.entry(&("t".into(), "p:n".into()), || 0).0 += 1;
        let hit = lru.touch(&("t", "p:m") as &dyn StrPair).map(|v| *v);
        assert_eq!(hit, Some(1));
        assert!(lru.touch(&("t", "p:x") as &dyn StrPair).is_none());
        // The touch made "p:n" the oldest: a third key evicts it.
        let (_, evicted) = lru.entry(&("u".into(), "p:m".into()), || 0);
        assert_eq!(evicted, Some((("t".into(), "p:n".into()), 1)));
    }

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut lru: Lru<String, u32> = Lru::new(2);
        *lru.entry(&"a".into(), || 0).0 += 1;
        *lru.entry(&"b".into(), || 0).0 += 1;
        // "a" is used again, so "b" is the oldest.
        *lru.entry(&"a".into(), || 0).0 += 1;
        let (_, evicted) = lru.entry(&"c".into(), || 7);
        assert_eq!(evicted, Some(("b".to_string(), 1)));
        assert_eq!(lru.len(), 2);
        let mut keys: Vec<_> = lru.iter().map(|(k, v)| (k.clone(), *v)).collect();
        keys.sort();
        assert_eq!(keys, vec![("a".into(), 2), ("c".into(), 7)]);
    }

    #[test]
    fn the_most_recent_entry_touched_again_keeps_the_order() {
        let mut lru: Lru<String, u32> = Lru::new(2);
        lru.entry(&"a".into(), || 1);
        lru.entry(&"b".into(), || 2);
        for _ in 0..3 {
            assert_eq!(lru.touch("b").copied(), Some(2));
        }
        *lru.entry(&"b".into(), || 0).0 += 1;
        let (_, evicted) = lru.entry(&"c".into(), || 3);
        assert_eq!(evicted, Some(("a".to_string(), 1)));
        // Now "b" is the oldest, even though it was touched many times before "c" came.
        assert_eq!(lru.touch("c").copied(), Some(3));
        let (_, evicted) = lru.entry(&"d".into(), || 4);
        assert_eq!(evicted, Some(("b".to_string(), 3)));
    }

    #[test]
    fn touching_an_entry_makes_it_the_most_recently_used() {
        let mut lru: Lru<String, u32> = Lru::new(2);
        lru.entry(&"a".into(), || 1);
        lru.entry(&"b".into(), || 2);
        assert_eq!(lru.touch("a").copied(), Some(1));
        assert_eq!(lru.touch("z"), None);
        let (_, evicted) = lru.entry(&"c".into(), || 3);
        assert_eq!(evicted, Some(("b".to_string(), 2)));
    }

    #[test]
    fn retained_entries_keep_their_order_and_the_rest_go() {
        let mut lru: Lru<String, u32> = Lru::new(3);
        for (k, v) in [("p:a", 1), ("q:b", 2), ("p:c", 3)] {
            lru.entry(&k.into(), || v);
        }
        lru.retain(|k| !k.starts_with("p:"));
        assert_eq!(lru.len(), 1);
        assert_eq!(lru.touch("p:a"), None);
        // The order holds only what is left: two new entries evict nothing until full.
        assert_eq!(lru.entry(&"r".into(), || 4).1, None);
        assert_eq!(lru.entry(&"s".into(), || 5).1, None);
        let (_, evicted) = lru.entry(&"t".into(), || 6);
        assert_eq!(evicted, Some(("q:b".to_string(), 2)));
    }
}
