//! Keeping the provider credential out of what reaches the caller (SPEC §14). An upstream that
//! echoes the key it was sent (in an error message, a debug header, a model reply) must not
//! hand it to the agent: every occurrence of the exact key — which covers `Bearer <key>` — is
//! replaced by `[redacted]` in passed-back headers, in bodies legate holds whole, and in each
//! forwarded chunk of a streamed body (for event streams a chunk is whole events).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use memchr::memmem::Finder;

use crate::config::Secret;

/// What replaces the key.
pub const REDACTED: &[u8] = b"[redacted]";

/// Keys shorter than this are not searched for: replacing a two-letter "key" everywhere would
/// mangle every answer, and no provider issues keys that short.
const MIN_KEY_LEN: usize = 8;

/// The credential of one upstream exchange, to be removed from its answer.
#[derive(Clone)]
pub struct Redactor {
    key: Arc<Secret>,
}

impl Redactor {
    /// `None` when there is no key worth searching for.
    pub fn new(key: Option<Arc<Secret>>) -> Option<Self> {
        key.filter(|k| k.expose().len() >= MIN_KEY_LEN)
            .map(|key| Redactor { key })
    }

    /// The key's searcher, built once per key (not per exchange, header value or chunk).
    fn finder(&self) -> &Finder<'static> {
        self.key.finder()
    }

    /// `data` with every occurrence of the key replaced (the same bytes when there is none).
    pub fn bytes(&self, data: Bytes) -> Bytes {
        match replace(&data, self.finder()) {
            Some(v) => Bytes::from(v),
            None => data,
        }
    }

    /// Replaces the key in every header value; a header whose value cannot be rebuilt is
    /// removed rather than passed on.
    pub fn headers(&self, headers: &mut HeaderMap) {
        let finder = self.finder();
        let mut tainted = Vec::new();
        for (name, value) in headers.iter() {
            if finder.find(value.as_bytes()).is_some() {
                tainted.push(name.clone());
            }
        }
        for name in tainted {
            let values: Vec<HeaderValue> = headers
                .get_all(&name)
                .iter()
                .filter_map(|v| {
                    let clean =
                        replace(v.as_bytes(), finder).unwrap_or_else(|| v.as_bytes().into());
                    HeaderValue::from_bytes(&clean).ok()
                })
                .collect();
            headers.remove(&name);
            for v in values {
                headers.append(name.clone(), v);
            }
        }
    }
}

/// `hay` with every occurrence of `finder`'s needle replaced by [`REDACTED`], or `None` if it
/// holds none.
fn replace(hay: &[u8], finder: &Finder<'_>) -> Option<Vec<u8>> {
    let needle = finder.needle();
    let mut found = finder.find_iter(hay).peekable();
    found.peek()?;
    let mut out = Vec::with_capacity(hay.len());
    let mut at = 0;
    for i in found {
        if i < at {
            continue;
        }
        out.extend_from_slice(&hay[at..i]);
        out.extend_from_slice(REDACTED);
        at = i + needle.len();
    }
    out.extend_from_slice(&hay[at..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(key: &str) -> Redactor {
        Redactor::new(Some(Arc::new(Secret::new(key.to_string())))).unwrap_or_else(|| {
            panic!("key long enough");
        })
    }

    #[test]
    fn every_occurrence_is_replaced_and_clean_bytes_are_untouched() {
        let red = r("sk-secret-1234");
        let out = red.bytes(Bytes::from_static(
            b"{\"m\":\"bad key sk-secret-1234, Bearer sk-secret-1234\"}sk-secret-1234",
        ));
        assert_eq!(
            &out[..],
            b"{\"m\":\"bad key [redacted], Bearer [redacted]\"}[redacted]"
        );
        let clean = Bytes::from_static(b"nothing here");
        assert_eq!(red.bytes(clean.clone()), clean);
    }

    #[test]
    fn header_values_are_cleaned_and_short_keys_are_ignored() {
        let red = r("sk-secret-1234");
        let mut h = HeaderMap::new();
        h.insert("x-echo", HeaderValue::from_static("Bearer sk-secret-1234"));
        h.append("x-other", HeaderValue::from_static("fine"));
        red.headers(&mut h);
        assert_eq!(h["x-echo"], "Bearer [redacted]");
        assert_eq!(h["x-other"], "fine");
        assert!(Redactor::new(Some(Arc::new(Secret::new("short".into())))).is_none());
    }
}
