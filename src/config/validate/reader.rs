//! Reading the merged configuration tree by hand: typed scalar conversions that report a
//! problem at its key path instead of stopping, and a table reader that notices unknown keys.
//!
//! Every conversion returns `None` after recording an error, so a caller can fall back to a
//! default and keep going: the goal is to report every problem of a file in one pass.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use config::{Map, Value, ValueKind};

use crate::config::ConfigError;

/// Accumulates problems while the tree is read, and carries the environment that key
/// variables are read from.
pub(crate) struct Cx<'e> {
    errors: Vec<ConfigError>,
    pub env: &'e HashMap<String, String>,
}

impl<'e> Cx<'e> {
    pub(super) fn new(env: &'e HashMap<String, String>) -> Self {
        Self {
            errors: Vec::new(),
            env,
        }
    }

    pub(super) fn err(&mut self, path: &str, message: impl Into<String>) {
        self.errors.push(ConfigError::new(path, message));
    }

    pub(super) fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}

/// A conversion from a raw value at a path to a typed value.
pub(crate) type Conv<T> = fn(&Value, &str, &mut Cx) -> Option<T>;

/// A table being read. Keys asked for are remembered, so [`Table::finish`] can report every
/// other key as unknown and list the keys that are allowed there.
pub(crate) struct Table<'v> {
    path: String,
    map: Option<&'v Map<String, Value>>,
    asked: BTreeSet<String>,
}

impl<'v> Table<'v> {
    /// The table at `path`, or an error if the value is something else.
    pub(super) fn of(value: &'v Value, path: &str, cx: &mut Cx) -> Option<Self> {
        match &value.kind {
            ValueKind::Table(map) => Some(Self::new(path, Some(map))),
            other => {
                cx.err(path, format!("expected a table, found {}", describe(other)));
                None
            }
        }
    }

    /// A table that is absent from the file: every key takes its default.
    pub(super) fn absent(path: &str) -> Self {
        Self::new(path, None)
    }

    fn new(path: &str, map: Option<&'v Map<String, Value>>) -> Self {
        Self {
            path: path.to_owned(),
            map,
            asked: BTreeSet::new(),
        }
    }

    /// The path of a key of this table.
    pub(super) fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The raw value of `key` (marking it as known), with its path.
    pub(super) fn get(&mut self, key: &str) -> Option<(&'v Value, String)> {
        self.asked.insert(key.to_owned());
        let value = self.map?.get(key)?;
        Some((value, self.child(key)))
    }

    /// The sub-table at `key`; an absent key reads as an empty table.
    pub(super) fn table(&mut self, cx: &mut Cx, key: &str) -> Option<Table<'v>> {
        match self.get(key) {
            Some((value, path)) => Table::of(value, &path, cx),
            None => Some(Table::absent(&self.child(key))),
        }
    }

    /// The array at `key` with its path; an absent key reads as an empty array.
    pub(super) fn array(&mut self, cx: &mut Cx, key: &str) -> (&'v [Value], String) {
        let path = self.child(key);
        match self.get(key) {
            Some((value, _)) => match &value.kind {
                ValueKind::Array(items) => (items.as_slice(), path),
                other => {
                    cx.err(
                        &path,
                        format!("expected an array, found {}", describe(other)),
                    );
                    (&[], path)
                }
            },
            None => (&[], path),
        }
    }

    /// An optional key converted by `conv`: `None` when absent or invalid (invalid is reported).
    pub(super) fn opt<T>(&mut self, cx: &mut Cx, key: &str, conv: Conv<T>) -> Option<T> {
        let (value, path) = self.get(key)?;
        conv(value, &path, cx)
    }

    /// A key that must be present.
    pub(super) fn req<T>(&mut self, cx: &mut Cx, key: &str, conv: Conv<T>) -> Option<T> {
        if self.map.is_some_and(|m| m.contains_key(key)) {
            self.opt(cx, key, conv)
        } else {
            self.asked.insert(key.to_owned());
            cx.err(&self.child(key), "missing required key");
            None
        }
    }

    /// The keys present in this table, sorted (the underlying map has no stable order).
    pub(super) fn keys(&self) -> Vec<&'v str> {
        let mut keys: Vec<&str> = self
            .map
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        keys
    }

    /// Reports every key that nothing asked for.
    pub(super) fn finish(self, cx: &mut Cx) {
        let known: Vec<&str> = self.asked.iter().map(String::as_str).collect();
        for key in self.keys() {
            if !self.asked.contains(key) {
                let message = if known.is_empty() {
                    "unknown key".to_owned()
                } else {
                    format!("unknown key (expected one of: {})", known.join(", "))
                };
                cx.err(&self.child(key), message);
            }
        }
    }
}

/// Values set through `LEGATE__…` variables are text, which the config crate turns into
/// numbers or booleans when they look like one. Only those are coerced back; a file value must
/// have the right type. The distinction is the value's origin: the file and built-in defaults
/// are added from strings, which the config crate records with no origin, while the
/// environment source marks its values.
fn from_env(value: &Value) -> bool {
    value.origin().is_some()
}

fn describe(kind: &ValueKind) -> &'static str {
    match kind {
        ValueKind::Nil => "nothing",
        ValueKind::Boolean(_) => "a boolean",
        ValueKind::I64(_) | ValueKind::I128(_) | ValueKind::U64(_) | ValueKind::U128(_) => {
            "an integer"
        }
        ValueKind::Float(_) => "a float",
        ValueKind::String(_) => "a string",
        ValueKind::Table(_) => "a table",
        ValueKind::Array(_) => "an array",
    }
}

fn type_error<T>(cx: &mut Cx, path: &str, want: &str, found: &ValueKind) -> Option<T> {
    cx.err(path, format!("expected {want}, found {}", describe(found)));
    None
}

pub(crate) fn string(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    match &v.kind {
        ValueKind::String(s) => Some(s.clone()),
        ValueKind::Boolean(b) if from_env(v) => Some(b.to_string()),
        ValueKind::I64(n) if from_env(v) => Some(n.to_string()),
        ValueKind::Float(n) if from_env(v) => Some(n.to_string()),
        other => type_error(cx, path, "a string", other),
    }
}

pub(crate) fn non_empty_string(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    let s = string(v, path, cx)?;
    if s.trim().is_empty() {
        cx.err(path, "must not be empty");
        return None;
    }
    Some(s)
}

pub(crate) fn uint(v: &Value, path: &str, cx: &mut Cx) -> Option<u64> {
    let parsed = match &v.kind {
        ValueKind::I64(n) => u64::try_from(*n).map_err(|_| "must not be negative"),
        ValueKind::I128(n) => u64::try_from(*n).map_err(|_| "is out of range"),
        ValueKind::U64(n) => Ok(*n),
        ValueKind::U128(n) => u64::try_from(*n).map_err(|_| "is out of range"),
        ValueKind::String(s) if from_env(v) => s
            .trim()
            .parse::<u64>()
            .map_err(|_| "expected a non-negative integer"),
        other => return type_error(cx, path, "a non-negative integer", other),
    };
    parsed.map_err(|m| cx.err(path, m)).ok()
}

pub(crate) fn positive_uint(v: &Value, path: &str, cx: &mut Cx) -> Option<u64> {
    let n = uint(v, path, cx)?;
    if n == 0 {
        cx.err(path, "must be greater than 0");
        return None;
    }
    Some(n)
}

pub(crate) fn positive_usize(v: &Value, path: &str, cx: &mut Cx) -> Option<usize> {
    let n = positive_uint(v, path, cx)?;
    usize::try_from(n)
        .map_err(|_| cx.err(path, "is too large for this platform"))
        .ok()
}

/// A number in [0, 1] (integers 0 and 1 are accepted too).
pub(crate) fn ratio(v: &Value, path: &str, cx: &mut Cx) -> Option<f64> {
    let x = match &v.kind {
        ValueKind::Float(f) => *f,
        ValueKind::I64(n) => *n as f64,
        ValueKind::U64(n) => *n as f64,
        ValueKind::String(s) if from_env(v) => match s.trim().parse::<f64>() {
            Ok(f) => f,
            Err(_) => return type_error(cx, path, "a number between 0 and 1", &v.kind),
        },
        other => return type_error(cx, path, "a number between 0 and 1", other),
    };
    if !(0.0..=1.0).contains(&x) {
        cx.err(path, format!("`{x}` is not between 0 and 1"));
        return None;
    }
    Some(x)
}

pub(crate) fn boolean(v: &Value, path: &str, cx: &mut Cx) -> Option<bool> {
    match &v.kind {
        ValueKind::Boolean(b) => Some(*b),
        ValueKind::String(s) if from_env(v) => match s.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => type_error(cx, path, "a boolean", &v.kind),
        },
        other => type_error(cx, path, "a boolean", other),
    }
}

/// A humantime duration string: "500ms", "30s", "5m", "1h 30m".
pub(crate) fn duration(v: &Value, path: &str, cx: &mut Cx) -> Option<Duration> {
    let text = match &v.kind {
        ValueKind::String(s) => s,
        ValueKind::I64(_) | ValueKind::U64(_) | ValueKind::Float(_) => {
            cx.err(
                path,
                "durations are strings with a unit, like \"500ms\", \"30s\" or \"5m\"",
            );
            return None;
        }
        other => return type_error(cx, path, "a duration string like \"30s\"", other),
    };
    match humantime::parse_duration(text.trim()) {
        Ok(d) => Some(d),
        Err(e) => {
            cx.err(
                path,
                format!("`{text}` is not a duration ({e}); write e.g. \"500ms\", \"30s\", \"5m\""),
            );
            None
        }
    }
}

pub(crate) fn positive_duration(v: &Value, path: &str, cx: &mut Cx) -> Option<Duration> {
    let d = duration(v, path, cx)?;
    if d.is_zero() {
        cx.err(path, "must be greater than zero");
        return None;
    }
    Some(d)
}

/// An `IP:port` socket address (host names are refused: what a listener binds must not
/// depend on a resolver).
pub(crate) fn socket_addr(v: &Value, path: &str, cx: &mut Cx) -> Option<SocketAddr> {
    let s = string(v, path, cx)?;
    match s.trim().parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            cx.err(
                path,
                format!(
                    "`{s}` is not an IP:port address like \"127.0.0.1:8787\" or \"[::1]:8787\""
                ),
            );
            None
        }
    }
}

/// Lowercase identifiers, as provider and tenant names must be: `[a-z0-9_-]+`.
pub(crate) fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

pub(crate) fn ident(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    let s = string(v, path, cx)?;
    if !is_ident(&s) {
        cx.err(
            path,
            format!("`{s}` is not a lowercase identifier ([a-z0-9_-]+)"),
        );
        return None;
    }
    Some(s)
}

/// Splits a `provider:model` target at the first colon (model names may contain colons, as
/// Ollama's `llama3:8b` does).
pub(crate) fn split_target(s: &str) -> Result<(&str, &str), String> {
    match s.split_once(':') {
        Some((provider, model)) if !provider.is_empty() && !model.trim().is_empty() => {
            Ok((provider, model))
        }
        _ => Err(format!("`{s}` is not of the form \"provider:model\"")),
    }
}
