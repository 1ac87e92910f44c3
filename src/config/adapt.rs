//! serde adapters for the value syntaxes of the configuration: humantime durations (at most one
//! year), positive numbers, shares, exact USD decimals, socket addresses, and URLs whose
//! credentials are masked when shown. Each one's error message says what was expected and never
//! repeats the value (it may be a key pasted into the wrong place).

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// The longest duration accepted (humantime's year, 365.25 days): beyond it a deadline added to
/// the clock could overflow, and no timeout of a proxy is meant to be that long.
pub const MAX_DURATION: Duration = Duration::from_secs(31_557_600);

const DURATION_HINT: &str = "durations are strings with a unit, like \"500ms\", \"30s\" or \"5m\"";

struct DurationVisitor {
    positive: bool,
}

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration string like \"30s\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        let d = humantime::parse_duration(s.trim())
            .map_err(|_| E::custom(format!("not a duration; {DURATION_HINT}")))?;
        if d > MAX_DURATION {
            return Err(E::custom(
                "longer than one year, the longest duration legate accepts",
            ));
        }
        if self.positive && d.is_zero() {
            return Err(E::custom("must be greater than zero"));
        }
        Ok(d)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Duration, E> {
        Err(E::custom(DURATION_HINT))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Duration, E> {
        Err(E::custom(DURATION_HINT))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Duration, E> {
        Err(E::custom(DURATION_HINT))
    }
}

fn show_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&shown_duration(*d))
}

/// A duration as an operator writes one, in days, hours, minutes, seconds and milliseconds
/// (`1d 2h`, `90s` is `1m 30s`): humantime's own format counts months and years of 30.44 and
/// 365.25 days (`365d` came out as `11months 30days 3h 50m 24s`). Parsed back by humantime,
/// it is the same duration (below a millisecond: micro- and nanoseconds).
pub(crate) fn shown_duration(d: Duration) -> String {
    use std::fmt::Write;
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (u64::from(nanos / 1_000_000), "ms"),
        (u64::from(nanos / 1_000 % 1_000), "us"),
        (u64::from(nanos % 1_000), "ns"),
    ];
    let mut out = String::new();
    for (n, unit) in parts.into_iter().filter(|(n, _)| *n > 0) {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{n}{unit}");
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

/// A duration, zero allowed (`shutdown_grace = "0s"`: stop at once).
pub mod duration {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        show_duration(d, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_str(DurationVisitor { positive: false })
    }
}

/// A duration greater than zero: timeouts and windows.
pub mod positive_duration {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        show_duration(d, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_str(DurationVisitor { positive: true })
    }

    /// The same, for a key whose absence means something.
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => s.serialize_some(&shown_duration(*d)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            d.deserialize_str(DurationVisitor { positive: true })
                .map(Some)
        }
    }
}

/// A count that must be above 0 (`max_attempts`, `queue_limit`).
pub fn positive<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default + PartialEq,
{
    let v = T::deserialize(d)?;
    if v == T::default() {
        return Err(de::Error::custom("must be greater than 0"));
    }
    Ok(v)
}

/// A share between 0 and 1 (integers 0 and 1 included).
pub fn ratio<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let x = f64::deserialize(d)?;
    if !(0.0..=1.0).contains(&x) {
        return Err(de::Error::custom(format!("{x} is not between 0 and 1")));
    }
    Ok(x)
}

/// An `IP:port` socket address. Host names are refused: what a listener binds must not depend
/// on a resolver.
pub mod socket_addr {
    use super::*;

    pub fn serialize<S: Serializer>(a: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(a)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.trim().parse().map_err(|_| {
            de::Error::custom("not an IP:port address like \"127.0.0.1:8787\" or \"[::1]:8787\"")
        })
    }
}

/// Removes the "`value` " a parser's message starts with: the message is shown, the value not.
fn without_value(message: String, value: &str) -> String {
    match message.strip_prefix(&format!("`{}` ", value.trim())) {
        Some(rest) => format!("the value {rest}"),
        None => message,
    }
}

/// An exact USD amount, as a decimal string, kept as integer pico-USD (`daily_budget_usd`).
pub mod usd {
    use super::*;

    pub fn serialize<S: Serializer>(pico: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::meter::format_usd(*pico))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        let s = String::deserialize(d)?;
        crate::meter::parse_usd(&s).map_err(|m| {
            de::Error::custom(format!(
                "{}; write an exact decimal string like \"25.50\"",
                without_value(m, &s)
            ))
        })
    }
}

/// A price in USD per million tokens, kept as pico-USD per token. A decimal string or a whole
/// number; floats are refused because `0.3` in TOML is already inexact before legate sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerMtok(pub u64);

impl Serialize for PerMtok {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::meter::format_usd_per_mtok(self.0))
    }
}

impl<'de> Deserialize<'de> for PerMtok {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PerMtok;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a decimal string of USD per million tokens")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PerMtok, E> {
                crate::meter::parse_usd_per_mtok(s)
                    .map(PerMtok)
                    .map_err(|m| E::custom(without_value(m, s)))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<PerMtok, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<PerMtok, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom("must not be negative")),
                }
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<PerMtok, E> {
                Err(E::custom(
                    "write prices as decimal strings (like \"0.30\") so they stay exact",
                ))
            }
        }
        d.deserialize_any(V)
    }
}

/// `scheme://user:password@host/…?key=value` with the userinfo and the query's values shown as
/// `***`; anything else unchanged.
pub fn mask_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let masked = match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..scheme_end], &rest[at..]),
        None => url.to_owned(),
    };
    // A query carries keys as often as userinfo does (`?api_key=…`): its values go too.
    match masked.split_once('?') {
        Some((base, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let names: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) => format!("{name}=***"),
                    None => pair.to_owned(),
                })
                .collect();
            let mut out = format!("{base}?{}", names.join("&"));
            if let Some(f) = fragment {
                out.push('#');
                out.push_str(f);
            }
            out
        }
        None => masked,
    }
}

/// Serialises an optional URL with its userinfo masked.
pub fn masked_url<S: Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(u) => s.serialize_some(&mask_userinfo(u)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_masked_and_nothing_else_changes() {
        assert_eq!(
            mask_userinfo("redis://:pw@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(
            mask_userinfo("https://user:sk-1@x.example/a@b"),
            "https://***@x.example/a@b"
        );
        assert_eq!(
            mask_userinfo("http://127.0.0.1:4318/v1"),
            "http://127.0.0.1:4318/v1"
        );
        assert_eq!(mask_userinfo("not a url @ all"), "not a url @ all");
        assert_eq!(
            mask_userinfo("http://127.0.0.1:4318/?api_key=sk-1&debug#top"),
            "http://127.0.0.1:4318/?api_key=***&debug#top"
        );
    }
}
