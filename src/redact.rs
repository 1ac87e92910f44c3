//! Keeping the provider credential out of what reaches the caller (SPEC §14). An upstream that
//! echoes the key it was sent (in an error message, a debug header, a model reply) must not
//! hand it to the agent: every occurrence of the exact key — which covers `Bearer <key>` — is
//! replaced by `[redacted]` in passed-back headers, in bodies legate holds whole, and in bodies
//! forwarded piece by piece, where a key cut in two by the chunking is still found. (A model
//! that spells the key out over several stream events is not caught: each event is forwarded
//! as it comes.)

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

/// The credential of one upstream exchange, to be removed from its answer: the key in use,
/// and the one a key file's rotation replaced (still valid at the provider for a while, and
/// what an answer to a request sent just before the rotation would echo).
#[derive(Clone)]
pub struct Redactor {
    key: Arc<Secret>,
    previous: Option<Arc<Secret>>,
}

impl Redactor {
    /// `None` when there is no key worth searching for.
    pub fn new(key: Option<Arc<Secret>>) -> Option<Self> {
        key.filter(|k| k.expose().len() >= MIN_KEY_LEN)
            .map(|key| Redactor {
                key,
                previous: None,
            })
    }

    /// Also searches for `previous` (a rotated-away key), when there is one worth it.
    pub fn with_previous(mut self, previous: Option<Arc<Secret>>) -> Self {
        self.previous = previous.filter(|k| k.expose().len() >= MIN_KEY_LEN);
        self
    }

    /// The keys' searchers, each built once per key (not per exchange, header value or chunk).
    fn finders(&self) -> impl Iterator<Item = &Finder<'static>> {
        std::iter::once(self.key.finder()).chain(self.previous.as_ref().map(|k| k.finder()))
    }

    /// `hay` with every occurrence of every key replaced, or `None` if it holds none.
    fn replace_all(&self, hay: &[u8]) -> Option<Vec<u8>> {
        let mut cleaned: Option<Vec<u8>> = None;
        for finder in self.finders() {
            if let Some(v) = replace(cleaned.as_deref().unwrap_or(hay), finder) {
                cleaned = Some(v);
            }
        }
        cleaned
    }

    /// `data` with every occurrence of the key replaced (the same bytes when there is none).
    pub fn bytes(&self, data: Bytes) -> Bytes {
        match self.replace_all(&data) {
            Some(v) => Bytes::from(v),
            None => data,
        }
    }

    /// One chunk of a body forwarded piece by piece. A key split across two chunks is found
    /// too: the tail of the output that could be the start of the key is held back in `carry`
    /// and searched again with the next chunk; [`Redactor::flush`] releases it at the end.
    /// The hold is at most the key's length less one byte, so nothing waits for long.
    pub fn chunk(&self, carry: &mut Vec<u8>, data: Bytes) -> Bytes {
        let cleaned: Vec<u8>;
        let out: &[u8] = if carry.is_empty() {
            match self.replace_all(&data) {
                Some(v) => {
                    cleaned = v;
                    &cleaned
                }
                None => &data,
            }
        } else {
            carry.extend_from_slice(&data);
            cleaned = self
                .replace_all(carry)
                .unwrap_or_else(|| std::mem::take(carry));
            carry.clear();
            &cleaned
        };
        let hold = self
            .finders()
            .map(|f| key_prefix_at_end(out, f.needle()))
            .max()
            .unwrap_or(0);
        carry.extend_from_slice(&out[out.len() - hold..]);
        let send = out.len() - hold;
        if std::ptr::eq(out.as_ptr(), data.as_ptr()) {
            return data.slice(..send);
        }
        Bytes::copy_from_slice(&out[..send])
    }

    /// What [`Redactor::chunk`] still holds, once the body has ended (never the whole key).
    pub fn flush(carry: &mut Vec<u8>) -> Option<Bytes> {
        (!carry.is_empty()).then(|| Bytes::from(std::mem::take(carry)))
    }

    /// Replaces the key in every header value; a header whose value cannot be rebuilt is
    /// removed rather than passed on, and so is one whose name holds the key (names are
    /// passed on lower-cased, so it is looked for in any case there: an upstream's
    /// `x-ratelimit-remaining-<key>` would otherwise carry it).
    pub fn headers(&self, headers: &mut HeaderMap) {
        for finder in self.finders() {
            headers_of(finder, headers);
        }
    }
}

/// [`Redactor::headers`] for one key.
fn headers_of(finder: &Finder<'_>, headers: &mut HeaderMap) {
    let key = finder.needle();
    let named: Vec<http::HeaderName> = headers
        .keys()
        .filter(|n| {
            n.as_str().len() >= key.len()
                && n.as_str()
                    .as_bytes()
                    .windows(key.len())
                    .any(|w| w.eq_ignore_ascii_case(key))
        })
        .cloned()
        .collect();
    for name in named {
        headers.remove(&name);
    }
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
                let clean = replace(v.as_bytes(), finder).unwrap_or_else(|| v.as_bytes().into());
                HeaderValue::from_bytes(&clean).ok()
            })
            .collect();
        headers.remove(&name);
        for v in values {
            headers.append(name.clone(), v);
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

/// The length of the longest tail of `out` that is a proper prefix of `key` (0 if none).
fn key_prefix_at_end(out: &[u8], key: &[u8]) -> usize {
    let Some(&first) = key.first() else { return 0 };
    let from = out.len().saturating_sub(key.len() - 1);
    memchr::memchr_iter(first, &out[from..])
        .map(|i| from + i)
        .find(|&start| key.starts_with(&out[start..]))
        .map_or(0, |start| out.len() - start)
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

    /// Every way of cutting a body into two or three chunks still redacts every key in it.
    #[test]
    fn a_key_split_across_chunks_is_redacted() {
        let red = r("sk-secret-1234");
        let body: &[u8] = b"{\"m\":\"sk-secret-1234 and sk-secret-1234\"}sk-s";
        let want: &[u8] = b"{\"m\":\"[redacted] and [redacted]\"}sk-s";
        for a in 0..=body.len() {
            for b in a..=body.len() {
                let mut carry = Vec::new();
                let mut out = Vec::new();
                for part in [&body[..a], &body[a..b], &body[b..]] {
                    let sent = red.chunk(&mut carry, Bytes::copy_from_slice(part));
                    out.extend_from_slice(&sent);
                    assert!(carry.len() < 14, "held {} bytes", carry.len());
                }
                out.extend_from_slice(&Redactor::flush(&mut carry).unwrap_or_default());
                assert_eq!(out, want, "cut at {a} and {b}");
            }
        }
    }

    #[test]
    fn a_rotated_away_key_is_redacted_beside_the_current_one_across_chunks() {
        let red = r("sk-secret-1234")
            .with_previous(Some(Arc::new(Secret::new("sk-before-9876".to_string()))));
        let body: &[u8] = b"{\"m\":\"sk-before-9876 then sk-secret-1234\"}sk-b";
        let want: &[u8] = b"{\"m\":\"[redacted] then [redacted]\"}sk-b";
        assert_eq!(&red.bytes(Bytes::from_static(body))[..], want);
        for a in 0..=body.len() {
            let mut carry = Vec::new();
            let mut out = Vec::new();
            for part in [&body[..a], &body[a..]] {
                out.extend_from_slice(&red.chunk(&mut carry, Bytes::copy_from_slice(part)));
            }
            out.extend_from_slice(&Redactor::flush(&mut carry).unwrap_or_default());
            assert_eq!(out, want, "cut at {a}");
        }
        let mut h = HeaderMap::new();
        h.insert("x-echo", HeaderValue::from_static("Bearer sk-before-9876"));
        red.headers(&mut h);
        assert_eq!(h["x-echo"], "Bearer [redacted]");
    }

    #[test]
    fn a_clean_chunk_is_passed_on_without_a_copy() {
        let red = r("sk-secret-1234");
        let data = Bytes::from_static(b"{\"ok\":true}");
        let mut carry = Vec::new();
        let out = red.chunk(&mut carry, data.clone());
        assert_eq!(out.as_ptr(), data.as_ptr());
        assert!(carry.is_empty());
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
