//! Reading small objects of counts (the providers' `usage`) without serde.
//!
//! serde's derived reader spends about 2,000 instructions on a usage object of a few members
//! (every key decoded and matched, every value through its visitor); this one compares raw
//! keys and reads digits in place. It takes only what it reads exactly as serde would and
//! answers `None` for anything else, for serde to decode: a key with an escape, a wanted key
//! twice (serde refuses a duplicate field), a wanted value that is not `null` or a plain
//! unsigned integer. Members it does not want are skipped as the body walks skip them (bracket
//! depth, strings by their quotes), not validated.

use std::ops::Range;

use crate::splice::{quote_or_backslash, skip_value, skip_ws};

/// The members named in `keys` of the object `obj`, each `null` or absent (None) or a count.
pub(crate) fn counts<const N: usize>(obj: &[u8], keys: [&str; N]) -> Option<[Option<u64>; N]> {
    let spans = members(obj, keys)?;
    let mut out = [None; N];
    for (o, span) in out.iter_mut().zip(spans) {
        if let Some(span) = span {
            *o = count(&obj[span])?;
        }
    }
    Some(out)
}

/// Where the values of the members named in `keys` lie in the object `obj` (None: absent),
/// for a caller that reads a nested object or tells `null` from absent. The same rules as
/// [`counts`]: None for a key with an escape, a wanted key twice, or anything but an object.
pub(crate) fn members<const N: usize>(
    obj: &[u8],
    keys: [&str; N],
) -> Option<[Option<Range<usize>>; N]> {
    let mut out = [const { None }; N];
    let mut i = skip_ws(obj, 0);
    if obj.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(obj, i + 1);
    if obj.get(i) == Some(&b'}') {
        return (skip_ws(obj, i + 1) == obj.len()).then_some(out);
    }
    loop {
        if obj.get(i) != Some(&b'"') {
            return None;
        }
        let key_start = i + 1;
        let key_end = quote_or_backslash(obj, key_start)?;
        if obj[key_end] != b'"' {
            return None;
        }
        let key = &obj[key_start..key_end];
        i = skip_ws(obj, key_end + 1);
        if obj.get(i) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(obj, i + 1);
        let value_end = skip_value(obj, value_start)?;
        if let Some(k) = keys.iter().position(|k| k.as_bytes() == key)
            && out[k].replace(value_start..value_end).is_some()
        {
            return None;
        }
        i = skip_ws(obj, value_end);
        match obj.get(i) {
            Some(b',') => i = skip_ws(obj, i + 1),
            Some(b'}') => return (skip_ws(obj, i + 1) == obj.len()).then_some(out),
            _ => return None,
        }
    }
}

/// A count that serde reads into a plain `u64` with `#[serde(default)]`: absent is 0, a count
/// is itself; None for `null` (which serde refuses) or anything [`count`] does not take.
pub(crate) fn required(obj: &[u8], span: Option<Range<usize>>) -> Option<u64> {
    match span {
        None => Some(0),
        Some(span) => count(&obj[span])?,
    }
}

/// Whether a member's value, as [`members`] found it, is absent or `null`.
pub(crate) fn absent_or_null(obj: &[u8], span: &Option<Range<usize>>) -> bool {
    span.as_ref().is_none_or(|s| &obj[s.clone()] == b"null")
}

/// `null` (Some(None)) or an unsigned integer without sign, fraction, exponent or leading zero
/// that fits a u64 (Some(Some(n))); None for anything else.
pub(crate) fn count(v: &[u8]) -> Option<Option<u64>> {
    if v == b"null" {
        return Some(None);
    }
    if v.is_empty() || (v.len() > 1 && v[0] == b'0') {
        return None;
    }
    let mut n: u64 = 0;
    for &d in v {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(Some(n))
}

/// Test-only: JSON objects of the shape the readers built on this module meet, with the
/// values serde and they may disagree on (null, signs, fractions, strings, leading zeros,
/// escaped keys, nested objects), for property tests against serde.
#[cfg(test)]
pub(crate) mod shapes {
    use proptest::prelude::*;

    /// A value: a count or one of the values a count reader must refuse or leave to serde.
    fn scalar() -> BoxedStrategy<String> {
        prop_oneof![
            4 => any::<u64>().prop_map(|n| n.to_string()),
            2 => (0u64..100).prop_map(|n| n.to_string()),
            1 => Just("null".to_string()),
            1 => Just("-3".to_string()),
            1 => Just("2.5".to_string()),
            1 => Just("\"7\"".to_string()),
            1 => Just("{\"a\":[1,\"}\\\"\"]}".to_string()),
            1 => (0u64..10).prop_map(|n| format!("0{n}")),
        ]
        .boxed()
    }

    fn members(keys: Vec<&'static str>, value: BoxedStrategy<String>) -> BoxedStrategy<String> {
        let key = proptest::sample::select(keys);
        let ws = prop_oneof![Just(""), Just(" "), Just("\n\t")];
        let member = (key, value, ws).prop_map(|(k, v, ws)| format!("{ws}\"{k}\"{ws}:{ws}{v}{ws}"));
        proptest::collection::vec(member, 0..6)
            .prop_map(|m| format!("{{{}}}", m.join(",")))
            .boxed()
    }

    /// Whether `in_place`, where it takes `obj` and `obj` is valid JSON, reads what serde reads
    /// (compared through `to`). Members a reader does not want are not validated, so the claim
    /// is for valid JSON; where `in_place` declines, serde decides and there is nothing to compare.
    pub(crate) fn reads_as_serde<R: serde::de::DeserializeOwned, U: PartialEq>(
        obj: &str,
        in_place: impl Fn(&[u8]) -> Option<R>,
        to: impl Fn(&R) -> U,
    ) -> bool {
        let Some(fast) = in_place(obj.as_bytes()) else {
            return true;
        };
        if serde_json::from_str::<serde_json::Value>(obj).is_err() {
            return true;
        }
        let by_serde: Option<R> = crate::usage::decode(obj.as_bytes(), |_| None);
        by_serde.map(|r| to(&r)) == Some(to(&fast))
    }

    /// An object whose members are drawn from `keys` (plus an unknown and an escaped one);
    /// the member named `nested`, when there is one, may hold an object drawn from `inner`.
    pub(crate) fn object(
        keys: &[&'static str],
        nested: &'static str,
        inner: &[&'static str],
    ) -> BoxedStrategy<String> {
        let with_extra = |ks: &[&'static str]| {
            let mut v = ks.to_vec();
            v.extend(["other", "input_\\u0074okens"]);
            v
        };
        let inner_obj = members(with_extra(inner), scalar());
        let value = prop_oneof![3 => scalar(), 2 => inner_obj].boxed();
        let mut keys = with_extra(keys);
        keys.push(nested);
        members(keys, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    const KEYS: [&str; 3] = ["input_tokens", "output_tokens", "cache_read_input_tokens"];

    #[derive(Deserialize)]
    struct Three {
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        cache_read_input_tokens: Option<u64>,
    }

    fn by_serde(obj: &str) -> Option<[Option<u64>; 3]> {
        let t: Three = serde_json::from_str(obj).ok()?;
        Some([t.input_tokens, t.output_tokens, t.cache_read_input_tokens])
    }

    #[test]
    fn counts_are_read_in_place_and_the_rest_left_to_serde() {
        let obj = r#"{ "input_tokens" : 12, "cache_creation": {"a": [1, "}"]},
            "output_tokens":0,"service_tier":"standard","cache_read_input_tokens":null }"#;
        assert_eq!(
            counts(obj.as_bytes(), KEYS),
            Some([Some(12), Some(0), None])
        );
        assert_eq!(counts(b"{}", KEYS), Some([None; 3]));
        let max = br#"{"output_tokens":18446744073709551615}"#;
        assert_eq!(counts(max, KEYS).map(|c| c[1]), Some(Some(u64::MAX)));
        for obj in [
            r#"{"input_tokens":1,"input_tokens":2}"#,
            r#"{"input_tokens":-1}"#,
            r#"{"input_tokens":1.0}"#,
            r#"{"input_tokens":1e3}"#,
            r#"{"input_tokens":01}"#,
            r#"{"input_tokens":"1"}"#,
            r#"{"input_tokens":18446744073709551616}"#,
            r#"{"input_\u0074okens":1}"#,
            r#"{"input_tokens":1"#,
            r#"{"input_tokens":1}x"#,
            r#"{"input_tokens" 1}"#,
            r#"[1]"#,
            "",
        ] {
            assert_eq!(counts(obj.as_bytes(), KEYS), None, "{obj}");
        }
    }

    fn member() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("input_tokens"),
            Just("output_tokens"),
            Just("cache_read_input_tokens"),
            Just("other"),
            Just("input_\\u0074okens"),
        ];
        let value = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            Just("null".to_string()),
            Just("-3".to_string()),
            Just("2.5".to_string()),
            Just("\"7\"".to_string()),
            Just("{\"a\":[1,\"}\\\"\"]}".to_string()),
            (0u64..10).prop_map(|n| format!("0{n}")),
        ];
        let ws = prop_oneof![Just(""), Just(" "), Just("\n\t")];
        (key, value, ws).prop_map(|(k, v, ws)| format!("{ws}\"{k}\"{ws}:{ws}{v}{ws}"))
    }

    proptest! {
        #[test]
        fn what_it_reads_serde_reads_alike(members in proptest::collection::vec(member(), 0..6)) {
            let obj = format!("{{{}}}", members.join(","));
            let fast = counts(obj.as_bytes(), KEYS);
            // Members it does not want are not validated: the claim is for valid JSON.
            let valid = serde_json::from_str::<serde_json::Value>(&obj).is_ok();
            if fast.is_some() && valid {
                prop_assert_eq!(fast, by_serde(&obj), "{}", obj);
            }
        }
    }
}
