//! What the mock remembers: the recorded API requests, the counters tests wait on, and the
//! script queue with each entry's remaining uses.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::script::{Reply, Script};

/// Recorded requests kept in memory; older ones are dropped so a long drill or a benchmark
/// cannot grow the mock without bound. Counters keep counting past it.
const RECORD_LIMIT: usize = 10_000;

/// One API request as the mock received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query, as sent.
    pub path: String,
    /// Lowercase names with every value, duplicates included. Values of a repeated name are
    /// listed together at the place of the name's first occurrence.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Lowercase hex SHA-256 of `body`.
    pub body_sha256: String,
}

impl RecordedRequest {
    pub(crate) fn new(
        method: String,
        path: String,
        headers: Vec<(String, String)>,
        body: Bytes,
    ) -> RecordedRequest {
        let body_sha256 = hex::encode(Sha256::digest(&body));
        RecordedRequest {
            method,
            path,
            headers,
            body,
            body_sha256,
        }
    }

    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a header, by case-insensitive name, in order.
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Counters over API requests (control-plane calls are not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MockStats {
    /// Requests received (body read in full).
    pub requests: u64,
    /// Responses the mock finished sending, scripted cuts included.
    pub completed: u64,
    /// Requests whose client went away before the response was finished.
    pub cancelled: u64,
    /// Requests received and neither completed nor cancelled yet.
    pub inflight: u64,
}

/// The script with the remaining uses of each queued reply.
struct Queue {
    script: Arc<Script>,
    /// Remaining uses per reply; `None` is unlimited.
    left: Vec<Option<u32>>,
}

impl Queue {
    fn new(script: Script) -> Queue {
        let left = script
            .replies
            .iter()
            .map(|r| (r.times > 0).then_some(r.times))
            .collect();
        Queue {
            script: Arc::new(script),
            left,
        }
    }
}

/// Fields of a request a reply's `match` can test.
pub(crate) struct MatchKey<'a> {
    pub model: Option<&'a str>,
    pub path: &'a str,
    pub stream: bool,
}

/// State shared by the server handle, the accept loop and every request.
pub(crate) struct Shared {
    stats: watch::Sender<MockStats>,
    records: Mutex<VecDeque<RecordedRequest>>,
    queue: Mutex<Queue>,
    /// Numbers responses (`req_mock_<n>`); never reset, so ids stay unique.
    next_id: AtomicU64,
    /// The cloud platforms and credential endpoints, with `--cloud`.
    cloud: Option<super::cloud::Cloud>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data stays consistent even if a holder panicked: every update is one step.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(super) fn new(script: Script) -> Shared {
        Shared {
            stats: watch::Sender::new(MockStats::default()),
            records: Mutex::new(VecDeque::new()),
            queue: Mutex::new(Queue::new(script)),
            next_id: AtomicU64::new(1),
            cloud: None,
        }
    }

    pub(super) fn with_cloud(script: Script, opts: super::cloud::CloudOptions) -> Shared {
        Shared {
            cloud: Some(super::cloud::Cloud::new(opts)),
            ..Shared::new(script)
        }
    }

    pub(super) fn cloud(&self) -> Option<&super::cloud::Cloud> {
        self.cloud.as_ref()
    }

    pub(super) fn stats(&self) -> MockStats {
        *self.stats.borrow()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<MockStats> {
        self.stats.subscribe()
    }

    pub(super) fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.records).iter().cloned().collect()
    }

    pub(super) fn script(&self) -> Arc<Script> {
        Arc::clone(&lock(&self.queue).script)
    }

    pub(super) fn set_script(&self, script: Script) {
        *lock(&self.queue) = Queue::new(script);
    }

    /// Clears recorded requests and the counters; `inflight` is live state and stays.
    pub(super) fn reset(&self) {
        let mut records = lock(&self.records);
        records.clear();
        self.stats.send_modify(|s| {
            *s = MockStats {
                inflight: s.inflight,
                ..MockStats::default()
            };
        });
    }

    /// Records an API request and starts counting it; the guard settles it as completed or
    /// cancelled. Returns the response number as well.
    pub(super) fn record(self: &Arc<Self>, request: RecordedRequest) -> (u64, RequestGuard) {
        {
            let mut records = lock(&self.records);
            if records.len() >= RECORD_LIMIT {
                records.pop_front();
            }
            records.push_back(request);
            self.stats.send_modify(|s| {
                s.requests += 1;
                s.inflight += 1;
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let guard = RequestGuard {
            shared: Arc::clone(self),
            done: false,
        };
        (id, guard)
    }

    /// Takes the first queued reply that fits and has uses left. `explicit_path_only` limits
    /// the choice to entries whose `match.path` names the request's path.
    pub(super) fn take_reply(
        &self,
        key: &MatchKey<'_>,
        explicit_path_only: bool,
    ) -> Option<Arc<Reply>> {
        let mut queue = lock(&self.queue);
        let Queue { script, left } = &mut *queue;
        for (reply, left) in script.replies.iter().zip(left.iter_mut()) {
            if *left == Some(0) || !fits(reply, key, explicit_path_only) {
                continue;
            }
            if let Some(n) = left {
                *n -= 1;
            }
            return Some(Arc::clone(reply));
        }
        None
    }

    fn settle(&self, completed: bool) {
        self.stats.send_modify(|s| {
            s.inflight = s.inflight.saturating_sub(1);
            if completed {
                s.completed += 1;
            } else {
                s.cancelled += 1;
            }
        });
    }
}

fn fits(reply: &Reply, key: &MatchKey<'_>, explicit_path_only: bool) -> bool {
    let m = &reply.matcher;
    if explicit_path_only && m.path.is_none() {
        return false;
    }
    m.path.as_deref().is_none_or(|p| p == key.path)
        && m.model
            .as_deref()
            .is_none_or(|model| key.model == Some(model))
        && m.stream.is_none_or(|s| s == key.stream)
}

/// Counts one API request as completed when told, or as cancelled when dropped before that:
/// it lives in the handler future and then in the response body, so a client that goes away
/// at any point drops it unfinished.
pub(crate) struct RequestGuard {
    shared: Arc<Shared>,
    done: bool,
}

impl RequestGuard {
    pub(super) fn complete(&mut self) {
        if !self.done {
            self.done = true;
            self.shared.settle(true);
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if !self.done {
            self.shared.settle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> RecordedRequest {
        RecordedRequest::new(
            "POST".into(),
            path.into(),
            Vec::new(),
            Bytes::from_static(b"abc"),
        )
    }

    fn key<'a>(model: Option<&'a str>, path: &'a str) -> MatchKey<'a> {
        MatchKey {
            model,
            path,
            stream: false,
        }
    }

    #[test]
    fn guard_counts_completed_or_cancelled_once() {
        let shared = Arc::new(Shared::new(Script::default()));
        let (first, mut done) = shared.record(request("/a"));
        let (second, dropped) = shared.record(request("/b"));
        assert_eq!(second, first + 1);
        assert_eq!(shared.stats().inflight, 2);
        done.complete();
        done.complete();
        drop(done);
        drop(dropped);
        let stats = shared.stats();
        assert_eq!(
            (stats.requests, stats.completed, stats.cancelled),
            (2, 1, 1)
        );
        assert_eq!(stats.inflight, 0);
        assert_eq!(
            shared.requests()[0].body_sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn reset_keeps_inflight_and_clears_the_rest() {
        let shared = Arc::new(Shared::new(Script::default()));
        let (_, guard) = shared.record(request("/a"));
        shared.reset();
        assert!(shared.requests().is_empty());
        assert_eq!(
            shared.stats(),
            MockStats {
                inflight: 1,
                ..MockStats::default()
            }
        );
        drop(guard);
        assert_eq!(shared.stats().cancelled, 1);
        assert_eq!(shared.stats().inflight, 0);
    }

    #[test]
    fn queue_takes_first_fitting_entry_until_spent() -> Result<(), String> {
        let script = Script::from_json(
            r#"{"replies":[{"match":{"model":"a"},"status":500,"times":2},
                {"status":529},{"match":{"path":"/count"},"times":0,"status":503}]}"#,
        )?;
        let shared = Shared::new(script);
        let status = |model, path, explicit| {
            shared
                .take_reply(&key(model, path), explicit)
                .map(|r| r.status.as_u16())
        };
        assert_eq!(status(Some("b"), "/m", false), Some(529));
        assert_eq!(status(Some("b"), "/m", false), None);
        assert_eq!(status(Some("a"), "/m", false), Some(500));
        assert_eq!(status(Some("a"), "/m", true), None);
        assert_eq!(status(Some("a"), "/m", false), Some(500));
        assert_eq!(status(Some("a"), "/m", false), None);
        for _ in 0..3 {
            assert_eq!(
                status(None, "/count", true),
                Some(503),
                "times 0 is unlimited"
            );
        }
        Ok(())
    }

    #[test]
    fn set_script_rearms_the_queue() -> Result<(), String> {
        let shared = Shared::new(Script::from_json(r#"{"replies":[{"status":500}]}"#)?);
        assert!(shared.take_reply(&key(None, "/"), false).is_some());
        assert!(shared.take_reply(&key(None, "/"), false).is_none());
        shared.set_script(Script::from_json(r#"{"replies":[{"status":500}]}"#)?);
        assert!(shared.take_reply(&key(None, "/"), false).is_some());
        Ok(())
    }
}
