//! The request journal: the last `[journal] size` finished requests in a ring, for
//! `GET /admin/requests` and `GET /admin/requests/{id}`. Bounded by count; each entry holds its
//! access-log record, its attempts and (with capture on) redacted body prefixes of bounded size.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

/// One finished request, rendered once.
pub struct Entry {
    pub id: String,
    pub status: u16,
    pub tenant: String,
    /// The access-log record plus `attempts_detail` (and captured bodies).
    pub doc: Value,
}

pub struct Journal {
    size: usize,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Entry>>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, record: Map<String, Value>, attempts: Value, capture: Option<Value>) {
        if self.size == 0 {
            return;
        }
        let id = record["request_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let status = record["status"].as_u64().unwrap_or(0) as u16;
        let tenant = record["tenant"].as_str().unwrap_or_default().to_string();
        let mut doc = record;
        doc.insert("attempts_detail".to_string(), attempts);
        if let Some(c) = capture {
            doc.insert("capture".to_string(), c);
        }
        let entry = Arc::new(Entry {
            id,
            status,
            tenant,
            doc: Value::Object(doc),
        });
        let mut ring = self.lock();
        while ring.len() >= self.size {
            ring.pop_front();
        }
        ring.push_back(entry);
    }

    /// Newest first, filtered.
    pub fn list(&self, q: &Query) -> Value {
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(self.size);
        let ring = self.lock();
        let items: Vec<Value> = ring
            .iter()
            .rev()
            .filter(|e| q.tenant.as_deref().is_none_or(|t| e.tenant == t))
            .filter(|e| {
                q.status
                    .as_deref()
                    .is_none_or(|s| status_matches(e.status, s))
            })
            .take(limit)
            .map(|e| e.doc.clone())
            .collect();
        json!({"size": self.size, "held": ring.len(), "requests": items})
    }

    pub fn get(&self, id: &str) -> Option<Value> {
        self.lock()
            .iter()
            .rev()
            .find(|e| e.id == id)
            .map(|e| e.doc.clone())
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

    fn rec(id: &str, status: u16, tenant: &str) -> Map<String, Value> {
        let v = json!({"request_id": id, "status": status, "tenant": tenant});
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn the_ring_keeps_the_newest_within_its_size() {
        let j = Journal::new(3);
        for i in 0..10 {
            j.push(rec(&format!("r{i}"), 200, "a"), json!([]), None);
        }
        assert_eq!(j.len(), 3);
        assert!(j.get("r6").is_none());
        assert!(j.get("r9").is_some());
        let list = j.list(&Query::default());
        let ids: Vec<&str> = list["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["request_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["r9", "r8", "r7"]);
    }

    #[test]
    fn filters_by_status_class_and_tenant() {
        let j = Journal::new(10);
        j.push(rec("a", 200, "t1"), json!([]), None);
        j.push(rec("b", 429, "t1"), json!([]), None);
        j.push(rec("c", 503, "t2"), json!([]), None);
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
        j.push(rec("a", 200, "t"), json!([]), None);
        assert!(j.is_empty());
    }
}
