//! Reading the merged configuration tree into the serde mirror ([`super::file`]) while keeping
//! every problem, each at its key path.
//!
//! serde stops at the first error. An operator wants all of them at once, so [`read_all`] reads
//! the tree, records the first problem with its path, takes the offending value out of the tree
//! (a key is removed, so its default applies; an array element becomes an empty table, so the
//! indices of the others stay put) and reads again, until the tree reads. The paths taken out
//! are returned too, so that validation does not report a second problem under them.
//!
//! Messages never quote a string value: a key pasted into the wrong field must not be printed
//! back. They say where the problem is and what was expected.

use std::fmt;

use config::{Map, Value, ValueKind};
use serde::de::{self, DeserializeOwned, DeserializeSeed, Expected, Unexpected, Visitor};

use super::ConfigError;

/// A problem count beyond which reading stops: each pass removes one value, so this also
/// bounds the passes.
const MAX_PROBLEMS: usize = 200;

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

type Path = Vec<Seg>;

/// `server.listen`, `models[1].chain[0]`.
fn show(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            // A key name is the operator's text: a key pasted there is not shown.
            Seg::Key(k) if out.is_empty() => out.push_str(&super::shown::shown(k)),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(&super::shown::shown(k));
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn child(path: &[Seg], seg: Seg) -> Path {
    let mut p = path.to_vec();
    p.push(seg);
    p
}

/// A problem found while reading, located once the reader that met it returns.
#[derive(Debug)]
pub(crate) struct Error {
    path: Option<Path>,
    message: String,
}

impl Error {
    fn at(mut self, path: &[Seg]) -> Self {
        if self.path.is_none() {
            self.path = Some(path.to_vec());
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// What a value was, without its content.
fn kind(unexp: &Unexpected) -> String {
    match unexp {
        Unexpected::Bool(_) => "a boolean".into(),
        Unexpected::Unsigned(n) => format!("the integer {n}"),
        Unexpected::Signed(n) => format!("the integer {n}"),
        Unexpected::Float(x) => format!("the number {x}"),
        Unexpected::Char(_) | Unexpected::Str(_) => "a string".into(),
        Unexpected::Bytes(_) => "bytes".into(),
        Unexpected::Unit => "nothing".into(),
        Unexpected::Seq => "an array".into(),
        Unexpected::Map => "a table".into(),
        other => other.to_string(),
    }
}

/// serde's names for what a visitor wants, in the words of a TOML file.
fn wanted(exp: &dyn Expected) -> String {
    let exp = exp.to_string();
    match exp.as_str() {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".into(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".into(),
        "f32" | "f64" => "a number".into(),
        "a sequence" => "an array".into(),
        "a map" => "a table".into(),
        "a string" | "a boolean" => exp,
        e if e.starts_with("struct ") || e.starts_with("a map") => "a table".into(),
        _ => exp,
    }
}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error {
            path: None,
            message: msg.to_string(),
        }
    }

    fn invalid_type(unexp: Unexpected, exp: &dyn Expected) -> Self {
        Self::custom(format!("expected {}, found {}", wanted(exp), kind(&unexp)))
    }

    fn invalid_value(unexp: Unexpected, exp: &dyn Expected) -> Self {
        let want = wanted(exp);
        if want.starts_with("a nonzero") {
            return Self::custom("must be greater than 0");
        }
        Self::custom(format!("expected {want}, found {}", kind(&unexp)))
    }

    fn unknown_variant(_variant: &str, expected: &'static [&'static str]) -> Self {
        Self::custom(format!("expected one of: {}", expected.join(", ")))
    }

    fn unknown_field(_field: &str, expected: &'static [&'static str]) -> Self {
        if expected.is_empty() {
            Self::custom("unknown key")
        } else {
            Self::custom(format!(
                "unknown key (expected one of: {})",
                expected.join(", ")
            ))
        }
    }

    fn missing_field(field: &'static str) -> Self {
        Self::custom(format!("missing required key `{field}`"))
    }
}

/// Reads `root` as `T`, reporting every problem. Returns the value read once the problems were
/// taken out (`None` if the root itself is unusable), the problems, and the paths taken out.
pub(crate) fn read_all<T: DeserializeOwned>(
    root: &Value,
) -> (Option<T>, Vec<ConfigError>, Vec<String>) {
    let mut tree = root.clone();
    let mut errors = Vec::new();
    let mut failed = Vec::new();
    for _ in 0..MAX_PROBLEMS {
        let err = match T::deserialize(ValueDe::new(&tree, Vec::new())) {
            Ok(value) => return (Some(value), errors, failed),
            Err(e) => e,
        };
        let path = err.path.unwrap_or_default();
        let shown = show(&path);
        errors.push(ConfigError::new(shown.clone(), err.message));
        failed.push(shown);
        if !take_out(&mut tree, &path) {
            break;
        }
    }
    (None, errors, failed)
}

/// Removes the value at `path` (a key) or blanks it (an array element). False when nothing
/// could be taken out, so reading again would fail the same way.
fn take_out(tree: &mut Value, path: &[Seg]) -> bool {
    let Some((last, parent)) = path.split_last() else {
        return false;
    };
    let mut node = tree;
    for seg in parent {
        let next = match (seg, &mut node.kind) {
            (Seg::Key(k), ValueKind::Table(m)) => m.get_mut(k),
            (Seg::Index(i), ValueKind::Array(a)) => a.get_mut(*i),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return false,
        }
    }
    match (last, &mut node.kind) {
        (Seg::Key(k), ValueKind::Table(m)) => m.remove(k).is_some(),
        (Seg::Index(i), ValueKind::Array(a)) => match a.get_mut(*i) {
            Some(v) if !matches!(&v.kind, ValueKind::Table(m) if m.is_empty()) => {
                *v = Value::new(None, ValueKind::Table(Map::new()));
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// A value of the tree and where it sits.
struct ValueDe<'a> {
    value: &'a Value,
    path: Path,
}

impl<'a> ValueDe<'a> {
    fn new(value: &'a Value, path: Path) -> Self {
        Self { value, path }
    }

    /// Values from `LEGATE__…` variables are text that the config crate turned into numbers or
    /// booleans when they looked like one; only those are coerced. A file value must have the
    /// right type. The environment source marks its values with an origin; file text does not.
    fn is_env(&self) -> bool {
        self.value.origin().is_some()
    }

    fn unexpected(&self) -> Unexpected<'a> {
        match &self.value.kind {
            ValueKind::Nil => Unexpected::Unit,
            ValueKind::Boolean(b) => Unexpected::Bool(*b),
            ValueKind::I64(n) => Unexpected::Signed(*n),
            ValueKind::I128(_) | ValueKind::U128(_) => Unexpected::Other("a large integer"),
            ValueKind::U64(n) => Unexpected::Unsigned(*n),
            ValueKind::Float(x) => Unexpected::Float(*x),
            ValueKind::String(s) => Unexpected::Str(s),
            ValueKind::Table(_) => Unexpected::Map,
            ValueKind::Array(_) => Unexpected::Seq,
        }
    }

    fn any<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match &self.value.kind {
            ValueKind::Nil => v.visit_unit(),
            ValueKind::Boolean(b) => v.visit_bool(*b),
            ValueKind::I64(n) => v.visit_i64(*n),
            ValueKind::I128(n) => v.visit_i128(*n),
            ValueKind::U64(n) => v.visit_u64(*n),
            ValueKind::U128(n) => v.visit_u128(*n),
            ValueKind::Float(x) => v.visit_f64(*x),
            ValueKind::String(s) => v.visit_str(s),
            ValueKind::Table(m) => v.visit_map(MapDe::new(m, self.path)),
            ValueKind::Array(a) => v.visit_seq(SeqDe {
                items: a.iter().enumerate(),
                path: self.path,
            }),
        }
    }

    /// A table or an array wanted (`is`: the value is one); anything else is refused with what
    /// it is.
    fn container<'de, V: Visitor<'de>>(
        self,
        is: bool,
        what: &str,
        v: V,
    ) -> Result<V::Value, Error> {
        let path = self.path.clone();
        let r = if is {
            self.any(v)
        } else {
            Err(de::Error::custom(format!(
                "expected {what}, found {}",
                kind(&self.unexpected())
            )))
        };
        r.map_err(|e| e.at(&path))
    }

    /// A number wanted: an environment string is parsed first.
    fn number<'de, V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match &self.value.kind {
            ValueKind::String(s) if self.is_env() => {
                let t = s.trim();
                if let Ok(n) = t.parse::<u64>() {
                    v.visit_u64(n)
                } else if let Ok(n) = t.parse::<i64>() {
                    v.visit_i64(n)
                } else if let Ok(x) = t.parse::<f64>() {
                    v.visit_f64(x)
                } else {
                    Err(de::Error::invalid_type(self.unexpected(), &v))
                }
            }
            _ => self.any(v),
        }
    }
}

macro_rules! numbers {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
            let path = self.path.clone();
            self.number(v).map_err(|e| e.at(&path))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for ValueDe<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let path = self.path.clone();
        self.any(v).map_err(|e| e.at(&path))
    }

    numbers!(deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_f32 deserialize_f64);

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let path = self.path.clone();
        let r = match &self.value.kind {
            ValueKind::String(s) if self.is_env() => match s.trim() {
                "true" => v.visit_bool(true),
                "false" => v.visit_bool(false),
                _ => Err(de::Error::invalid_type(self.unexpected(), &v)),
            },
            _ => self.any(v),
        };
        r.map_err(|e| e.at(&path))
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let path = self.path.clone();
        let r = match &self.value.kind {
            ValueKind::Boolean(b) if self.is_env() => v.visit_string(b.to_string()),
            ValueKind::I64(n) if self.is_env() => v.visit_string(n.to_string()),
            ValueKind::U64(n) if self.is_env() => v.visit_string(n.to_string()),
            ValueKind::Float(x) if self.is_env() => v.visit_string(x.to_string()),
            _ => self.any(v),
        };
        r.map_err(|e| e.at(&path))
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_str(v)
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let path = self.path.clone();
        let r = match &self.value.kind {
            ValueKind::Nil => v.visit_none(),
            _ => v.visit_some(self),
        };
        r.map_err(|e| e.at(&path))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let is = matches!(self.value.kind, ValueKind::Table(_));
        self.container(is, "a table", v)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let is = matches!(self.value.kind, ValueKind::Array(_));
        self.container(is, "an array", v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let path = self.path.clone();
        let r = match &self.value.kind {
            ValueKind::String(s) => v.visit_enum(UnitVariant {
                name: s,
                path: &path,
            }),
            _ => Err(de::Error::invalid_type(self.unexpected(), &v)),
        };
        r.map_err(|e| e.at(&path))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        char bytes byte_buf unit unit_struct tuple tuple_struct identifier
    }
}

/// The entries of a table, in key order (the underlying map has none).
struct MapDe<'a> {
    entries: std::vec::IntoIter<(&'a String, &'a Value)>,
    pending: Option<(&'a String, &'a Value)>,
    path: Path,
}

impl<'a> MapDe<'a> {
    fn new(map: &'a Map<String, Value>, path: Path) -> Self {
        let mut entries: Vec<_> = map.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        Self {
            entries: entries.into_iter(),
            pending: None,
            path,
        }
    }
}

impl<'de> de::MapAccess<'de> for MapDe<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.pending = Some((key, value));
        let path = child(&self.path, Seg::Key(key.clone()));
        seed.deserialize(KeyDe { key, path: &path })
            .map(Some)
            .map_err(|e| e.at(&path))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let Some((key, value)) = self.pending.take() else {
            return Err(de::Error::custom("a value was asked for before its key"));
        };
        // An adapter's own check fails after its reader returned: locate it here.
        let path = child(&self.path, Seg::Key(key.clone()));
        seed.deserialize(ValueDe::new(value, path.clone()))
            .map_err(|e| e.at(&path))
    }
}

struct SeqDe<'a> {
    items: std::iter::Enumerate<std::slice::Iter<'a, Value>>,
    path: Path,
}

impl<'de> de::SeqAccess<'de> for SeqDe<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.items.next() {
            Some((i, value)) => {
                let path = child(&self.path, Seg::Index(i));
                seed.deserialize(ValueDe::new(value, path.clone()))
                    .map(Some)
                    .map_err(|e| e.at(&path))
            }
            None => Ok(None),
        }
    }
}

/// A table key, as a field name or a map key.
struct KeyDe<'a> {
    key: &'a str,
    path: &'a [Seg],
}

impl<'de> de::Deserializer<'de> for KeyDe<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_str(self.key).map_err(|e: Error| e.at(self.path))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// A string naming a unit variant of an enum (`kind = "openai"`).
struct UnitVariant<'a> {
    name: &'a str,
    path: &'a [Seg],
}

impl<'de, 'a> de::EnumAccess<'de> for UnitVariant<'a> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let value = seed.deserialize(KeyDe {
            key: self.name,
            path: self.path,
        })?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant<'_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value, Error> {
        Err(de::Error::custom("expected a table"))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _v: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("expected an array"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _v: V,
    ) -> Result<V::Value, Error> {
        Err(de::Error::custom("expected a table"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_shown_as_in_messages() {
        let p = vec![
            Seg::Key("models".into()),
            Seg::Index(1),
            Seg::Key("chain".into()),
            Seg::Index(0),
        ];
        assert_eq!(show(&p), "models[1].chain[0]");
        assert_eq!(show(&[]), "");
    }
}
