//! The conversation store (`[responses]`, SPEC §11): per relayed response, its input items
//! and the response object, so that `previous_response_id` can be rebuilt for a step that
//! keeps no state, and `GET /v1/responses/{id}` answers for translated responses.
//!
//! `memory`: one process, bounded by `max_bytes` and `ttl` (`memory.rs`). Entries are held
//! serialised: keeping a response costs one serialisation and no copy of the tree; a lookup,
//! which only a request naming an earlier response makes, parses the entry back. `redis`: shared by replicas, one key per
//! response (`legate:resp:<id>`) with the TTL as its expiry; construction never connects, a
//! failed call drops the connection and the next one reconnects, every call has a short
//! timeout, and a Redis that is down makes lookups fail loudly (never a silent miss), except
//! of entries it did not take, which this process keeps in memory instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use std::time::Duration;

use redis::Client;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::redis_conn::LazyConnection;
use crate::responses::Items;
pub use crate::responses::memory::MemoryStore;
use crate::responses::memory::held;
use crate::responses::owners::Owners;

const REDIS_TIMEOUT: Duration = Duration::from_millis(500);

/// What is kept of one response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The whole input of the turn (earlier turns included when it was rebuilt).
    pub input: Vec<Value>,
    /// The response object as the caller received it.
    pub response: Value,
    /// Relayed from a provider that keeps it too: its own endpoints answer for it.
    #[serde(default)]
    pub passthrough: bool,
    /// The provider that made a relayed response: its id means nothing to another provider,
    /// so a turn that continues it on another step is rebuilt from the store. For one built
    /// here, the provider whose items (reasoning, item ids) its input carries from the relayed
    /// turns before it. Empty when none, or for an entry kept before providers were recorded.
    /// The input's reasoning items are this provider's alone, and go to no other.
    #[serde(default)]
    pub provider: String,
    /// The tenant whose request made it: no other tenant reads, continues or deletes it.
    /// Empty for an entry kept before owners were recorded (see [`Stored::belongs_to`]).
    #[serde(default)]
    pub owner: String,
}

/// Room for an entry's input items before their size is known: a short conversation's.
const INPUT_ROOM: usize = 1024;

impl Stored {
    /// An entry as the stores keep it, written around a response object's own JSON text: the
    /// same layout `Stored` serialises to, without parsing the response into a tree first.
    /// `response` must be one JSON value.
    pub fn serialise(
        input: &Items,
        response: &[u8],
        (passthrough, provider): (bool, &str),
        owner: &str,
    ) -> Vec<u8> {
        Stored::write(
            input,
            (passthrough, provider, owner),
            response.len(),
            |out| {
                out.extend_from_slice(response);
            },
        )
    }

    /// An entry as the stores keep it, for a response object built as a tree (no copy of
    /// the input items).
    pub fn serialise_tree(
        input: &Items,
        response: &Value,
        (passthrough, provider): (bool, &str),
        owner: &str,
    ) -> Vec<u8> {
        Stored::write(input, (passthrough, provider, owner), 0, |out| {
            // Writing a tree of values into a Vec cannot fail.
            let _ = serde_json::to_writer(out, response);
        })
    }

    /// `{"input":…,"response":…,"passthrough":…,"provider":…,"owner":…}`, the layout `Stored` serialises
    /// to, with the input items written as they are held and the response by `response`
    /// (`response_len`: its size when known, so the entry is written into the room it needs).
    fn write(
        input: &Items,
        (passthrough, provider, owner): (bool, &str, &str),
        response_len: usize,
        response: impl FnOnce(&mut Vec<u8>),
    ) -> Vec<u8> {
        const RESPONSE: &[u8] = b",\"response\":";
        const OWNER: &[u8] = b",\"owner\":";
        const PROVIDER: &[u8] = b",\"provider\":";
        let end: &[u8] = if passthrough {
            b",\"passthrough\":true"
        } else {
            b",\"passthrough\":false"
        };
        // Tenant names are `[a-z0-9_-]+` (config validation): quoted, they need no escapes.
        let rest = RESPONSE.len()
            + response_len
            + end.len()
            + PROVIDER.len()
            + provider.len()
            + OWNER.len()
            + owner.len()
            + 5;
        // With the input as text and the response's length known (a relayed answer), the
        // whole entry is one allocation of exactly its size: a first one for the input, grown
        // for the rest, cost a realloc that copied the input, per kept response.
        let mut out = Vec::with_capacity(match input {
            Items::Text(text) => b"{\"input\":".len() + text.len() + rest,
            Items::Values(_) => INPUT_ROOM,
        });
        out.extend_from_slice(b"{\"input\":");
        input.write_to(&mut out);
        // Room for exactly the rest when the response is text, so the entry is kept as it is
        // (a Vec that grew by doubling was shrunk again, a second reallocation, before being
        // kept). Nothing to do when it was reserved above.
        out.reserve_exact(rest);
        out.extend_from_slice(RESPONSE);
        response(&mut out);
        out.extend_from_slice(end);
        // Provider names are config names too (`[a-z0-9_-]+`); written as JSON all the same.
        out.extend_from_slice(PROVIDER);
        let _ = serde_json::to_writer(&mut out, provider);
        out.extend_from_slice(OWNER);
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, owner);
        out.push(b'}');
        out
    }

    /// Whether `tenant` may see this entry. One kept before owners were recorded is anyone's
    /// when there are no `[[clients]]` (`open`: every caller is the one tenant), and nobody's
    /// with them, since whose it was is not known.
    pub fn belongs_to(&self, tenant: &str, open: bool) -> bool {
        self.owner == tenant || (open && self.owner.is_empty())
    }

    /// The response's output items.
    pub fn output(&self) -> &[Value] {
        self.response["output"]
            .as_array()
            .map_or(&[], Vec::as_slice)
    }
}

/// The store could not be reached; the text is fit for the log, never holds a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

/// Where conversations are kept, and whose each relayed response is.
pub struct ConversationStore {
    backend: Backend,
    /// Whose each relayed response is, beyond what the backend keeps (see `owners.rs`).
    pub owners: Owners,
    /// Responses deleted while their stream ran, not to be kept when it ends.
    pub deleted: super::tombstones::Tombstones,
}

enum Backend {
    Memory(MemoryStore),
    Redis(Box<RedisConversations>),
}

impl ConversationStore {
    pub fn in_memory(store: MemoryStore) -> Self {
        ConversationStore {
            backend: Backend::Memory(store),
            owners: Owners::default(),
            deleted: Default::default(),
        }
    }

    pub fn in_redis(store: RedisConversations) -> Self {
        ConversationStore {
            backend: Backend::Redis(Box::new(store)),
            owners: Owners::default(),
            deleted: Default::default(),
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        match &self.backend {
            Backend::Memory(m) => Ok(m.get(id)),
            Backend::Redis(r) => r.get(id).await,
        }
    }

    pub async fn put(&self, id: &str, stored: &Stored) -> Result<(), StoreError> {
        let data = serde_json::to_vec(stored).map_err(|e| StoreError(e.to_string()))?;
        self.put_serialised(id, data).await
    }

    /// Keeps an entry already serialised (by [`Stored::serialise`] or from a `Stored`).
    pub async fn put_serialised(&self, id: &str, data: Vec<u8>) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(m) => {
                m.put_serialised(id, data);
                Ok(())
            }
            Backend::Redis(r) => r.put_serialised(id, data).await,
        }
    }

    /// Applies a reload's `[responses]` bounds; returns the settings that only a restart
    /// changes. The memory store takes both at once (what is kept past the new ttl goes, and
    /// the oldest entries give way to a smaller `max_bytes`). Redis takes the ttl for the
    /// entries written after it (those written keep the one Redis holds); its `max_bytes`
    /// sized the connections' reply bound at start.
    pub fn reconfigure(&self, max_bytes: usize, ttl: Duration) -> Vec<&'static str> {
        match &self.backend {
            Backend::Memory(m) => {
                m.resize(max_bytes, ttl);
                Vec::new()
            }
            Backend::Redis(r) => {
                r.ttl_secs.store(ttl.as_secs().max(1), Ordering::Relaxed);
                r.local.resize(r.max_pending, ttl);
                if max_bytes == r.max_pending {
                    Vec::new()
                } else {
                    vec!["responses.max_bytes"]
                }
            }
        }
    }

    /// The in-process store, which a put never waits on.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match &self.backend {
            Backend::Memory(m) => Some(m),
            Backend::Redis(_) => None,
        }
    }

    /// The Redis store, whose writes go in the background.
    pub fn redis(&self) -> Option<&RedisConversations> {
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Redis(r) => Some(r),
        }
    }

    /// True when the id was kept.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Memory(m) => Ok(m.delete(id)),
            Backend::Redis(r) => r.delete(id).await,
        }
    }
}

/// The Redis store, shared by replicas.
///
/// An entry that cannot be written to Redis (it is down, slow, or the writes waiting for it
/// already hold `max_bytes`) is kept in this process's memory instead, within `max_bytes` and
/// `ttl` like the memory store, and lookups that Redis cannot answer look there: a
/// conversation relayed during an outage is not lost to the replica that relayed it (a
/// sidecar's agent always comes back to it), and lookups of it go on through the outage.
///
/// Told apart: entries never sent (no connection, or no room to wait), which Redis cannot
/// hold, and entries whose write was sent but got no answer (a timeout, a broken connection),
/// which Redis may have applied: these are kept under [`sent_key`]. Once Redis answers, its
/// word on such an entry is final: a miss drops the copy (another replica may have deleted
/// it), and a delete that Redis cannot be asked about is an error, not a success. A Redis hit
/// drops any copy. One store, one copy per id, `max_bytes` in all.
pub struct RedisConversations {
    /// In seconds: a reload changes it for the writes after it.
    ttl_secs: AtomicU64,
    /// Lookups and deletes.
    conn: LazyConnection,
    /// Writes, apart: a connection carries its calls in order, and a large entry on its way
    /// (megabytes) would hold every lookup behind it past its timeout, another caller's (or
    /// tenant's) lookup refused 503 for a write it had nothing to do with.
    writes: LazyConnection,
    local: MemoryStore,
    /// Bytes of entries waiting to be written (in the background: the caller does not wait),
    /// at most `max_pending`: a Redis that answers slowly, or not at all, must not make them
    /// pile up in memory.
    pending: Arc<AtomicUsize>,
    max_pending: usize,
    /// Entries whose background write is not answered yet, by id: a lookup that Redis answers
    /// with a miss (or cannot answer) finds them here, so that an agent's next turn, sent as
    /// soon as it has the answer, does not race its own write. Bounded with the writes
    /// (`reserve_write` counts each entry's bytes twice: here and in its command).
    writing: Mutex<std::collections::HashMap<String, Arc<[u8]>>>,
    /// Ids deleted while their write was on its way: the write goes on another connection,
    /// so Redis may run it after the DEL, and the entry must be deleted again once it is.
    /// Bounded with `writing` (an id is put here only when it was taken from there).
    deleted_in_flight: Mutex<std::collections::HashSet<String>>,
}

/// An entry's place among the bytes waiting to be written, given back when dropped.
pub struct PendingWrite {
    pending: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        self.pending.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

fn key(id: &str) -> String {
    format!("legate:resp:{id}")
}

fn kept(kept: bool) -> &'static str {
    match kept {
        true => "kept in this process's memory instead",
        false => "not kept: larger than [responses] max_bytes",
    }
}

/// Where a copy whose write was sent is kept, apart from one never sent. Response ids come from
/// legate and the providers as JSON strings, and none begins with a control character.
fn sent_key(id: &str) -> String {
    format!("\u{1}sent:{id}")
}

impl RedisConversations {
    /// Never connects: legate must start while Redis is down. At most `max_pending` bytes of
    /// entries wait to be written at any time.
    pub fn new(url: &str, ttl: Duration, max_pending: usize) -> Result<Self, StoreError> {
        let client = Client::open(url)
            .map_err(|e| StoreError(format!("the Redis URL cannot be used: {}", e.category())))?;
        // An entry is written only within `max_bytes` (`reserve_write`), so no reply of ours is
        // longer than that and its RESP header.
        let connection = || {
            LazyConnection::new(&client, REDIS_TIMEOUT, max_pending.saturating_add(64))
                .map_err(|e| StoreError(format!("the Redis URL cannot be used: {}", e.category())))
        };
        Ok(RedisConversations {
            ttl_secs: AtomicU64::new(ttl.as_secs().max(1)),
            local: MemoryStore::new(max_pending, ttl),
            conn: connection()?,
            writes: connection()?,
            pending: Arc::new(AtomicUsize::new(0)),
            max_pending,
            writing: Mutex::new(std::collections::HashMap::new()),
            deleted_in_flight: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// `id`'s entry is about to be written in the background: lookups find it until the write
    /// is answered (see [`RedisConversations::put_serialised`]).
    pub fn will_write(&self, id: &str, bytes: Arc<[u8]>) {
        self.writing.lock().insert(id.to_owned(), bytes);
    }

    fn being_written(&self, id: &str) -> Option<Stored> {
        let bytes = self.writing.lock().get(id).cloned()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Room for `bytes` more waiting to be written; `None` when the bound is reached.
    pub fn reserve_write(&self, bytes: usize) -> Option<PendingWrite> {
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&t| t <= self.max_pending)
            })
            .ok()?;
        Some(PendingWrite {
            pending: self.pending.clone(),
            bytes,
        })
    }

    async fn run<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        let mut leased = self
            .conn
            .get()
            .await
            .map_err(|e| StoreError(format!("Redis is unreachable: {}", e.category())))?;
        match cmd.query_async(&mut leased.conn).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn.reset(&leased, &e).await;
                Err(StoreError(format!("a Redis call failed: {}", e.category())))
            }
        }
    }

    /// Redis's entry, else one kept here; an error only when Redis cannot be asked and no
    /// entry is kept here.
    pub async fn get(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        match self
            .run::<Option<Vec<u8>>>(redis::cmd("GET").arg(key(id)).clone())
            .await
        {
            Ok(Some(bytes)) => {
                self.local.delete(id);
                self.local.delete(&sent_key(id));
                Ok(serde_json::from_slice(&bytes).ok())
            }
            Ok(None) => {
                self.local.delete(&sent_key(id));
                Ok(self.local.get(id).or_else(|| self.being_written(id)))
            }
            Err(e) => self
                .local
                .get(id)
                .or_else(|| self.local.get(&sent_key(id)))
                .or_else(|| self.being_written(id))
                .map(Some)
                .ok_or(e),
        }
    }

    /// Writes the entry to Redis, or keeps it here when Redis does not take it; either way it
    /// is no longer looked up among the writes in flight ([`RedisConversations::will_write`]).
    pub async fn put_serialised(&self, id: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let written = self.write(id, bytes).await;
        self.writing.lock().remove(id);
        if self.deleted_in_flight.lock().remove(id) {
            // A DELETE was answered while this write was on its way: what the write left (in
            // Redis, or kept here when Redis did not take it) goes too.
            self.local.delete(id);
            self.local.delete(&sent_key(id));
            if written.is_ok()
                && let Err(e) = self
                    .run::<u64>(redis::cmd("DEL").arg(key(id)).clone())
                    .await
            {
                tracing::warn!(error = %e.0, "a deleted response written after its DELETE could not be deleted again");
            }
        }
        written
    }

    async fn write(&self, id: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let secs = self.ttl_secs.load(Ordering::Relaxed);
        // The entry's bytes live in the command alone while it waits (and are taken back
        // from it if Redis does not take them).
        let cmd = redis::cmd("SET")
            .arg(key(id))
            .arg(bytes)
            .arg("EX")
            .arg(secs)
            .clone();
        let entry = |cmd: &redis::Cmd| match cmd.args_iter().nth(2) {
            Some(redis::Arg::Simple(b)) => b.to_vec(),
            _ => Vec::new(),
        };
        let mut leased = match self.writes.get().await {
            Ok(leased) => leased,
            Err(e) => {
                let kept = kept(self.keep(id, entry(&cmd), false));
                return Err(StoreError(format!(
                    "Redis is unreachable: {}; {kept}",
                    e.category()
                )));
            }
        };
        match cmd.query_async::<()>(&mut leased.conn).await {
            Ok(()) => Ok(()),
            Err(e) => {
                self.writes.reset(&leased, &e).await;
                // An error reply (`-OOM`, `-READONLY`, `-LOADING`) says the write was not
                // applied; only a call that got no answer may have been.
                let unanswered = e.is_timeout() || e.is_io_error() || e.is_connection_dropped();
                let kept = kept(self.keep(id, entry(&cmd), unanswered));
                Err(StoreError(format!(
                    "a Redis call failed: {}; {kept}",
                    e.category()
                )))
            }
        }
    }

    /// Keeps an entry Redis did not take in this process's memory (`sent`: its write was sent
    /// and got no answer); false when it is larger than the whole bound.
    pub fn keep(&self, id: &str, bytes: Vec<u8>, sent: bool) -> bool {
        let (at, other) = match sent {
            true => (sent_key(id), id.to_owned()),
            false => (id.to_owned(), sent_key(id)),
        };
        self.local.delete(&other);
        if held(&at, bytes.len()) > self.max_pending {
            return false;
        }
        self.local.put_serialised(&at, bytes);
        true
    }

    /// Deletes Redis's entry and any kept here; an error when Redis cannot be asked, unless
    /// the entry was kept here only because it was never sent.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let in_flight = self.writing.lock().remove(id).is_some();
        if in_flight {
            self.deleted_in_flight.lock().insert(id.to_owned());
        }
        let unsent = self.local.delete(id);
        let unsure = self.local.delete(&sent_key(id));
        match self
            .run::<u64>(redis::cmd("DEL").arg(key(id)).clone())
            .await
        {
            Ok(n) => Ok(n > 0 || unsent || in_flight),
            Err(_) if unsent && !unsure => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Bytes of entries kept here (for tests).
    #[cfg(test)]
    pub fn local_bytes(&self) -> usize {
        self.local.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn stored(text: &str) -> Stored {
        Stored {
            input: vec![json!({"role": "user", "content": text})],
            response: json!({"id": "r", "output": [{"type": "message"}]}),
            passthrough: false,
            provider: String::new(),
            owner: "team-a".to_owned(),
        }
    }

    #[tokio::test]
    async fn entries_redis_does_not_take_are_kept_here_and_found_while_it_is_down() {
        // Nothing listens on port 1: every call fails at once.
        let r = RedisConversations::new("redis://127.0.0.1:1/0", Duration::from_secs(60), 1 << 20)
            .unwrap();
        let data = serde_json::to_vec(&stored("kept")).unwrap();
        assert!(r.put_serialised("a", data).await.is_err());
        assert!(r.local_bytes() > 0);
        assert_eq!(r.get("a").await, Ok(Some(stored("kept"))));
        // An id kept nowhere is still an error, not a miss: Redis may hold it.
        assert!(r.get("b").await.is_err());
        assert_eq!(r.delete("a").await, Ok(true));
        assert_eq!(r.local_bytes(), 0);
        assert!(r.get("a").await.is_err());
        assert!(r.delete("a").await.is_err());
    }

    /// A stand-in Redis that applies `SET`, `GET` and `DEL` to `kv`, and answers only while
    /// `answering`: a write it applied without answering is one whose reply was lost. While
    /// `refusing`, it answers `SET` with `-OOM` and applies nothing.
    async fn stand_in(
        kv: Arc<Mutex<HashMap<String, Vec<u8>>>>,
        answering: Arc<std::sync::atomic::AtomicBool>,
        refusing: Arc<std::sync::atomic::AtomicBool>,
    ) -> u16 {
        crate::redis_conn::test_server::stand_in(move |args| {
            let name = String::from_utf8_lossy(&args[0]).to_uppercase();
            let key = args.get(1).map(|k| String::from_utf8_lossy(k).into_owned());
            let mut kv = kv.lock();
            let reply = match (name.as_str(), key) {
                ("SET", Some(_)) if refusing.load(Ordering::SeqCst) => {
                    b"-OOM command not allowed when used memory > 'maxmemory'.\r\n".to_vec()
                }
                ("SET", Some(k)) => {
                    kv.insert(k, args[2].clone());
                    b"+OK\r\n".to_vec()
                }
                ("GET", Some(k)) => match kv.get(&k) {
                    Some(v) => [format!("${}\r\n", v.len()).as_bytes(), v, b"\r\n"].concat(),
                    None => b"$-1\r\n".to_vec(),
                },
                ("DEL", Some(k)) => {
                    let n = usize::from(kv.remove(&k).is_some());
                    format!(":{n}\r\n").into_bytes()
                }
                _ => b"+OK\r\n".to_vec(),
            };
            answering.load(Ordering::SeqCst).then_some(reply)
        })
        .await
    }

    /// A write whose reply is lost may have been applied: the copy kept here gives way to
    /// Redis's word once it answers (a miss drops it, a hit too), and deleting it while Redis
    /// cannot be asked is an error.
    #[tokio::test]
    async fn an_unanswered_write_defers_to_redis_once_it_answers() {
        let kv = Arc::new(Mutex::new(HashMap::new()));
        let answering = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let port = stand_in(kv.clone(), answering.clone(), refusing).await;
        let url = format!("redis://127.0.0.1:{port}/0");
        let r = RedisConversations::new(&url, Duration::from_secs(60), 1 << 20).unwrap();
        let data = |t: &str| serde_json::to_vec(&stored(t)).unwrap();
        // Both connections are open before the replies stop: the writes are sent.
        assert_eq!(r.get("none").await, Ok(None));
        assert_eq!(r.put_serialised("warm", data("warm")).await, Ok(()));
        kv.lock().clear();
        answering.store(false, Ordering::SeqCst);
        let (a, b, c) = tokio::join!(
            r.put_serialised("a", data("a")),
            r.put_serialised("b", data("b")),
            r.put_serialised("c", data("c"))
        );
        assert!(a.is_err() && b.is_err() && c.is_err(), "{a:?} {b:?} {c:?}");
        assert_eq!(kv.lock().len(), 3, "the stand-in applied the writes");
        // Redis cannot be asked (paused after the timeouts): the delete is not a success.
        assert!(r.delete("b").await.is_err());
        answering.store(true, Ordering::SeqCst);
        r.conn.end_pause().await;
        r.writes.end_pause().await;
        // Another replica deletes `a`: Redis's word, not the copy here.
        kv.lock().remove(&key("a"));
        assert_eq!(r.get("a").await, Ok(None));
        // A hit drops the copy: it could otherwise outlive a delete by another replica.
        assert!(r.local_bytes() > 0);
        assert_eq!(r.get("c").await, Ok(Some(stored("c"))));
        assert_eq!(r.local_bytes(), 0);
    }

    /// A write Redis refuses (`-OOM`, `-READONLY`) was certainly not applied: its copy is this
    /// replica's, and a Redis miss does not drop it.
    #[tokio::test]
    async fn a_write_redis_refuses_is_kept_here_and_found() {
        let kv = Arc::new(Mutex::new(HashMap::new()));
        let answering = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let port = stand_in(kv.clone(), answering, refusing).await;
        let url = format!("redis://127.0.0.1:{port}/0");
        let r = RedisConversations::new(&url, Duration::from_secs(60), 1 << 20).unwrap();
        let data = serde_json::to_vec(&stored("a")).unwrap();
        assert!(r.put_serialised("a", data).await.is_err());
        assert!(kv.lock().is_empty());
        // Redis answers (a miss): the copy stands.
        assert_eq!(r.get("a").await, Ok(Some(stored("a"))));
        assert!(!r.conn.paused().await, "an error reply is an answer");
    }

    #[test]
    fn one_copy_per_id_within_the_whole_bound() {
        let r = RedisConversations::new("redis://127.0.0.1:1/0", Duration::from_secs(60), 4000)
            .unwrap();
        let data = serde_json::to_vec(&stored("x")).unwrap();
        assert!(r.keep("a", data.clone(), true));
        let one = r.local_bytes();
        // The same id kept again, as never sent: it replaces the copy.
        assert!(r.keep("a", data.clone(), false));
        assert_eq!(r.local_bytes(), one - sent_key("a").len() + 1);
        // An entry more than half the bound is kept (the bound is not split).
        assert!(r.keep("big", vec![b'0'; 3000], false));
        // One larger than the whole bound is not, and says so.
        assert!(!r.keep("huge", vec![b'0'; 4000], true));
    }

    #[test]
    fn writes_waiting_for_redis_are_bounded_and_give_their_room_back() {
        let r =
            RedisConversations::new("redis://127.0.0.1:1/0", Duration::from_secs(60), 100).unwrap();
        let a = r.reserve_write(60).expect("room for 60 of 100");
        assert!(r.reserve_write(41).is_none());
        let b = r.reserve_write(40).expect("room for 40 more");
        assert!(r.reserve_write(1).is_none());
        drop(a);
        assert!(r.reserve_write(60).is_some());
        drop(b);
        assert!(r.reserve_write(100).is_some());
        assert!(r.reserve_write(101).is_none());
    }

    #[test]
    fn an_entry_written_around_the_response_bytes_reads_back_as_serialised() {
        let s = stored("hi");
        let response = serde_json::to_vec(&s.response).unwrap_or_default();
        for passthrough in [false, true] {
            let provider = if passthrough { "openai" } else { "" };
            let data = Stored::serialise(
                &Items::Values(s.input.clone()),
                &response,
                (passthrough, provider),
                "team-a",
            );
            let back: Stored = serde_json::from_slice(&data).unwrap_or_else(|_| stored("bad"));
            assert_eq!(
                back,
                Stored {
                    passthrough,
                    provider: provider.to_owned(),
                    ..s.clone()
                }
            );
        }
        let store = MemoryStore::new(1 << 20, Duration::from_secs(60));
        store.put_serialised(
            "a",
            Stored::serialise(
                &Items::Values(s.input.clone()),
                &response,
                (false, ""),
                "team-a",
            ),
        );
        assert_eq!(store.get("a"), Some(s));
    }
}
