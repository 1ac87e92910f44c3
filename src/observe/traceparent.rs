//! W3C Trace Context `traceparent` (version 00): parsed from the caller, written to the
//! provider. Ids are random (the SDK's generator), never derived from anything secret.

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

/// `00-<32 hex>-<16 hex>-<2 hex>`; all-zero ids and version ff are invalid. Later versions may
/// carry more fields after the flags: the first four are read, as the spec asks.
pub fn parse(value: &str) -> Option<Parent> {
    let mut parts = value.trim().split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let span = parts.next()?;
    let flags = parts.next()?;
    if version.len() != 2 || version.eq_ignore_ascii_case("ff") || !is_lower_hex(version) {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    if !(is_lower_hex(trace) && is_lower_hex(span) && is_lower_hex(flags)) {
        return None;
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    hex::decode_to_slice(trace, &mut trace_id).ok()?;
    hex::decode_to_slice(span, &mut span_id).ok()?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn format(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> String {
    format!(
        "00-{}-{}-{}",
        hex::encode(trace_id),
        hex::encode(span_id),
        if sampled { "01" } else { "00" }
    )
}

pub fn new_trace_id() -> [u8; 16] {
    RandomIdGenerator::default().new_trace_id().to_bytes()
}

pub fn new_span_id() -> [u8; 8] {
    RandomIdGenerator::default().new_span_id().to_bytes()
}

pub fn trace_id(b: [u8; 16]) -> TraceId {
    TraceId::from_bytes(b)
}

pub fn span_id(b: [u8; 8]) -> SpanId {
    SpanId::from_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_round_trips() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = parse(v).unwrap();
        assert!(p.sampled);
        assert_eq!(format(&p.trace_id, &p.span_id, p.sampled), v);
        let unsampled = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn malformed_values_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        // A later version may add fields.
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx").is_some());
    }

    #[test]
    fn new_ids_are_not_zero() {
        assert_ne!(new_trace_id(), [0; 16]);
        assert_ne!(new_span_id(), [0; 8]);
    }
}
