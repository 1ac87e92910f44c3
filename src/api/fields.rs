//! Reading the few top-level members of a JSON body legate needs, in one validating serde
//! pass that borrows from the bytes and skips everything else (unknown fields included), and
//! the cheap prompt-size estimate. Shared by every dialect's request reader.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::MetaError;
use crate::splice;

/// A member value as legate needs to see it: its JSON type, and the value when it is a scalar
/// legate uses. Deserialising it never fails on a type, so type errors stay typed (`MetaError`).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum Field<'a> {
    #[default]
    Absent,
    Null,
    Bool(bool),
    /// A non-negative integer that fits u64.
    UInt(u64),
    /// Any other number (negative, fractional, too large).
    OtherNumber,
    Str(Cow<'a, str>),
    Array,
    Object,
}

impl<'a> Field<'a> {
    /// A required string.
    pub(crate) fn string(self, name: &'static str) -> Result<Cow<'a, str>, MetaError> {
        match self {
            Field::Str(s) => Ok(s),
            Field::Absent => Err(MetaError::Missing(name)),
            _ => Err(MetaError::WrongType(name)),
        }
    }

    /// A required array (contents not read).
    pub(crate) fn array(self, name: &'static str) -> Result<(), MetaError> {
        match self {
            Field::Array => Ok(()),
            Field::Absent => Err(MetaError::Missing(name)),
            _ => Err(MetaError::WrongType(name)),
        }
    }

    /// A required non-negative integer.
    pub(crate) fn u64(self, name: &'static str) -> Result<u64, MetaError> {
        match self {
            Field::UInt(n) => Ok(n),
            Field::Absent => Err(MetaError::Missing(name)),
            _ => Err(MetaError::WrongType(name)),
        }
    }

    /// An optional non-negative integer; `null` counts as absent.
    pub(crate) fn opt_u64(self, name: &'static str) -> Result<Option<u64>, MetaError> {
        match self {
            Field::UInt(n) => Ok(Some(n)),
            Field::Absent | Field::Null => Ok(None),
            _ => Err(MetaError::WrongType(name)),
        }
    }

    /// An optional boolean, false when absent or `null`.
    pub(crate) fn opt_bool(self, name: &'static str) -> Result<bool, MetaError> {
        match self {
            Field::Bool(b) => Ok(b),
            Field::Absent | Field::Null => Ok(false),
            _ => Err(MetaError::WrongType(name)),
        }
    }
}

impl<'de> Deserialize<'de> for Field<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FieldVisitor)
    }
}

struct FieldVisitor;

impl<'de> Visitor<'de> for FieldVisitor {
    type Value = Field<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Field::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Field::Bool(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Field::UInt(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(v).map_or(Field::OtherNumber, Field::UInt))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Field::OtherNumber)
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Field::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        // Only strings with escapes get here: the unescaped text lives in a scratch buffer.
        Ok(Field::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Object)
    }
}

/// Reads the top-level members named in `keys` from a JSON object in one validating pass;
/// every other member is skipped without allocation. The result is in the order of `keys`.
pub(crate) fn read_fields<'a, const N: usize>(
    body: &'a [u8],
    keys: [&'static str; N],
) -> Result<[Field<'a>; N], MetaError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let outcome = de
        .deserialize_any(TopVisitor { keys })
        .and_then(|outcome| de.end().map(|()| outcome))
        .map_err(|e| MetaError::NotJson(e.to_string()))?;
    match outcome {
        Top::Fields(fields) => Ok(fields),
        Top::Duplicate(key) => Err(MetaError::Duplicate(key)),
        Top::NotObject => Err(MetaError::NotObject),
    }
}

enum Top<'a, const N: usize> {
    Fields([Field<'a>; N]),
    Duplicate(&'static str),
    NotObject,
}

struct TopVisitor<const N: usize> {
    keys: [&'static str; N],
}

impl<'de, const N: usize> Visitor<'de> for TopVisitor<N> {
    type Value = Top<'de, N>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Top::NotObject)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Top::NotObject)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Top::NotObject)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Top::NotObject)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Top::NotObject)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Top::NotObject)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Top::NotObject)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields: [Field<'de>; N] = std::array::from_fn(|_| Field::Absent);
        let mut duplicate = None;
        while let Some(slot) = map.next_key_seed(KeySeed { keys: &self.keys })? {
            let Some(i) = slot else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let value = map.next_value::<Field<'de>>()?;
            if fields[i] == Field::Absent {
                fields[i] = value;
            } else {
                // Keep reading: the rest of the body must still be valid JSON.
                duplicate.get_or_insert(self.keys[i]);
            }
        }
        Ok(duplicate.map_or(Top::Fields(fields), Top::Duplicate))
    }
}

/// Deserialises an object key into the index of the wanted key it equals, without allocating.
struct KeySeed<'k> {
    keys: &'k [&'static str],
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.keys.iter().position(|k| *k == v))
    }
}

/// The members that carry a Messages or Chat Completions prompt.
pub(crate) const PROMPT_KEYS: &[&str] = &["messages", "system", "tools"];

/// One walk over the top level of an already validated body: the input-token estimate (bytes
/// of the `prompt` members' values / 4, rounded up; settled against real usage later) and,
/// when asked for, the value span of one more key.
pub(crate) fn scan_prompt(
    body: &[u8],
    prompt: &[&str],
    also: Option<&str>,
) -> (u64, Option<Range<usize>>) {
    let mut bytes = 0usize;
    let mut span = None;
    for m in splice::top_level_members(body) {
        let key = &body[m.key.clone()];
        if prompt.iter().any(|k| splice::key_matches(key, k)) {
            bytes += m.value.len();
        } else if also.is_some_and(|k| splice::key_matches(key, k)) {
            span = Some(m.value);
        }
    }
    ((bytes as u64).div_ceil(4), span)
}

/// Cheap pre-check before parsing an event for usage: does the text contain a `"usage"` key
/// whose value is an object? An escaped `\"usage\"` inside a string value does not match (the
/// closing quote would be escaped).
pub(crate) fn has_usage_object(data: &str) -> bool {
    data.match_indices("\"usage\"").any(|(at, key)| {
        let rest = data[at + key.len()..].trim_start();
        rest.strip_prefix(':')
            .is_some_and(|v| v.trim_start().starts_with('{'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_wanted_fields_and_ignores_the_rest() {
        let body = br#"{"x":{"model":1},"model":"m\u0031","n":-3,"b":true,"a":[1]}"#;
        let fields = read_fields(body, ["model", "n", "b", "a", "zz"]);
        assert_eq!(
            fields,
            Ok([
                Field::Str(Cow::Owned("m1".into())),
                Field::OtherNumber,
                Field::Bool(true),
                Field::Array,
                Field::Absent,
            ])
        );
    }

    #[test]
    fn refuses_duplicates_of_read_fields_only() {
        let body = br#"{"model":"a","x":1,"x":2,"model":"b"}"#;
        assert_eq!(
            read_fields(body, ["model"]),
            Err(MetaError::Duplicate("model"))
        );
        assert!(read_fields(body, ["x"]).is_err());
        assert!(read_fields(br#"{"x":1,"x":2}"#, ["model"]).is_ok());
    }

    #[test]
    fn non_objects_and_broken_json_are_told_apart() {
        assert_eq!(read_fields(b"[1,2]", ["model"]), Err(MetaError::NotObject));
        assert_eq!(
            read_fields(b" \"s\" ", ["model"]),
            Err(MetaError::NotObject)
        );
        for bad in [&b"{\"model\":"[..], b"{} {}", b"", b"{\"a\":tru}"] {
            assert!(matches!(
                read_fields(bad, ["model"]),
                Err(MetaError::NotJson(_))
            ));
        }
    }

    #[test]
    fn messages_name_the_field_without_echoing_the_body() {
        let secret = "sk-ant-secret-value";
        let body = format!("{{\"model\": \"{secret}");
        let Err(e) = read_fields(body.as_bytes(), ["model"]) else {
            panic!("truncated JSON must be refused");
        };
        let text = e.to_string();
        assert!(
            text.starts_with("the request body is not valid JSON: "),
            "{text}"
        );
        assert!(!text.contains(secret), "{text}");
        assert_eq!(
            MetaError::Missing("max_tokens").to_string(),
            "the request body lacks the required field `max_tokens`"
        );
        assert_eq!(
            MetaError::WrongType("messages").to_string(),
            "the field `messages` must be an array"
        );
    }

    #[test]
    fn estimate_counts_prompt_values_only() {
        let body = br#"{"model":"mmmmmmmmmmmmmmmm","system":"ab","messages":[1,2],"tools":[]}"#;
        // "ab" (4 bytes with quotes) + [1,2] (5) + [] (2) = 11 bytes -> 3 tokens.
        assert_eq!(scan_prompt(body, PROMPT_KEYS, None), (3, None));
        assert_eq!(
            scan_prompt(body, PROMPT_KEYS, Some("model")),
            (3, Some(9..27))
        );
        assert_eq!(scan_prompt(b"{}", PROMPT_KEYS, Some("model")), (0, None));
    }

    #[test]
    fn usage_pre_check_matches_keys_with_object_values_only() {
        assert!(has_usage_object(r#"{"usage":{"a":1}}"#));
        assert!(has_usage_object("{\"usage\" :\n {}}"));
        assert!(!has_usage_object(r#"{"usage":null}"#));
        assert!(!has_usage_object(r#"{"content":"\"usage\":{"}"#));
        assert!(has_usage_object(r#"{"x":"usage","usage":{}}"#));
    }
}
