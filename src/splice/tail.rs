//! Finding a top-level member by walking back from the end of an object.
//!
//! A provider's answer puts `usage` at or near its end (a Message's last member; a chat
//! completion's before `service_tier` and `system_fingerprint`; a Response's before `user`
//! and `metadata`), after the content that makes up most of the body. Walking the members
//! forward skips all that content to reach it; walking back from the closing brace reaches it
//! after a few short members.
//!
//! Backwards, a string ends at a quote that is not escaped (preceded by an even run of
//! backslashes: outside strings JSON has none) and starts at the previous such quote, since a
//! string holds no unescaped quote. Containers are matched by bracket depth, skipping strings.
//! The first member met from the end is the last of duplicates, as [`super::top_level_value_span`]
//! reports. Unlike the forward walk, the part of the body before the member found is not looked
//! at: a body whose beginning is broken still yields the member at its end.

use std::ops::Range;

use super::key_matches;

/// What the walk back found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    /// The value of the last member with the key.
    Found(Range<usize>),
    /// Every member was walked: the object has no such key.
    Absent,
    /// The walk stopped on bytes it does not take (not an object, or malformed): walk forward.
    Unknown,
}

/// Looks for the top-level `key` of the object `body`, walking back from its closing brace.
pub(crate) fn last_member(body: &[u8], key: &str) -> Tail {
    walk(body, key).unwrap_or(Tail::Unknown)
}

/// The value of the top-level `key` of a provider's answer, looked for from the end, and from
/// the start ([`super::top_level_value_span`]) when the end cannot be walked.
pub(crate) fn value_near_end(body: &[u8], key: &str) -> Option<Range<usize>> {
    match last_member(body, key) {
        Tail::Found(span) => Some(span),
        Tail::Absent => None,
        Tail::Unknown => super::top_level_value_span(body, key),
    }
}

fn walk(b: &[u8], key: &str) -> Option<Tail> {
    let end = ws_back(b, b.len());
    if end == 0 || b[end - 1] != b'}' {
        return None;
    }
    let mut pos = end - 1;
    let mut first = true;
    loop {
        let value_end = ws_back(b, pos);
        if first && value_end > 0 && b[value_end - 1] == b'{' {
            // `{}`: nothing before the brace but whitespace.
            return (ws_back(b, value_end - 1) == 0).then_some(Tail::Absent);
        }
        first = false;
        let value_start = value_start(b, value_end)?;
        let colon = ws_back(b, value_start);
        if colon == 0 || b[colon - 1] != b':' {
            return None;
        }
        let key_end = ws_back(b, colon - 1);
        let key_start = string_start(b, key_end)?;
        let before = ws_back(b, key_start);
        if before == 0 {
            return None;
        }
        let opening = match b[before - 1] {
            b',' => false,
            b'{' if ws_back(b, before - 1) == 0 => true,
            _ => return None,
        };
        if key_matches(&b[key_start + 1..key_end - 1], key) {
            return Some(Tail::Found(value_start..value_end));
        }
        if opening {
            return Some(Tail::Absent);
        }
        pos = before - 1;
    }
}

/// The position before the whitespace that ends at `end`.
fn ws_back(b: &[u8], mut end: usize) -> usize {
    while end > 0 && matches!(b[end - 1], b' ' | b'\t' | b'\n' | b'\r') {
        end -= 1;
    }
    end
}

/// Where the value that ends at `end` starts.
fn value_start(b: &[u8], end: usize) -> Option<usize> {
    match *b.get(end.checked_sub(1)?)? {
        b'"' => string_start(b, end),
        b'}' | b']' => container_start(b, end),
        _ => {
            let start = b[..end]
                .iter()
                .rposition(|c| !matches!(c, b'0'..=b'9' | b'a'..=b'z' | b'+' | b'-' | b'.' | b'E'))
                .map_or(0, |i| i + 1);
            (start < end).then_some(start)
        }
    }
}

/// The opening quote of the string whose closing quote is at `end - 1`.
fn string_start(b: &[u8], end: usize) -> Option<usize> {
    let close = end.checked_sub(1)?;
    if b.get(close) != Some(&b'"') || escaped(b, close) {
        return None;
    }
    let mut i = close;
    loop {
        i = memchr::memrchr(b'"', &b[..i])?;
        if !escaped(b, i) {
            return Some(i);
        }
    }
}

/// Whether the quote at `at` is escaped: preceded by an odd run of backslashes.
fn escaped(b: &[u8], at: usize) -> bool {
    let run = b[..at].iter().rev().take_while(|&&c| c == b'\\').count();
    run % 2 == 1
}

/// The opening bracket of the container whose closing bracket is at `end - 1`.
fn container_start(b: &[u8], end: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = end;
    while i > 0 {
        i -= 1;
        match b[i] {
            b'"' => i = string_start(b, i + 1)?,
            b'}' | b']' => depth += 1,
            b'{' | b'[' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::splice::top_level_value_span;
    use proptest::prelude::*;
    use serde_json::Value;

    fn found<'a>(body: &'a str, key: &str) -> Option<&'a str> {
        match last_member(body.as_bytes(), key) {
            Tail::Found(r) => Some(&body[r]),
            _ => None,
        }
    }

    #[test]
    fn the_last_member_is_reached_from_the_end() {
        let body =
            r#"{"id":"m","content":[{"text":"a \"usage\": {} b\\"}],"usage":{"input_tokens":3}}"#;
        assert_eq!(found(body, "usage"), Some(r#"{"input_tokens":3}"#));
        assert_eq!(found(body, "id"), Some(r#""m""#));
        assert_eq!(last_member(body.as_bytes(), "model"), Tail::Absent);
        // Whitespace anywhere, scalars and literals before it, the last of duplicates.
        let body = "{ \"usage\" : 1 ,\n \"usage\" :\t{ \"a\" : [ 1 , 2.5e-3 ] } , \"x\" : null , \"t\" : true }  ";
        assert_eq!(found(body, "usage"), Some(r#"{ "a" : [ 1 , 2.5e-3 ] }"#));
        assert_eq!(found(body, "x"), Some("null"));
        // An escaped key matches what it decodes to.
        assert_eq!(found(r#"{"us\u0061ge":7,"z":"}"}"#, "usage"), Some("7"));
        assert_eq!(last_member(b"{}", "usage"), Tail::Absent);
        assert_eq!(last_member(b" { } ", "usage"), Tail::Absent);
    }

    #[test]
    fn what_it_cannot_walk_is_left_to_the_forward_walk() {
        for body in [
            "",
            "[1]",
            "\"usage\"",
            r#"{"usage":1"#,
            r#"{"usage" 1}"#,
            r#"{"a":1 "usage":2}"#,
            r#"x{"usage":1}"#,
            r#"{"usage":"a\"}"#,
            r#"{"a":[1,"usage":2]}"#,
            r#"{"usage":1}}"#,
        ] {
            let tail = last_member(body.as_bytes(), "usage");
            assert!(!matches!(tail, Tail::Found(_)), "{body}: {tail:?}");
        }
        // A broken beginning is not looked at.
        assert_eq!(found(r#"{"a":[,"usage":5}"#, "usage"), Some("5"));
    }

    fn value() -> impl Strategy<Value = Value> {
        crate::json_gen::value(key().boxed())
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("usage".to_string()),
            Just("usage\\".to_string()),
            Just("\"usage".to_string()),
            "[a-c\"\\\\]{0,3}",
        ]
    }

    fn render(members: &[(String, Value)], ws: &str, pretty: bool) -> String {
        let mut out = format!("{ws}{{");
        for (i, (k, v)) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let key = serde_json::to_string(k).unwrap();
            let value = if pretty {
                serde_json::to_string_pretty(v)
            } else {
                serde_json::to_string(v)
            };
            out.push_str(&format!("{ws}{key}{ws}:{ws}{}{ws}", value.unwrap()));
        }
        out.push_str(&format!("}}{ws}"));
        out
    }

    proptest! {
        #[test]
        fn it_agrees_with_the_forward_walk(
            members in proptest::collection::vec((key(), value()), 0..6),
            ws in prop_oneof![Just(""), Just(" "), Just("\n  "), Just("\t\r\n")],
            pretty in any::<bool>(),
        ) {
            let body = render(&members, ws, pretty);
            let forward = top_level_value_span(body.as_bytes(), "usage");
            match last_member(body.as_bytes(), "usage") {
                Tail::Found(r) => prop_assert_eq!(Some(r), forward),
                Tail::Absent => prop_assert_eq!(None, forward),
                Tail::Unknown => prop_assert!(false, "a valid object was not walked: {}", body),
            }
        }
    }
}
