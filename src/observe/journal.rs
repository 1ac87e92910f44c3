//! The request journal: the last `[journal] size` finished requests in a ring, for
//! `GET /admin/requests` and `GET /admin/requests/{id}`. Bounded by count; each entry holds the
//! request's facts (its access-log record and attempts) and, with capture on, redacted body
//! prefixes of bounded size.
//!
//! Entries keep the facts as gathered and are rendered as JSON only when read: every request
//! is pushed, few are ever looked at, and a JSON document per request cost more instructions
//! and allocations than the rest of the bookkeeping together (and more memory per entry).

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use serde_json::{Value, json};

use super::facts::Facts;

/// Redacted prefixes of the request and response bodies, when capture is on.
pub type Captured = (Option<String>, Option<String>);

/// One request: gathered in place while it runs (`RequestObs` holds it from the start, so
/// the facts, several hundred bytes, are never copied), then kept here once it is over.
#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) facts: Facts,
    pub(crate) capture: Captured,
}

impl Entry {
    pub(crate) fn new(facts: Facts) -> Self {
        Entry {
            facts,
            capture: (None, None),
        }
    }

    /// The access-log record plus `attempts_detail` (and `capture` when there is one).
    fn doc(&self) -> Value {
        let mut doc = self.facts.record();
        let started = self.facts.started;
        let attempts = self
            .facts
            .steps
            .iter()
            .map(|a| a.to_json(started))
            .collect();
        doc.insert("attempts_detail".to_string(), Value::Array(attempts));
        let (req, resp) = &self.capture;
        if req.is_some() || resp.is_some() {
            doc.insert(
                "capture".to_string(),
                json!({"request": req, "response": resp}),
            );
        }
        Value::Object(doc)
    }
}

pub struct Journal {
    size: usize,
    /// Shared entries, so a reader renders them after releasing the lock.
    ring: Mutex<VecDeque<Arc<Entry>>>,
}

/// `?limit=N&status=…&tenant=…`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub limit: Option<usize>,
    /// An exact status (`429`) or a class (`5xx`).
    pub status: Option<String>,
    pub tenant: Option<String>,
}

/// Without `limit`, this many entries are listed.
const DEFAULT_LIMIT: usize = 50;

impl Journal {
    pub fn new(size: usize) -> Self {
        Journal {
            size,
            ring: Mutex::new(VecDeque::with_capacity(size.min(4096))),
        }
    }

    pub fn capacity(&self) -> usize {
        self.size
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<Entry>>> {
        self.ring.lock()
    }

    /// Keeps a finished request, forgetting the oldest beyond the size.
    #[cfg(test)]
    pub fn push(&self, facts: Facts, capture: Captured) {
        self.push_entry(Arc::new(Entry { facts, capture }));
    }

    /// Keeps a finished request's entry, forgetting the oldest beyond the size.
    pub(crate) fn push_entry(&self, mut entry: Arc<Entry>) {
        if self.size == 0 {
            return;
        }
        if let Some(e) = Arc::get_mut(&mut entry) {
            // Kept for the next `size` requests: the lists grew by pushes, most requests have
            // one attempt and one finish reason.
            e.facts.steps.shrink_to_fit();
            e.facts.finish_reasons.shrink_to_fit();
        }
        let old = {
            let mut ring = self.lock();
            let old = (ring.len() >= self.size).then(|| ring.pop_front());
            ring.push_back(entry);
            old
        };
        // The evicted entry is freed after the lock is released.
        drop(old);
    }

    /// Newest first, filtered.
    pub fn list(&self, q: &Query) -> Value {
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(self.size);
        let (held, picked): (usize, Vec<Arc<Entry>>) = {
            let ring = self.lock();
            let picked = ring
                .iter()
                .rev()
                .filter(|e| q.tenant.as_deref().is_none_or(|t| e.facts.tenant == t))
                .filter(|e| {
                    q.status
                        .as_deref()
                        .is_none_or(|s| status_matches(e.facts.status(), s))
                })
                .take(limit)
                .cloned()
                .collect();
            (ring.len(), picked)
        };
        let items: Vec<Value> = picked.iter().map(|e| e.doc()).collect();
        json!({"size": self.size, "held": held, "requests": items})
    }

    pub fn get(&self, id: &str) -> Option<Value> {
        // Parsed once, so the walk under the lock compares numbers, not texts.
        let id = crate::observe::RequestId::parse(id)?;
        let found = self
            .lock()
            .iter()
            .rev()
            .find(|e| e.facts.request_id == id)
            .cloned();
        found.map(|e| e.doc())
    }
}

/// `429` matches exactly; `4xx` matches the class.
fn status_matches(status: u16, want: &str) -> bool {
    let want = want.trim().to_ascii_lowercase();
    match want.strip_suffix("xx") {
        Some(class) => class.parse::<u16>().is_ok_and(|c| status / 100 == c),
        None => want.parse::<u16>().is_ok_and(|w| w == status),
    }
}

/// Parses the query string of `/admin/requests`; an unknown key or a bad value is an error
/// message for a 400.
pub fn parse_query(q: Option<&str>) -> Result<Query, String> {
    let mut out = Query::default();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "limit" => {
                out.limit = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("limit: `{v}` is not a number"))?,
                )
            }
            "status" => {
                let ok = v.len() == 3
                    && (v.parse::<u16>().is_ok()
                        || v.to_ascii_lowercase().ends_with("xx") && v[..1].parse::<u16>().is_ok());
                if !ok {
                    return Err(format!(
                        "status: `{v}` is not a status (429) or class (5xx)"
                    ));
                }
                out.status = Some(v.to_string());
            }
            "tenant" => out.tenant = Some(v.to_string()),
            other => {
                return Err(format!(
                    "unknown parameter `{other}` (expected limit, status, tenant)"
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> String {
        crate::observe::RequestId::new(0, n).render()
    }

    fn rec(n: u64, status: u16, tenant: &str) -> Facts {
        let mut f = Facts::new(
            crate::observe::RequestId::new(0, n),
            "anthropic",
            "POST".into(),
            "/v1/messages".into(),
            std::time::Instant::now(),
        );
        f.status = Some(status);
        f.tenant = tenant.to_owned().into();
        f
    }

    #[test]
    fn the_ring_keeps_the_newest_within_its_size() {
        let j = Journal::new(3);
        for i in 0..10 {
            j.push(rec(i, 200, "a"), (None, None));
        }
        assert_eq!(j.len(), 3);
        assert!(j.get(&id(6)).is_none());
        assert!(j.get(&id(9)).is_some());
        let list = j.list(&Query::default());
        let ids: Vec<String> = list["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["request_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids, [id(9), id(8), id(7)]);
    }

    #[test]
    fn filters_by_status_class_and_tenant() {
        let j = Journal::new(10);
        j.push(rec(1, 200, "t1"), (None, None));
        j.push(rec(2, 429, "t1"), (None, None));
        j.push(rec(3, 503, "t2"), (None, None));
        let q = |s: &str| parse_query(Some(s)).unwrap();
        let n = |v: Value| v["requests"].as_array().unwrap().len();
        assert_eq!(n(j.list(&q("status=4xx"))), 1);
        assert_eq!(n(j.list(&q("status=503"))), 1);
        assert_eq!(n(j.list(&q("tenant=t1"))), 2);
        assert_eq!(n(j.list(&q("tenant=t1&limit=1"))), 1);
        assert!(parse_query(Some("status=abc")).is_err());
        assert!(parse_query(Some("order=desc")).is_err());
    }

    #[test]
    fn a_journal_of_size_zero_keeps_nothing() {
        let j = Journal::new(0);
        j.push(rec(1, 200, "t"), (None, None));
        assert!(j.is_empty());
    }
}
