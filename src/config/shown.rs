//! What a validation message may show of a value the operator wrote. A key pasted into the
//! wrong field (a key file's path, a base URL, a provider name in a route, a key name) would
//! otherwise be printed back by `legate check` and logged by `serve` (SPEC §14: validation
//! messages never echo a credential). Paths, URLs and names are shown as written; what looks
//! like a credential is not.

use std::borrow::Cow;

/// `value` as written, or a note of its length when it looks like a credential.
pub(crate) fn shown(value: &str) -> Cow<'_, str> {
    if looks_like_key(value) {
        Cow::Owned(format!(
            "<{} characters, not shown: it looks like a key>",
            value.chars().count()
        ))
    } else {
        Cow::Borrowed(value)
    }
}

/// A key of a known kind anywhere in it (`key_shapes`, the agent's secret scan too), or a
/// long run of letters and digits with no separator a path, a file name, a host or a model
/// name would have.
fn looks_like_key(value: &str) -> bool {
    // Fails closed: patterns that did not compile hide every value.
    if crate::key_shapes::scan(value) != crate::key_shapes::Scan::Clean {
        return true;
    }
    let has = |f: fn(&u8) -> bool| value.bytes().any(|b| f(&b));
    let (lower, upper, digit) = (
        has(u8::is_ascii_lowercase),
        has(u8::is_ascii_uppercase),
        has(u8::is_ascii_digit),
    );
    // An Azure OpenAI key: 32 hex digits.
    if value.len() >= 32
        && value.bytes().all(|b| b.is_ascii_hexdigit())
        && digit
        && (lower || upper)
    {
        return true;
    }
    let token = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'+' | b'='));
    if token && value.len() >= 24 && lower && upper && digit {
        return true;
    }
    // An AWS secret access key and other base64: `/` and `+` among mixed-case letters and
    // digits. A relative path has a plain lower-case word between its slashes; base64 does
    // not.
    let base64 = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'+' | b'='));
    let word = |seg: &str| seg.len() >= 2 && seg.bytes().all(|b| b.is_ascii_lowercase());
    base64
        && value.len() >= 32
        && !value.starts_with('/')
        && lower
        && upper
        && digit
        && !value.split('/').any(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_not_shown_and_paths_names_and_urls_are() {
        for key in [
            "sk-ant-api03-PASTEDSECRETXYZ",
            "sk-proj-abcdef0123456789",
            "AKIAIOSFODNN7EXAMPLE",
            "ya29.a0AfH6SMBx3",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
            "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MEFCQ0RF",
            "3f2a9c1b7d6e4f508a1b2c3d4e5f6a7b",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY1",
        ] {
            assert!(shown(key).starts_with('<'), "{key}");
            assert!(!shown(key).contains(&key[3..]), "{key}");
        }
        for plain in [
            "/var/run/secrets/anthropic/key",
            "anthropic.key",
            "keys/openai",
            "https://api.anthropic.com",
            "claude-sonnet-4-5-20250929",
            "anthropic",
            "max_connections",
            "sk-",
            "gpt-4.1-mini",
            "/etc/legate/Keys2024/anthropic",
            "secrets/Anthropic2024Production/key",
        ] {
            assert_eq!(shown(plain), plain);
        }
    }
}
