//! A request's id: `lgt_`, the process's random prefix in 12 hex digits and the request's
//! counter in at least 8, the text of `format!("lgt_{:012x}{:08x}")`. Kept as its two
//! numbers, so that the request's facts hold it without a copy of its text; written out only
//! where it is shown (the response header, the log, the journal's answers).

use std::fmt;

/// The longest id: `lgt_` and sixteen hex digits of each number.
const MAX_LEN: usize = 4 + 16 + 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId {
    prefix: u64,
    n: u64,
}

impl RequestId {
    pub const fn new(prefix: u64, n: u64) -> Self {
        RequestId { prefix, n }
    }

    /// The id's text in a buffer on the stack, and its length.
    fn text(&self) -> ([u8; MAX_LEN], usize) {
        let mut out = [0u8; MAX_LEN];
        out[..4].copy_from_slice(b"lgt_");
        let prefix_end = 4 + hex_digits(self.prefix, 12);
        let end = prefix_end + hex_digits(self.n, 8);
        write_hex(&mut out[4..prefix_end], self.prefix);
        write_hex(&mut out[prefix_end..end], self.n);
        (out, end)
    }

    /// The id as a string of exactly its length: a header value takes it as it is, where
    /// one with spare room costs a second allocation to be shared.
    pub fn render(&self) -> String {
        let (text, len) = self.text();
        std::str::from_utf8(&text[..len])
            .unwrap_or_default()
            .to_owned()
    }

    /// The id as the value of its response header (`x-legate-request-id`), made from its text
    /// without a `String` in between (and its UTF-8 check).
    pub fn header_value(&self) -> Option<http::HeaderValue> {
        let (text, len) = self.text();
        http::HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(&text[..len])).ok()
    }

    /// The id's two numbers as bytes (to derive other names from).
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.prefix.to_be_bytes());
        out[8..].copy_from_slice(&self.n.to_be_bytes());
        out
    }

    /// Whether `s` is this id's text.
    pub fn is(&self, s: &str) -> bool {
        let (text, len) = self.text();
        text[..len] == *s.as_bytes()
    }

    /// The id whose text `s` is, when it is one legate hands out (a prefix of 48 bits, as
    /// `RequestIds` makes, so that its 12 digits end where the counter's begin); `None` for
    /// anything else. Lets a lookup compare numbers instead of writing every id out.
    pub fn parse(s: &str) -> Option<RequestId> {
        let hex = s.strip_prefix("lgt_")?;
        if !(12 + 8..=12 + 16).contains(&hex.len()) {
            return None;
        }
        let prefix = u64::from_str_radix(hex.get(..12)?, 16).ok()?;
        let n = u64::from_str_radix(hex.get(12..)?, 16).ok()?;
        let id = RequestId::new(prefix, n);
        // Only the canonical text: no sign, upper case or extra leading zeros.
        id.is(s).then_some(id)
    }
}

/// How many hex digits `v` takes, at least `width`.
fn hex_digits(v: u64, width: usize) -> usize {
    let significant = (64 - v.leading_zeros() as usize).div_ceil(4);
    significant.max(width)
}

/// Fills `out` with the lowest hex digits of `v` (lower case), zero-padded: two digits a
/// step from a table of every byte's pair, where one digit a step took twice the loop.
fn write_hex(out: &mut [u8], mut v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    const PAIRS: [[u8; 2]; 256] = {
        let mut t = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = [HEX[i >> 4], HEX[i & 0xf]];
            i += 1;
        }
        t
    };
    let mut pairs = out.rchunks_exact_mut(2);
    for pair in pairs.by_ref() {
        pair.copy_from_slice(&PAIRS[(v & 0xff) as usize]);
        v >>= 8;
    }
    // An odd count leaves the leading digit.
    if let [first] = pairs.into_remainder() {
        *first = HEX[(v & 0xf) as usize];
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (text, len) = self.text();
        f.write_str(std::str::from_utf8(&text[..len]).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::RequestId;

    #[test]
    fn an_id_reads_as_the_formatted_prefix_and_counter() {
        for (prefix, n) in [
            (0, 0),
            (0xffff_ffff_ffff, 1),
            (0x1234_5678_9abc, 0xffff_ffff),
            (0x1, 0x1_0000_0000),
            // Odd counts of digits: nine and fifteen.
            (0x5, 0x1_2345_6789),
            (0x6, 0xf23_4567_89ab_cdef),
            (0xabc, u64::MAX),
            (u64::MAX, u64::MAX),
        ] {
            let id = RequestId::new(prefix, n);
            let want = format!("lgt_{prefix:012x}{n:08x}");
            assert_eq!(id.render(), want);
            assert_eq!(id.render().capacity(), want.len());
            assert_eq!(id.to_string(), want);
            assert_eq!(
                id.header_value().as_ref().map(http::HeaderValue::as_bytes),
                Some(want.as_bytes())
            );
            assert!(id.is(&want));
            assert!(!id.is(&want[..want.len() - 1]));
            assert!(!id.is(&want.to_uppercase()));
            if prefix <= 0xffff_ffff_ffff {
                assert_eq!(RequestId::parse(&want), Some(id), "{want}");
            }
        }
    }

    #[test]
    fn only_an_id_s_own_text_parses() {
        let id = RequestId::new(0x1234_5678_9abc, 7);
        assert_eq!(RequestId::parse("lgt_123456789abc00000007"), Some(id));
        for bad in [
            "",
            "lgt_",
            "lgt_123456789abc0000007",
            "lgt_123456789ABC00000007",
            "lgt_123456789abc+0000007",
            "lgt_123456789abc000000007",
            "LGT_123456789abc00000007",
            "lgt_123456789abc00000007 ",
            "lgt_123456789abc0000000000000000000007",
            "lgt_123456789abcé0000007",
        ] {
            assert_eq!(RequestId::parse(bad), None, "{bad:?}");
        }
    }
}
