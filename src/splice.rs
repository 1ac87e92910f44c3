//! Changing a JSON request body without re-serialising it: the bytes a caller sent are what
//! reaches the provider (prompt caching matches exact bytes; thinking signatures and unknown
//! fields must survive), except for the one top-level member legate replaces or removes.
//!
//! A small scanner walks only the top level of an object: strings are skipped honouring
//! escapes, nested objects and arrays by bracket depth, whitespace is allowed anywhere JSON
//! allows it. It does not fully validate nested values (the request was validated by the serde
//! pass in `api`), but it never panics and answers `None` on anything it cannot walk.
//!
//! Duplicate top-level keys: parsers disagree on which one wins, so `replace_top_level` and
//! `remove_top_level` act on every occurrence, and `top_level_value_span` reports the last one
//! (what serde_json and most other parsers honour).

use std::fmt::Write as _;
use std::ops::Range;

mod tail;
pub(crate) use tail::{Tail, last_member, value_near_end};

/// One top-level member, as byte positions in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Position of the key's opening quote.
    pub start: usize,
    /// The key's raw bytes between its quotes (escapes not decoded).
    pub key: Range<usize>,
    /// The value's bytes.
    pub value: Range<usize>,
}

/// Walks the members of a top-level JSON object. Iteration stops at the first byte that does
/// not fit; [`Members::is_malformed`] then tells a truncated walk from a complete one.
pub(crate) struct Members<'a> {
    body: &'a [u8],
    pos: usize,
    state: WalkState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WalkState {
    /// Before the opening brace.
    Start,
    /// Expecting a member (`first`: or the closing brace of an empty object).
    Member {
        first: bool,
    },
    Done,
    Malformed,
}

pub(crate) fn top_level_members(body: &[u8]) -> Members<'_> {
    Members {
        body,
        pos: 0,
        state: WalkState::Start,
    }
}

impl Members<'_> {
    /// True when the body turned out not to be a well-formed object (only meaningful once the
    /// iterator has returned `None`).
    pub(crate) fn is_malformed(&self) -> bool {
        self.state != WalkState::Done
    }

    fn step(&mut self) -> Result<Option<Member>, ()> {
        let b = self.body;
        if self.state == WalkState::Start {
            let i = skip_ws(b, 0);
            if b.get(i) != Some(&b'{') {
                return Err(());
            }
            self.pos = i + 1;
            self.state = WalkState::Member { first: true };
        }
        let WalkState::Member { first } = self.state else {
            return Ok(None);
        };
        let start = skip_ws(b, self.pos);
        match b.get(start) {
            Some(b'}') if first => return self.close(start),
            Some(b'"') => {}
            _ => return Err(()),
        }
        let key_end = skip_string(b, start).ok_or(())?;
        let colon = skip_ws(b, key_end);
        if b.get(colon) != Some(&b':') {
            return Err(());
        }
        let value_start = skip_ws(b, colon + 1);
        let value_end = skip_value(b, value_start).ok_or(())?;
        let after = skip_ws(b, value_end);
        match b.get(after) {
            Some(b',') => {
                self.pos = after + 1;
                self.state = WalkState::Member { first: false };
            }
            Some(b'}') => {
                self.close(after)?;
            }
            _ => return Err(()),
        }
        Ok(Some(Member {
            start,
            key: start + 1..key_end - 1,
            value: value_start..value_end,
        }))
    }

    /// The closing brace at `at` ends the object; only whitespace may follow it.
    fn close(&mut self, at: usize) -> Result<Option<Member>, ()> {
        if skip_ws(self.body, at + 1) != self.body.len() {
            return Err(());
        }
        self.state = WalkState::Done;
        Ok(None)
    }
}

impl Iterator for Members<'_> {
    type Item = Member;

    fn next(&mut self) -> Option<Member> {
        match self.step() {
            Ok(m) => m,
            Err(()) => {
                self.state = WalkState::Malformed;
                None
            }
        }
    }
}

pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// `i` is at an opening quote; returns the position just past the closing quote. The search
/// for the next quote or backslash is memchr's vectorised one: message text is most of a
/// request body, so this loop is where a walk spends its time.
#[inline]
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = quote_or_backslash(b, j)?;
        if b[k] == b'"' {
            return Some(k + 1);
        }
        // A backslash escapes the next byte; `\uXXXX` needs no special care since hex digits
        // are never quotes or backslashes.
        j = k + 2;
    }
}

/// The position of the first `"` or `\` at or after `from`: where a key or short string ends
/// (or its first escape is), found as [`skip_string`] finds it.
#[inline]
pub(crate) fn quote_or_backslash(b: &[u8], from: usize) -> Option<usize> {
    let near = b.get(from..)?;
    Some(
        from + match quote_or_backslash_near(near) {
            Some(p) => p,
            None => memchr::memchr2(b'"', b'\\', near)?,
        },
    )
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;
const QUOTES: u64 = ONES * b'"' as u64;
const BACKSLASHES: u64 = ONES * b'\\' as u64;

/// The high bit of every byte of `x` that is `"` or `\`. The lowest flagged byte is always a
/// true one (`(v - 1…1) & !v & 8…8` can only flag bytes above a real zero byte falsely).
#[inline(always)]
fn quote_or_backslash_bits(x: u64) -> u64 {
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    zero(x ^ QUOTES) | zero(x ^ BACKSLASHES)
}

/// The first `"` or `\` among the first 16 bytes of `s`, eight bytes at a time; None when
/// neither is there or `s` is shorter. Most strings of a walk are keys and short values, which
/// end within 16 bytes: this finds their end in a few instructions, where setting up the
/// vectorised search costs about 60.
#[inline(always)]
fn quote_or_backslash_near(s: &[u8]) -> Option<usize> {
    let (Some(lo), Some(hi)) = (
        s.first_chunk::<8>(),
        s.get(8..).and_then(<[u8]>::first_chunk::<8>),
    ) else {
        return None;
    };
    let found = quote_or_backslash_bits(u64::from_le_bytes(*lo));
    if found != 0 {
        return Some(found.trailing_zeros() as usize / 8);
    }
    let found = quote_or_backslash_bits(u64::from_le_bytes(*hi));
    (found != 0).then(|| 8 + found.trailing_zeros() as usize / 8)
}

/// Returns the position just past the value starting at `i`.
pub(crate) fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => skip_nested(b, i),
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let len = b[i..]
                .iter()
                .position(|&c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(b.len() - i);
            Some(i + len)
        }
        _ => None,
    }
}

/// Bytes that matter inside a nested value: quotes start strings, brackets change the depth.
const STRUCTURAL: [bool; 256] = {
    let mut t = [false; 256];
    t[b'"' as usize] = true;
    t[b'{' as usize] = true;
    t[b'}' as usize] = true;
    t[b'[' as usize] = true;
    t[b']' as usize] = true;
    t
};

/// `i` is at `{` or `[`; returns the position just past the matching closer. Only the depth
/// is tracked (no allocation): the kinds of brackets are not checked against each other.
/// Everything between structural bytes (numbers, literals, commas, whitespace) is skipped by
/// a table lookup per byte.
fn skip_nested(b: &[u8], i: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut j = i;
    loop {
        j += b.get(j..)?.iter().position(|&c| STRUCTURAL[c as usize])?;
        match b[j] {
            b'"' => {
                j = skip_string(b, j)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            _ => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
        }
        j += 1;
    }
}

/// Compares a raw (still escaped) JSON key with `key`, decoding escapes on the fly.
pub(crate) fn key_matches(raw: &[u8], key: &str) -> bool {
    // Most keys of a walk are other keys, and their first byte already says so: a raw key that
    // starts with neither `key`'s first byte nor an escape decodes to something else.
    if let (Some(&first), Some(&want)) = (raw.first(), key.as_bytes().first())
        && first != want
        && first != b'\\'
    {
        return false;
    }
    // An escape always decodes to fewer bytes than it takes (`\n` to one, `\u00e9` to two, a
    // surrogate pair's twelve to four): a raw key no longer than `key` matches only when it is
    // `key` itself, unescaped, and only a longer one needs decoding (this runs for every
    // member of every walk).
    if raw.len() <= key.len() {
        return raw == key.as_bytes() && !raw.contains(&b'\\');
    }
    if !raw.contains(&b'\\') {
        return false;
    }
    let mut want = key.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        let mut buf = [0u8; 4];
        let piece: &[u8] = if raw[i] == b'\\' {
            let Some((c, used)) = decode_escape(&raw[i..]) else {
                return false;
            };
            i += used;
            c.encode_utf8(&mut buf).as_bytes()
        } else {
            i += 1;
            &raw[i - 1..i]
        };
        match want.strip_prefix(piece) {
            Some(rest) => want = rest,
            None => return false,
        }
    }
    want.is_empty()
}

/// Decodes the escape at the start of `s` (which begins with a backslash): the character and
/// the number of bytes consumed. Lone surrogates decode to nothing (`None`).
fn decode_escape(s: &[u8]) -> Option<(char, usize)> {
    let c = match *s.get(1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hi = hex4(s.get(2..6)?)?;
            if !(0xD800..0xDC00).contains(&hi) {
                return Some((char::from_u32(hi)?, 6));
            }
            if s.get(6..8)? != b"\\u" {
                return None;
            }
            let lo = hex4(s.get(8..12)?)?;
            if !(0xDC00..0xE000).contains(&lo) {
                return None;
            }
            let c = char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?;
            return Some((c, 12));
        }
        _ => return None,
    };
    Some((c, 2))
}

fn hex4(h: &[u8]) -> Option<u32> {
    h.iter()
        .try_fold(0u32, |acc, &d| Some(acc * 16 + char::from(d).to_digit(16)?))
}

/// Byte range of the VALUE of a top-level key of a JSON object (keys compared after unescaping;
/// with duplicate keys, the last one). None if the key is absent or the body is not an object.
pub fn top_level_value_span(body: &[u8], key: &str) -> Option<Range<usize>> {
    let mut members = top_level_members(body);
    let found = members
        .by_ref()
        .filter(|m| key_matches(&body[m.key.clone()], key))
        .last();
    if members.is_malformed() {
        return None;
    }
    found.map(|m| m.value)
}

/// [`top_level_value_span`] of each of `keys`, in one walk over the object's members. None if
/// the body is not an object.
pub(crate) fn top_level_value_spans<const N: usize>(
    body: &[u8],
    keys: [&str; N],
) -> Option<[Option<Range<usize>>; N]> {
    let mut out = [const { None }; N];
    let mut members = top_level_members(body);
    for m in members.by_ref() {
        let key = &body[m.key.clone()];
        if let Some(k) = keys.iter().position(|k| key_matches(key, k)) {
            out[k] = Some(m.value);
        }
    }
    (!members.is_malformed()).then_some(out)
}

/// Returns a new body with the top-level key's value replaced by `new_json_value` (raw JSON
/// text, e.g. `"\"claude-x\""` or `"8192"`); every other byte identical. None if the key is
/// absent or the body is not an object.
pub fn replace_top_level(body: &[u8], key: &str, new_json_value: &str) -> Option<Vec<u8>> {
    let mut members = top_level_members(body);
    let mut out: Vec<u8> = Vec::new();
    let mut copied = 0;
    let mut found = false;
    for m in members.by_ref() {
        if !key_matches(&body[m.key.clone()], key) {
            continue;
        }
        if !found {
            found = true;
            out.reserve(body.len() + new_json_value.len());
        }
        out.extend_from_slice(&body[copied..m.value.start]);
        out.extend_from_slice(new_json_value.as_bytes());
        copied = m.value.end;
    }
    if members.is_malformed() || !found {
        return None;
    }
    out.extend_from_slice(&body[copied..]);
    Some(out)
}

/// Returns a new body with the member `key: json_value` added after the last member (or into
/// an empty object); every other byte identical. None if the key is already there or the body
/// is not an object.
pub fn insert_top_level(body: &[u8], key: &str, json_value: &str) -> Option<Vec<u8>> {
    let mut members = top_level_members(body);
    let mut last_end = None;
    for m in members.by_ref() {
        if key_matches(&body[m.key.clone()], key) {
            return None;
        }
        last_end = Some(m.value.end);
    }
    if members.is_malformed() {
        return None;
    }
    let member = format!("{}:{json_value}", json_string(key));
    let (at, text) = match last_end {
        Some(end) => (end, format!(",{member}")),
        // Only whitespace precedes the opening brace of a well-formed object.
        None => (body.iter().position(|&b| b == b'{')? + 1, member),
    };
    let mut out = Vec::with_capacity(body.len() + text.len());
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&body[at..]);
    Some(out)
}

/// Removes a top-level member (and exactly one adjoining comma), leaving everything else
/// identical and the result valid JSON. None if the key is absent or the body is not an object.
pub fn remove_top_level(body: &[u8], key: &str) -> Option<Vec<u8>> {
    let cut = removal_range(body, key)?;
    let mut out = Vec::with_capacity(body.len() - cut.len());
    out.extend_from_slice(&body[..cut.start]);
    out.extend_from_slice(&body[cut.end..]);
    // Further occurrences of a duplicated key go too, so no parser can still see one.
    while let Some(cut) = removal_range(&out, key) {
        out.drain(cut);
    }
    Some(out)
}

/// The bytes to cut to remove the first member named `key`: up to the next member's key when
/// one follows (taking the comma after it), else back from the previous member's value (taking
/// the comma before it), else just the member.
fn removal_range(body: &[u8], key: &str) -> Option<Range<usize>> {
    let mut members = top_level_members(body);
    let mut prev_end = None;
    let mut target: Option<Member> = None;
    let mut next_start = None;
    for m in members.by_ref() {
        if target.is_some() {
            next_start.get_or_insert(m.start);
        } else if key_matches(&body[m.key.clone()], key) {
            target = Some(m);
        } else {
            prev_end = Some(m.value.end);
        }
    }
    if members.is_malformed() {
        return None;
    }
    let t = target?;
    Some(match (next_start, prev_end) {
        (Some(next), _) => t.start..next,
        (None, Some(prev)) => prev..t.value.end,
        (None, None) => t.start..t.value.end,
    })
}

/// Encodes a string as a JSON string literal (quotes and escapes).
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    fn s(b: Option<Vec<u8>>) -> Option<String> {
        b.map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    #[test]
    fn several_keys_are_found_in_one_walk_as_one_by_one() {
        let body = br#"{"id":"a","n":{"id":"inner"},"\u0069d":"b","status":"x"}"#;
        let spans = top_level_value_spans(body, ["id", "status", "usage"]).unwrap();
        let one = ["id", "status", "usage"].map(|k| top_level_value_span(body, k));
        assert_eq!(spans, one);
        assert_eq!(&body[spans[0].clone().unwrap()], br#""b""#);
        assert_eq!(spans[2], None);
        assert_eq!(top_level_value_spans(br#"{"id":"a","#, ["id"]), None);
        assert_eq!(top_level_value_spans(b"[]", ["id"]), None);
    }

    #[test]
    fn the_near_search_finds_the_first_quote_or_backslash() {
        let naive = |s: &[u8]| s.iter().take(16).position(|&c| c == b'"' || c == b'\\');
        let bytes = [
            b'a',
            b'"',
            b'\\',
            0x22 ^ 0x80,
            0x5c ^ 0x01,
            0,
            0xff,
            0x21,
            0x23,
        ];
        // Every placement of two bytes among the wanted ones and look-alikes, in strings
        // shorter than, as long as and longer than the 16 bytes looked at.
        for len in [15, 16, 17] {
            for i in 0..len {
                for j in 0..len {
                    for &x in &bytes {
                        for &y in &bytes {
                            let mut s = vec![b'x'; len];
                            s[i] = x;
                            s[j] = y;
                            let want = if len < 16 { None } else { naive(&s) };
                            assert_eq!(quote_or_backslash_near(&s), want, "{s:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn replaces_only_the_top_level_value() {
        let body = br#"{"metadata":{"model":"x"}, "model" : "large","max_tokens":100}"#;
        assert_eq!(
            s(replace_top_level(body, "model", "\"claude-x\"")).as_deref(),
            Some(r#"{"metadata":{"model":"x"}, "model" : "claude-x","max_tokens":100}"#)
        );
        assert_eq!(
            s(replace_top_level(body, "max_tokens", "8192")).as_deref(),
            Some(r#"{"metadata":{"model":"x"}, "model" : "large","max_tokens":8192}"#)
        );
        assert_eq!(replace_top_level(body, "stream", "true"), None);
    }

    #[test]
    fn span_skips_strings_with_escaped_quotes_and_brackets() {
        let body = br#"{"a":"x\"}\\","b":[{"c":"]"}],"k\u0065y":  -1.5e3 }"#;
        let span = top_level_value_span(body, "key");
        assert_eq!(span.map(|r| &body[r]), Some(&b"-1.5e3"[..]));
        let span = top_level_value_span(body, "b");
        assert_eq!(span.map(|r| &body[r]), Some(&br#"[{"c":"]"}]"#[..]));
        assert_eq!(top_level_value_span(body, "c"), None);
    }

    #[test]
    fn removes_member_with_one_comma() {
        let pretty = "{\n  \"a\": 1,\n  \"thinking\": {\"type\": \"enabled\"},\n  \"b\": 2\n}";
        assert_eq!(
            s(remove_top_level(pretty.as_bytes(), "thinking")).as_deref(),
            Some("{\n  \"a\": 1,\n  \"b\": 2\n}")
        );
        assert_eq!(
            s(remove_top_level(pretty.as_bytes(), "b")).as_deref(),
            Some("{\n  \"a\": 1,\n  \"thinking\": {\"type\": \"enabled\"}\n}")
        );
        assert_eq!(
            s(remove_top_level(br#"{ "only": [1,2] }"#, "only")).as_deref(),
            Some("{  }")
        );
        assert_eq!(remove_top_level(br#"{"a":1}"#, "b"), None);
    }

    #[test]
    fn inserts_after_the_last_member() {
        assert_eq!(
            s(insert_top_level(br#"{"a":1, "b" : [2] }"#, "c", "true")).as_deref(),
            Some(r#"{"a":1, "b" : [2],"c":true }"#)
        );
        assert_eq!(
            s(insert_top_level(b" { } ", "c", "{}")).as_deref(),
            Some(r#" {"c":{} } "#)
        );
        assert_eq!(insert_top_level(br#"{"c":1}"#, "c", "2"), None);
        assert_eq!(insert_top_level(br#"{"c":1"#, "d", "2"), None);
        assert_eq!(insert_top_level(b"[]", "d", "2"), None);
    }

    #[test]
    fn duplicate_keys_are_all_replaced_or_removed() {
        let body = br#"{"model":"a","x":1,"model":"b"}"#;
        assert_eq!(
            s(replace_top_level(body, "model", "\"c\"")).as_deref(),
            Some(r#"{"model":"c","x":1,"model":"c"}"#)
        );
        assert_eq!(
            s(remove_top_level(body, "model")).as_deref(),
            Some(r#"{"x":1}"#)
        );
        let last = top_level_value_span(body, "model").map(|r| &body[r]);
        assert_eq!(last, Some(&br#""b""#[..]));
    }

    #[test]
    fn non_objects_and_malformed_bodies_are_refused() {
        for body in [
            &b"[1]"[..],
            b"\"model\"",
            b"",
            b"{\"model\":\"a\"",
            b"{\"model\":\"a\"} x",
            b"{\"model\" \"a\"}",
            b"{\"model\":\"a\",}",
            b"{\"a\":[1,{\"b\":2}}",
            b"{\"model\":\"a\\",
        ] {
            assert_eq!(top_level_value_span(body, "model"), None, "{body:?}");
            assert_eq!(replace_top_level(body, "model", "1"), None, "{body:?}");
            assert_eq!(remove_top_level(body, "model"), None, "{body:?}");
        }
    }

    #[test]
    fn keys_with_escapes_match_their_decoded_form() {
        assert!(key_matches(br"mod\u0065l", "model"));
        // The first byte escaped, or the first character itself.
        assert!(key_matches(br"\u0075sage", "usage"));
        assert!(key_matches(br"\\x", "\\x"));
        assert!(!key_matches(b"input_tokens", "usage"));
        assert!(!key_matches(b"", "usage"));
        assert!(key_matches(b"", ""));
        assert!(key_matches(br#"a\"b\\c\/\n"#, "a\"b\\c/\n"));
        assert!(key_matches(br"\ud83d\ude00", "\u{1F600}"));
        assert!(!key_matches(br"\ud83d", "\u{FFFD}"));
        assert!(!key_matches(br"mod\u0065", "model"));
        assert!(!key_matches(br"model\x", "model"));
        // An escaped key as long as the plain one (or shorter) never matches it.
        assert!(!key_matches(br"\n", "\\n"));
        assert!(!key_matches(br"a\\", "a\\\\"));
        assert!(key_matches(br"a\\", "a\\"));
        assert!(key_matches(b"id", "id"));
        assert!(!key_matches(b"i", "id"));
        assert!(!key_matches(b"idx", "id"));
    }

    #[test]
    fn json_string_escapes_what_json_requires() {
        let cases = [
            "plain",
            "q\"b\\s",
            "nl\n\r\t\u{8}\u{c}",
            "ctl\u{1}\u{1f}",
            "ünï😀",
            "",
        ];
        for case in cases {
            let lit = json_string(case);
            assert_eq!(
                serde_json::from_str::<String>(&lit).ok().as_deref(),
                Some(case)
            );
        }
        assert_eq!(json_string("a\u{1}"), r#""a\u0001""#);
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("model".to_owned()),
            Just("a\"b".to_owned()),
            Just("sl\\ash".to_owned()),
            Just("ü😀".to_owned()),
            "[a-c]{1,2}",
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof!["[^\u{0}]{0,6}", Just("\"}]\\\n\u{1}".to_owned())]
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1000i32..1000).prop_map(|n| json!(f64::from(n) / 4.0)),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((key(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// A top-level object with its members in generated order, how each key is written, and
    /// the whitespace used between tokens.
    #[derive(Debug, Clone)]
    struct Doc {
        members: Vec<(String, Value, bool)>,
        pretty: bool,
        ws: Vec<&'static str>,
    }

    fn doc() -> impl Strategy<Value = Doc> {
        let ws = prop_oneof![Just(""), Just(" "), Just("\n  "), Just("\t"), Just("\r\n")];
        (
            proptest::collection::vec((key(), value(), any::<bool>()), 0..6),
            any::<bool>(),
            proptest::collection::vec(ws, 1..5),
        )
            .prop_map(|(mut members, pretty, ws)| {
                let mut seen = std::collections::HashSet::new();
                members.retain(|(k, _, _)| seen.insert(k.clone()));
                Doc {
                    members,
                    pretty,
                    ws,
                }
            })
    }

    /// Writes a key with every non-ASCII-alphanumeric character as a `\u` escape.
    fn escaped_key(k: &str) -> String {
        let mut out = String::from("\"");
        for unit in k.encode_utf16() {
            match char::from_u32(u32::from(unit)) {
                Some(c) if c.is_ascii_alphanumeric() => out.push(c),
                _ => out.push_str(&format!("\\u{unit:04X}")),
            }
        }
        out + "\""
    }

    fn render(d: &Doc) -> Vec<u8> {
        let mut ws = d.ws.iter().cycle();
        let mut out = String::from("{");
        for (i, (k, v, escape)) in d.members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(ws.next().copied().unwrap_or(""));
            let key = if *escape {
                escaped_key(k)
            } else {
                json_string(k)
            };
            let value = if d.pretty {
                serde_json::to_string_pretty(v)
            } else {
                serde_json::to_string(v)
            };
            out.push_str(&key);
            out.push_str(ws.next().copied().unwrap_or(""));
            out.push(':');
            out.push_str(ws.next().copied().unwrap_or(""));
            out.push_str(&value.unwrap_or_default());
            out.push_str(ws.next().copied().unwrap_or(""));
        }
        out.push('}');
        out.into_bytes()
    }

    fn expected(d: &Doc, skip: Option<usize>, replace: Option<(usize, &Value)>) -> Value {
        let mut map = Map::new();
        for (i, (k, v, _)) in d.members.iter().enumerate() {
            if skip == Some(i) {
                continue;
            }
            let v = match replace {
                Some((j, new)) if j == i => new.clone(),
                _ => v.clone(),
            };
            map.insert(k.clone(), v);
        }
        Value::Object(map)
    }

    fn parse(b: &[u8]) -> Option<Value> {
        serde_json::from_slice(b).ok()
    }

    proptest! {
        #[test]
        fn spans_hold_exactly_each_value(d in doc(), absent in key()) {
            let body = render(&d);
            for (k, v, _) in &d.members {
                let span = top_level_value_span(&body, k);
                prop_assert_eq!(span.and_then(|r| parse(&body[r])), Some(v.clone()));
            }
            if !d.members.iter().any(|(k, _, _)| *k == absent) {
                prop_assert_eq!(top_level_value_span(&body, &absent), None);
            }
        }

        #[test]
        fn replace_changes_only_the_value(d in doc(), pick in any::<usize>(), new in value()) {
            let body = render(&d);
            let new_text = serde_json::to_string(&new).unwrap_or_default();
            if d.members.is_empty() {
                prop_assert_eq!(replace_top_level(&body, "model", &new_text), None);
                return Ok(());
            }
            let i = pick % d.members.len();
            let k = &d.members[i].0;
            let span = top_level_value_span(&body, k).unwrap_or_default();
            let out = replace_top_level(&body, k, &new_text).unwrap_or_default();
            prop_assert_eq!(parse(&out), Some(expected(&d, None, Some((i, &new)))));
            prop_assert_eq!(&out[..span.start], &body[..span.start]);
            prop_assert_eq!(&out[span.start + new_text.len()..], &body[span.end..]);
        }

        #[test]
        fn remove_cuts_one_contiguous_member(d in doc(), pick in any::<usize>()) {
            let body = render(&d);
            if d.members.is_empty() {
                prop_assert_eq!(remove_top_level(&body, "model"), None);
                return Ok(());
            }
            let i = pick % d.members.len();
            let k = &d.members[i].0;
            let span = top_level_value_span(&body, k).unwrap_or_default();
            let out = remove_top_level(&body, k).unwrap_or_default();
            prop_assert_eq!(parse(&out), Some(expected(&d, Some(i), None)));
            // The output is the body with one range taken out, and that range holds the value.
            let prefix = out.iter().zip(&body).take_while(|(a, b)| a == b).count();
            let prefix = prefix.min(span.start);
            let cut = body.len() - out.len();
            prop_assert_eq!(&out[prefix..], &body[prefix + cut..]);
            prop_assert!(prefix + cut >= span.end);
        }
    }
}
