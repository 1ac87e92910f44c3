//! The conversation store in this process (`[responses] store = "memory"`, and the Redis
//! store's own copies of entries Redis did not take): bounded by `max_bytes` and `ttl`.
//!
//! Entries are held serialised, so the bytes counted are the bytes held (a tree of JSON values
//! takes several times its text; each entry's bookkeeping is counted too). Expired entries go
//! first; beyond the bound, the oldest entry of the owner (tenant) holding the most bytes goes
//! next. With one tenant that is the oldest entry; with several, one tenant keeping many
//! responses evicts its own, not another tenant's conversation in the middle of its turns
//! (whose next turn would get 400 "unknown": with several tenants an id legate no longer keeps
//! is not asked of the provider either). Each tenant keeps about its fair share of the bound
//! (whole entries are evicted, so one just over it may drop below it by a large entry), and
//! what others leave unused; an entry that would fit only by taking another owner below that
//! is not kept.
//!
//! A turn that continues an earlier one (`previous_response_id`) is kept with the whole
//! conversation, so the earlier turn's entry holds nothing the later one lacks: a chain of n
//! turns holds about n²/2 turns' bytes. Continued entries give way first (the oldest first), so
//! that one long conversation spends its own superseded turns before the last turn of any other
//! conversation; the earlier turns stay readable, and continuable again, until room is needed.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use tokio::time::Instant;

use super::store::Stored;

/// What one entry takes besides its id and serialised bytes: its map slot (104 bytes, and the
/// table keeps up to twice as many slots as entries), its place in its owner's insertion order
/// (a second handle on the id, in a queue that may hold twice as many), the id's shared
/// allocation and the allocations' headers. Counted, so that `max_bytes` bounds the memory the
/// store takes and not only its payload: a short response is a few hundred bytes of JSON, and
/// its bookkeeping a third to a half of it. 300: measured, heap and mapped tables together, a
/// full store took 1.02-1.19 times what it counted at 200 (entries of 4,000 to 300 bytes),
/// about 100 bytes per entry more.
const ENTRY_OVERHEAD: usize = 300;

/// The bytes an entry counts against `max_bytes`.
pub(super) fn held(id: &str, data: usize) -> usize {
    id.len() + data + ENTRY_OVERHEAD
}

/// The owner a serialised entry names. Entries are written with `owner` as their last member
/// (`Stored::serialise`, and serde in `Stored`'s field order), and tenant names need no
/// escapes, so it is read from the tail without parsing the entry; "" when it is not there.
pub(super) fn owner_of(data: &[u8]) -> &str {
    const KEY: &[u8] = b"\"owner\":\"";
    let Some(body) = data.strip_suffix(b"\"}") else {
        return "";
    };
    let Some(start) = memchr::memrchr(b'"', body) else {
        return "";
    };
    if !body[..=start].ends_with(KEY) {
        return "";
    }
    std::str::from_utf8(&body[start + 1..]).unwrap_or("")
}

struct Entry {
    /// The `Stored` as JSON; shared so a lookup parses it outside the lock (and taken over
    /// from the serialising `Vec` without a copy).
    data: Bytes,
    bytes: usize,
    /// When it was kept: it expires `ttl` after, by the ttl in force (a reload that
    /// shortens it shortens the life of what is kept already).
    kept: Instant,
    generation: u64,
    owner: Arc<str>,
    /// A later turn continued it: its place is in its owner's `continued` list (once).
    continued: bool,
}

/// One owner's entries: their insertion order (with each insertion's generation: older
/// generations of a replaced or deleted id are skipped when met) and what they hold.
#[derive(Default)]
struct Owner {
    order: VecDeque<(Arc<str>, u64)>,
    /// Entries a later turn continued, in the order they were continued: evicted first.
    continued: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
    live: usize,
}

#[derive(Default)]
struct Inner {
    /// The id is shared with its place in its owner's order: one copy made per put.
    map: HashMap<Arc<str>, Entry>,
    /// Owners with entries kept: tenants of the config (and "" for entries without one), so
    /// a handful; one whose last entry goes is removed.
    owners: HashMap<Arc<str>, Owner>,
    bytes: usize,
    next_generation: u64,
    /// The bounds in force (`[responses]`, changed by a reload).
    max_bytes: usize,
    ttl: Duration,
}

impl Inner {
    fn expired(&self, e: &Entry, now: Instant) -> bool {
        e.kept + self.ttl <= now
    }

    /// Sweeps the expired entries, then evicts until `bytes` more fit within `max_bytes`: the
    /// oldest of the owner holding the most (`bytes` counted with `owner`'s). False, with
    /// nothing evicted for it, when they fit only by taking the others below what a fair
    /// share leaves them: the entry is `owner`'s to go without.
    fn make_room(&mut self, bytes: usize, owner: Option<&Arc<str>>, now: Instant) -> bool {
        // Entries share one TTL, so each owner's insertion order is its expiry order: its
        // expired entries are at its front.
        let ttl = self.ttl;
        while let Some(name) = self.stale_or_expired_front(now) {
            self.trim_front(&name, |e| e.kept + ttl <= now);
        }
        if let Some(owner) = owner {
            // Heaviest-first eviction brings every owner down to a common level; once that
            // level is below the entry itself, the owner holds the entry alone and is still
            // the heaviest. Each other owner keeps up to the entry's size, then.
            let others: usize = self
                .owners
                .iter()
                .filter(|(n, _)| *n != owner)
                .map(|(_, o)| o.bytes.min(bytes))
                .sum();
            if bytes + others > self.max_bytes {
                return false;
            }
        }
        while self.bytes + bytes > self.max_bytes {
            // On a tie another owner gives way before `owner`: its new entry is what asks.
            let weight = |n: &Arc<str>, o: &Owner| match Some(n) == owner {
                true => (o.bytes + bytes, false),
                false => (o.bytes, true),
            };
            let heaviest = self
                .owners
                .iter()
                .max_by_key(|(n, o)| weight(n, o))
                .map(|(n, o)| (n.clone(), weight(n, o).0));
            let newcomer = owner.filter(|n| !self.owners.contains_key(*n));
            let heaviest = match (heaviest, newcomer) {
                (Some((_, most)), Some(n)) if bytes > most => Some(n.clone()),
                (Some((n, _)), _) => Some(n),
                (None, n) => n.cloned(),
            };
            let Some(n) = heaviest else {
                // Nothing left to evict: the entry fits within the bound alone.
                break;
            };
            if self.trim_continued(&n) || self.trim_front(&n, |_| true) {
                continue;
            }
            if Some(&n) == owner {
                // The asking owner has nothing of its own left to give.
                return false;
            }
            if !self.trim_any() {
                break;
            }
        }
        true
    }

    /// Takes `id`'s entry out, with its bytes.
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.map.remove(id)?;
        self.bytes -= entry.bytes;
        if let Some(owner) = self.owners.get_mut(&entry.owner) {
            owner.bytes -= entry.bytes;
            owner.live -= 1;
            if owner.live == 0 {
                self.owners.remove(&entry.owner);
            }
        }
        Some(entry)
    }

    /// An owner whose oldest place is stale (its entry gone or replaced) or expired.
    fn stale_or_expired_front(&self, now: Instant) -> Option<Arc<str>> {
        let live = |(id, g): &(Arc<str>, u64)| {
            self.map
                .get(id)
                .is_some_and(|e| e.generation == *g && !self.expired(e, now))
        };
        self.owners
            .iter()
            .find(|(_, o)| o.order.front().is_some_and(|p| !live(p)))
            .map(|(name, _)| name.clone())
    }

    /// Evicts the oldest entry of any owner that has one: a fallback that a consistent store
    /// never needs (every kept entry has its place in its owner's order), so that the bound
    /// holds even if one did.
    fn trim_any(&mut self) -> bool {
        let names: Vec<Arc<str>> = self.owners.keys().cloned().collect();
        names.iter().any(|n| self.trim_front(n, |_| true))
    }

    /// Evicts the entry `owner`'s later turns continued first, if one is still kept (the
    /// places of entries gone or replaced since are dropped on the way). True when one was.
    fn trim_continued(&mut self, owner: &Arc<str>) -> bool {
        loop {
            let Some(o) = self.owners.get_mut(owner) else {
                return false;
            };
            let Some((id, generation)) = o.continued.pop_front() else {
                return false;
            };
            if self
                .map
                .get(&id)
                .is_some_and(|e| e.generation == generation)
            {
                self.remove(&id);
                return true;
            }
        }
    }

    /// Drops the places at the front of `owner`'s order whose entry is gone, and then its
    /// oldest entry too when `evict` says so of it (expired, or the store is full). True when
    /// an entry was evicted.
    fn trim_front(&mut self, owner: &Arc<str>, evict: impl Fn(&Entry) -> bool) -> bool {
        loop {
            let Some(o) = self.owners.get_mut(owner) else {
                return false;
            };
            let Some((id, generation)) = o.order.front().cloned() else {
                return false;
            };
            match self.map.get(&id) {
                Some(e) if e.generation == generation => {
                    if !evict(e) {
                        return false;
                    }
                    o.order.pop_front();
                    self.remove(&id);
                    return true;
                }
                _ => {
                    o.order.pop_front();
                }
            }
        }
    }
}

/// The in-process store.
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl MemoryStore {
    pub fn new(max_bytes: usize, ttl: Duration) -> Self {
        MemoryStore {
            inner: Mutex::new(Inner {
                max_bytes,
                ttl,
                ..Inner::default()
            }),
        }
    }

    /// Applies reloaded bounds at once: entries past the new ttl are gone, and the oldest
    /// give way until the rest fit the new `max_bytes`.
    pub fn resize(&self, max_bytes: usize, ttl: Duration) {
        let mut inner = self.lock();
        inner.max_bytes = max_bytes;
        inner.ttl = ttl;
        inner.make_room(0, None, Instant::now());
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        let data = {
            let inner = self.lock();
            let entry = inner.map.get(id)?;
            if inner.expired(entry, Instant::now()) {
                return None;
            }
            entry.data.clone()
        };
        // Written by `put` from a `Stored`, so it parses back.
        serde_json::from_slice(&data).ok()
    }

    pub fn put(&self, id: &str, stored: &Stored) {
        if let Ok(data) = serde_json::to_vec(stored) {
            self.put_serialised(id, data);
        }
    }

    /// Keeps a serialised `Stored`. The serialised size is what the bound is about (as it
    /// would be in Redis).
    pub fn put_serialised(&self, id: &str, data: Vec<u8>) {
        self.keep(id, data, None);
    }

    /// Keeps a serialised `Stored` of a turn that continued `continues` (its
    /// `previous_response_id`, whose entry the turn's own holds whole): that entry is
    /// evicted before any turn not continued.
    pub fn keep(&self, id: &str, mut data: Vec<u8>, continues: Option<&str>) {
        // A Vec written by appending holds up to twice its length; the entry is counted at its
        // length, so it must not keep the rest (glibc shrinks an allocation in place).
        data.shrink_to_fit();
        let data = Bytes::from(data);
        let bytes = held(id, data.len());
        let mut inner = self.lock();
        inner.remove(id);
        if bytes > inner.max_bytes {
            return;
        }
        let now = Instant::now();
        let name = owner_of(&data);
        let owner: Arc<str> = match inner.owners.get_key_value(name) {
            Some((kept, _)) => kept.clone(),
            None => Arc::from(name),
        };
        if !inner.make_room(bytes, Some(&owner), now) {
            return;
        }
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let id: Arc<str> = Arc::from(id);
        inner.bytes += bytes;
        let o = inner.owners.entry(owner.clone()).or_default();
        o.order.push_back((id.clone(), generation));
        o.bytes += bytes;
        o.live += 1;
        let compact = o.order.len() > 2 * o.live + 64;
        let entry = Entry {
            data,
            bytes,
            kept: now,
            generation,
            owner: owner.clone(),
            continued: false,
        };
        // In the map before any compaction below, which keeps only the places of entries
        // in it: the new entry's place must be one of them.
        inner.map.insert(id.clone(), entry);
        let Inner { map, owners, .. } = &mut *inner;
        let Some(o) = owners.get_mut(&owner) else {
            return;
        };
        // The continued entry is the same owner's (a tenant continues only its own).
        // Listed once, however often it is continued (a turn retried, a conversation
        // forked): the list holds at most one place per entry kept.
        let earlier = continues
            .filter(|c| **c != *id)
            .and_then(|c| map.get_key_value(c))
            .filter(|(_, e)| e.owner == owner && !e.continued)
            .map(|(earlier, e)| (earlier.clone(), e.generation));
        if let Some((earlier, generation)) = earlier {
            if let Some(e) = map.get_mut(&earlier) {
                e.continued = true;
            }
            o.continued.push_back((earlier, generation));
        }
        let live = |(id, g): &(Arc<str>, u64)| map.get(id).is_some_and(|e| e.generation == *g);
        if compact {
            // Deleted and replaced ids behind a live front: drop their stale places.
            o.order.retain(live);
        }
        if o.continued.len() > 2 * o.live + 64 {
            // Entries continued again, or gone another way: their places are stale.
            o.continued.retain(live);
        }
    }

    pub fn delete(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.remove(id).is_some_and(|e| !inner.expired(&e, now))
    }

    /// Bytes held (for tests and the bound).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str, owner: &str) -> Stored {
        Stored {
            input: vec![json!({"role": "user", "content": text})],
            response: json!({"id": "r", "output": [{"type": "message"}]}),
            passthrough: false,
            provider: String::new(),
            owner: owner.to_owned(),
        }
    }

    /// What an entry of ten bytes of input counts, under `id` for `owner`.
    fn ten_bytes(id: &str, owner: &str) -> usize {
        held(
            id,
            serde_json::to_vec(&stored("0123456789", owner)).map_or(0, |v| v.len()),
        )
    }

    /// A reload's shorter ttl ends what was kept before it too; a smaller bound evicts at once.
    #[tokio::test(start_paused = true)]
    async fn a_resize_applies_to_what_is_kept_already() {
        let store = MemoryStore::new(1 << 20, Duration::from_secs(3600));
        store.put("a", &stored("hi", "team-a"));
        tokio::time::advance(Duration::from_secs(10)).await;
        store.put("b", &stored("hi", "team-a"));
        store.resize(1 << 20, Duration::from_secs(5));
        assert_eq!(store.get("a"), None);
        assert_eq!(store.get("b"), Some(stored("hi", "team-a")));
        assert_eq!(store.lock().map.len(), 1, "the expired one swept");
        store.resize(10, Duration::from_secs(5));
        assert_eq!((store.get("b"), store.bytes()), (None, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_the_ttl() {
        let store = MemoryStore::new(1 << 20, Duration::from_secs(60));
        store.put("a", &stored("hi", "team-a"));
        assert_eq!(store.get("a"), Some(stored("hi", "team-a")));
        assert_eq!(store.get("a").map(|s| s.output().len()), Some(1));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(store.get("a"), None);
        // The next put sweeps it, whoever's it was.
        store.put("b", &stored("x", "team-b"));
        assert_eq!(store.lock().map.len(), 1);
        assert_eq!(store.lock().owners.len(), 1);
    }

    #[tokio::test]
    async fn oldest_entries_are_evicted_beyond_max_bytes() {
        let one = ten_bytes("a", "t");
        let store = MemoryStore::new(one * 2, Duration::from_secs(60));
        store.put("a", &stored("0123456789", "t"));
        store.put("b", &stored("0123456789", "t"));
        assert!(store.get("a").is_some());
        store.put("c", &stored("0123456789", "t"));
        assert_eq!(store.get("a"), None);
        assert!(store.get("b").is_some() && store.get("c").is_some());
        assert!(store.bytes() <= one * 2);
        // Too large for the whole store: not kept, nothing else evicted.
        store.put("d", &stored(&"x".repeat(one * 3), "t"));
        assert_eq!(store.get("d"), None);
        assert!(store.get("b").is_some());
    }

    /// One long conversation spends its own continued turns before the last turn of another.
    #[tokio::test]
    async fn continued_turns_give_way_first() {
        let one = ten_bytes("other", "t");
        let store = MemoryStore::new(one * 4, Duration::from_secs(60));
        let data = || serde_json::to_vec(&stored("0123456789", "t")).unwrap_or_default();
        store.keep("other", data(), None);
        store.keep("c00", data(), None);
        for i in 1..20 {
            store.keep(&format!("c{i:02}"), data(), Some(&format!("c{:02}", i - 1)));
        }
        assert!(
            store.get("other").is_some(),
            "another conversation's last turn stays"
        );
        assert!(store.get("c19").is_some() && store.get("c17").is_some());
        assert_eq!(store.get("c16"), None, "the oldest continued turns went");
        assert!(store.bytes() <= one * 4);
        // The continued ones left go next, oldest first; then the oldest of all.
        store.keep("x", data(), None);
        assert_eq!((store.get("c17"), store.get("c18").is_some()), (None, true));
        store.keep("y", data(), None);
        assert_eq!(store.get("c18"), None);
        store.keep("z", data(), None);
        assert_eq!(store.get("other"), None);
        assert!(
            store.get("c19").is_some(),
            "the conversation's last turn stays"
        );
        // A turn continued again, replaced or gone leaves no place that evicts a live one,
        // and the places do not pile up.
        for _ in 0..200 {
            store.keep("z", data(), Some("y"));
            store.keep("y", data(), Some("z"));
        }
        assert!(store.get("y").is_some() && store.get("z").is_some());
        // One response continued many times, each successor deleted: listed once.
        for i in 0..200 {
            let next = format!("n{i}");
            store.keep(&next, data(), Some("y"));
            store.delete(&next);
        }
        let listed = |inner: &Inner| {
            let places = inner.owners.values().flat_map(|o| &o.continued);
            places.filter(|(id, _)| &**id == "y").count()
        };
        assert_eq!(listed(&store.lock()), 1);
        let inner = store.lock();
        assert!(
            inner
                .owners
                .values()
                .all(|o| o.continued.len() <= 2 * o.live + 64)
        );
    }

    #[tokio::test]
    async fn a_tenant_keeping_many_responses_evicts_its_own_first() {
        let one = ten_bytes("b00", "team-b");
        let store = MemoryStore::new(one * 10, Duration::from_secs(60));
        // Tenant b keeps two, tenant a fills the store many times over.
        for i in 0..2 {
            store.put(&format!("b{i:02}"), &stored("0123456789", "team-b"));
        }
        for i in 0..50 {
            store.put(&format!("a{i:02}"), &stored("0123456789", "team-a"));
        }
        assert!(store.get("b00").is_some() && store.get("b01").is_some());
        assert!(store.get("a49").is_some() && store.get("a42").is_some());
        assert_eq!(store.get("a41"), None);
        assert!(store.bytes() <= one * 10);
        // Tenant b may grow to what is fair: past half, the heavier one gives way.
        for i in 2..8 {
            store.put(&format!("b{i:02}"), &stored("0123456789", "team-b"));
        }
        let kept = |p: &str| {
            (0..50)
                .filter(|i| store.get(&format!("{p}{i:02}")).is_some())
                .count()
        };
        assert_eq!((kept("a"), kept("b")), (5, 5));
        assert_eq!(store.get("b02"), None, "b's oldest, once b holds the most");
        assert!(store.get("b00").is_none() && store.get("b03").is_some());
    }

    /// One tenant's single large entry never takes another below what a fair share leaves
    /// it: the entry is not kept, whether its tenant is new or holds entries already.
    #[tokio::test]
    async fn a_large_entry_does_not_take_another_tenant_below_its_share() {
        let one = ten_bytes("b00", "team-b");
        let store = MemoryStore::new(one * 10, Duration::from_secs(60));
        for i in 0..7 {
            store.put(&format!("b{i:02}"), &stored("0123456789", "team-b"));
        }
        let b_kept = |store: &MemoryStore| {
            (0..7)
                .filter(|i| store.get(&format!("b{i:02}")).is_some())
                .count()
        };
        // About six entries' bytes: b would be left four of its seven, below half.
        let large = stored(&"x".repeat(one * 6 - one + 10), "team-a");
        store.put("a-large", &large);
        assert_eq!((store.get("a-large"), b_kept(&store)), (None, 7));
        store.put("a-small", &stored("0123456789", "team-a"));
        store.put("a-large", &large);
        assert_eq!(store.get("a-large"), None);
        assert!(store.get("a-small").is_some(), "a's own entry stays");
        assert_eq!(b_kept(&store), 7);
        // Up to half fits, taken from b's oldest.
        let half = stored(&"x".repeat(one * 4 - one + 10), "team-a");
        store.put("a-half", &half);
        assert!(store.get("a-half").is_some());
        assert_eq!(b_kept(&store), 5);
        assert_eq!(store.get("b00"), None);
        assert!(store.bytes() <= one * 10);
    }

    /// Places of deleted entries pile up behind a live one and are compacted away; every
    /// kept entry keeps its place, so it still expires and still gives way to the bound.
    #[tokio::test(start_paused = true)]
    async fn churn_behind_a_kept_entry_keeps_every_entry_reachable() {
        let one = ten_bytes("r000", "t");
        let store = MemoryStore::new(one * 20, Duration::from_secs(60));
        store.put("kept", &stored("0123456789", "t"));
        let mut compacted = false;
        for i in 0..300 {
            let id = format!("r{i:03}");
            store.put(&id, &stored("0123456789", "t"));
            let inner = store.lock();
            compacted |= inner.owners["t"].order.len() < i;
            for (id, e) in &inner.map {
                let placed = inner.owners[&e.owner]
                    .order
                    .iter()
                    .any(|(p, g)| p == id && *g == e.generation);
                assert!(placed, "{id} lost its place after put {i}");
            }
            drop(inner);
            if i % 50 != 0 {
                assert!(store.delete(&id));
            }
            assert!(store.bytes() <= one * 20);
        }
        assert!(compacted, "the stale places were compacted");
        assert!(store.get("kept").is_some());
        tokio::time::advance(Duration::from_secs(61)).await;
        store.put("last", &stored("0123456789", "u"));
        assert_eq!(
            store.lock().map.len(),
            1,
            "every expired entry was reachable"
        );
        assert_eq!(store.lock().owners.len(), 1);
    }

    #[test]
    fn the_owner_is_read_from_the_entrys_tail() {
        let s = stored("hi", "team-a");
        let by_serde = serde_json::to_vec(&s).unwrap_or_default();
        assert_eq!(owner_of(&by_serde), "team-a");
        let response = serde_json::to_vec(&s.response).unwrap_or_default();
        let items = crate::responses::Items::Values(s.input.clone());
        let written = Stored::serialise(&items, &response, (true, "openai"), "team-b");
        assert_eq!(owner_of(&written), "team-b");
        assert_eq!(
            owner_of(&Stored::serialise(&items, &response, (true, "openai"), "")),
            ""
        );
        assert_eq!(owner_of(b"{\"input\":[],\"response\":{\"x\":\"y\"}}"), "");
        assert_eq!(owner_of(b""), "");
    }

    #[tokio::test]
    async fn replacing_and_deleting_keep_the_byte_count() {
        let store = MemoryStore::new(1 << 20, Duration::from_secs(60));
        store.put("a", &stored("one", "t"));
        store.put("a", &stored("two", "t"));
        assert_eq!(store.get("a"), Some(stored("two", "t")));
        assert!(store.delete("a"));
        assert!(!store.delete("a"));
        assert_eq!(store.bytes(), 0);
        assert!(
            store.lock().owners.is_empty(),
            "an owner without entries goes"
        );
        store.put("b", &stored("x", "t"));
        let places: usize = store.lock().owners.values().map(|o| o.order.len()).sum();
        assert_eq!(places, 1, "stale places go with their owner");
    }
}
