//! Reading the few top-level members of a JSON body legate needs, in one validating serde
//! pass that borrows from the bytes and skips everything else (unknown fields included), and
//! the cheap prompt-size estimate. Shared by every dialect's request reader.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::LazyLock;

use memchr::memmem;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

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
    read_fields_sized(body, keys, &[]).map(|(fields, _)| fields)
}

/// [`read_fields`], and in the same pass the prompt-size estimate of [`scan_prompt`]: the
/// bytes of the values of the members named in `sized` (every occurrence) / 4, rounded up.
/// One walk over the body instead of two.
pub(crate) fn read_fields_sized<'a, const N: usize>(
    body: &'a [u8],
    keys: [&'static str; N],
    sized: &[&str],
) -> Result<([Field<'a>; N], u64), MetaError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let outcome = de
        .deserialize_any(TopVisitor { keys, sized })
        .and_then(|outcome| de.end().map(|()| outcome))
        .map_err(|e| MetaError::NotJson(e.to_string()))?;
    match outcome {
        Top::Fields(fields, bytes) => Ok((fields, (bytes as u64).div_ceil(4))),
        Top::Duplicate(key) => Err(MetaError::Duplicate(key)),
        Top::NotObject => Err(MetaError::NotObject),
    }
}

enum Top<'a, const N: usize> {
    /// The wanted members, and the bytes of the sized ones' values.
    Fields([Field<'a>; N], usize),
    Duplicate(&'static str),
    NotObject,
}

struct TopVisitor<'s, const N: usize> {
    keys: [&'static str; N],
    sized: &'s [&'s str],
}

impl<'de, const N: usize> Visitor<'de> for TopVisitor<'_, N> {
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
        let mut bytes = 0;
        let seed = || KeySeed {
            keys: &self.keys,
            sized: self.sized,
        };
        while let Some(key) = map.next_key_seed(seed())? {
            let value = match (key.wanted, key.sized) {
                (None, false) => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                (None, true) => {
                    bytes += estimated_bytes(map.next_value::<&'de RawValue>()?.get());
                    continue;
                }
                (Some(_), false) => map.next_value::<Field<'de>>()?,
                (Some(_), true) => {
                    let raw = map.next_value::<&'de RawValue>()?;
                    bytes += estimated_bytes(raw.get());
                    field_of_raw(raw)?
                }
            };
            let Some(i) = key.wanted else { continue };
            if fields[i] == Field::Absent {
                fields[i] = value;
            } else {
                // Keep reading: the rest of the body must still be valid JSON.
                duplicate.get_or_insert(self.keys[i]);
            }
        }
        Ok(duplicate.map_or(Top::Fields(fields, bytes), Top::Duplicate))
    }
}

/// A prompt member's bytes as the estimate counts them: as they are, except that a long run
/// of base64 (an image's or a file's, in an Anthropic `"data": "…"` source or a `data:…;base64,`
/// URL) counts as [`BASE64_RUN_BYTES`]: a provider bills an image by its pixels (about 1,600
/// tokens at most), not by its base64, and a 600 KB image read as text was 150,000 tokens,
/// past a tenant's whole minute. Looked for in values of at least 64 KiB only (a smaller one
/// is counted as it is, a few thousand tokens at most over): a request of ordinary size pays
/// nothing for it. A run must be base64 only and at least 1 KiB, so text under a `"data"` key
/// is counted as text.
fn estimated_bytes(raw: &str) -> usize {
    const LOOKED_FOR_FROM: usize = 64 << 10;
    if raw.len() < LOOKED_FOR_FROM {
        return raw.len();
    }
    static DATA_URL: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b";base64,"));
    static DATA_KEY: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"data\""));
    let bytes = raw.as_bytes();
    let mut counted = bytes.len();
    let mut discount = |start: usize| {
        let run = bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\\'))
            .count();
        // The run must end its string: base64 followed by other text is not an image.
        if run >= 1024 && bytes.get(start + run) == Some(&b'"') {
            counted = counted - run + run.min(BASE64_RUN_BYTES);
        }
    };
    for at in DATA_URL.find_iter(bytes) {
        discount(at + DATA_URL.needle().len());
    }
    for at in DATA_KEY.find_iter(bytes) {
        // `"data"`, a colon and the string's opening quote, with any spaces between.
        let rest = &bytes[at + DATA_KEY.needle().len()..];
        let skip = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_whitespace()).count();
        let mut i = skip(rest);
        if rest.get(i) != Some(&b':') {
            continue;
        }
        i += 1;
        i += skip(&rest[i..]);
        if rest.get(i) == Some(&b'"') {
            discount(at + DATA_KEY.needle().len() + i + 1);
        }
    }
    counted
}

/// What one run of base64 counts for in the estimate: 1,600 tokens, the most an image costs.
const BASE64_RUN_BYTES: usize = 1_600 * 4;

/// A value already read whole (and validated) as raw text, as a [`Field`]: arrays and objects
/// are told by their first byte, without a second walk over them; a scalar is parsed.
fn field_of_raw<'de, E: de::Error>(raw: &'de RawValue) -> Result<Field<'de>, E> {
    match raw.get().as_bytes().first() {
        Some(b'[') => Ok(Field::Array),
        Some(b'{') => Ok(Field::Object),
        _ => serde_json::from_str(raw.get()).map_err(E::custom),
    }
}

/// An object key: the index of the wanted key it equals, and whether its value is sized.
struct Key {
    wanted: Option<usize>,
    sized: bool,
}

/// Deserialises an object key into a [`Key`], without allocating.
struct KeySeed<'k> {
    keys: &'k [&'static str],
    sized: &'k [&'k str],
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Key {
            wanted: self.keys.iter().position(|k| *k == v),
            sized: self.sized.contains(&v),
        })
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
    // Runs on every event of every stream: memchr's vectorised substring search, its
    // searcher built once.
    static KEY: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"usage\""));
    KEY.find_iter(data.as_bytes()).any(|at| {
        let rest = data[at + KEY.needle().len()..].trim_start();
        rest.strip_prefix(':')
            .is_some_and(|v| v.trim_start().starts_with('{'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Base64 runs of images and files count as an image; text under a `data` key, and
    /// members under 64 KiB, count as they are.
    #[test]
    fn base64_runs_count_as_an_image_in_large_members() {
        let b64 = "QUJD".repeat(50_000);
        let anthropic = format!(r#"[{{"source":{{"type":"base64","data": "{b64}"}}}}]"#);
        let url = format!(r#"[{{"image_url":{{"url":"data:image/png;base64,{b64}"}}}}]"#);
        for raw in [&anthropic, &url] {
            assert_eq!(
                estimated_bytes(raw),
                raw.len() - b64.len() + BASE64_RUN_BYTES
            );
        }
        let text = format!(r#"[{{"data":"{}"}}]"#, "words and spaces ".repeat(10_000));
        assert_eq!(estimated_bytes(&text), text.len());
        let small = format!(r#"[{{"data":"{}"}}]"#, "QUJD".repeat(1_000));
        assert_eq!(estimated_bytes(&small), small.len());
    }

    #[test]
    fn the_sized_read_estimates_as_the_prompt_scan_does() {
        let bodies: [&[u8]; 5] = [
            br#"{"model":"m","messages":[{"role":"user","content":"hello there"}]}"#,
            br#" { "system" : "be brief" , "messages" :[ 1, {"a":"}"} ] ,"tools":[],"system":"x"} "#,
            br#"{"mess\u0061ges":["\"quoted\""],"max_tokens":5,"tools":{"k":[1,2]}}"#,
            br#"{"model":"m"}"#,
            br#"{"system":null,"messages":"text","tools":12.5}"#,
        ];
        for body in bodies {
            let (want, _) = scan_prompt(body, PROMPT_KEYS, None);
            let (fields, got) = read_fields_sized(body, ["messages", "model"], PROMPT_KEYS)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got, want, "{}", String::from_utf8_lossy(body));
            assert_eq!(
                fields,
                read_fields(body, ["messages", "model"]).unwrap_or_default()
            );
        }
        let [messages] = read_fields_sized(br#"{"messages":{"a":1}}"#, ["messages"], PROMPT_KEYS)
            .map(|(f, _)| f)
            .unwrap_or_default();
        assert_eq!(messages, Field::Object);
        assert_eq!(
            read_fields_sized(
                br#"{"messages":[],"messages":[1]}"#,
                ["messages"],
                PROMPT_KEYS
            ),
            Err(MetaError::Duplicate("messages"))
        );
        assert!(read_fields_sized(br#"{"system":[1,}"#, ["model"], PROMPT_KEYS).is_err());
    }

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
