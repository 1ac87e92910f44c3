//! Recognising key-like strings: provider API keys, cloud access keys, tokens and private keys.
//! Used by the agent's secret-scan hook (nothing key-like is written) and by config validation
//! (a key pasted into the wrong field is not printed back, `config::shown`). A match names the
//! kind of secret, never the secret itself, so the reason recorded in the transcript does not
//! leak it a second time.

use std::sync::LazyLock;

use regex::RegexSet;

/// (kind, pattern). The first matching kind is reported, so narrower kinds come first.
const PATTERNS: [(&str, &str); 10] = [
    ("an Anthropic API key", r"sk-ant-[A-Za-z0-9_\-]{16,}"),
    (
        "an OpenAI-style API key",
        r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
    ),
    ("an AWS access key id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    (
        "a private key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
    ),
    ("a GitHub token", r"\bgh[pousr]_[A-Za-z0-9]{36,}"),
    ("a GitHub token", r"\bgithub_pat_[A-Za-z0-9_]{22,}"),
    ("a Slack token", r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),
    ("a Google API key", r"\bAIza[0-9A-Za-z_\-]{35}"),
    (
        "a Google OAuth access token",
        r"\bya29\.[0-9A-Za-z_\-]{10,}",
    ),
    (
        "a JSON Web Token",
        r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}",
    ),
];

static SET: LazyLock<Option<RegexSet>> =
    LazyLock::new(|| RegexSet::new(PATTERNS.iter().map(|(_, p)| *p)).ok());

/// What the scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    Clean,
    /// The kind of secret found.
    Found(&'static str),
    /// The patterns did not compile; the hook fails closed on this.
    Unavailable,
}

pub(crate) fn scan(text: &str) -> Scan {
    let Some(set) = SET.as_ref() else {
        return Scan::Unavailable;
    };
    match set.matches(text).iter().next() {
        Some(i) => Scan::Found(PATTERNS[i].0),
        None => Scan::Clean,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patterns_compile() {
        assert!(SET.is_some());
    }

    #[test]
    fn finds_key_like_strings_and_names_their_kind() {
        let cases = [
            (
                "key = \"sk-ant-api03-abcdefghijklmnop_QRSTUV\"",
                "an Anthropic API key",
            ),
            (
                "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx",
                "an OpenAI-style API key",
            ),
            (
                "sk-abcdefghijklmnopqrstuvwxyz0123",
                "an OpenAI-style API key",
            ),
            (
                "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
                "an AWS access key id",
            ),
            ("-----BEGIN RSA PRIVATE KEY-----\nMIIE", "a private key"),
            ("-----BEGIN PRIVATE KEY-----", "a private key"),
            ("-----BEGIN OPENSSH PRIVATE KEY-----", "a private key"),
            (
                "token: ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                "a GitHub token",
            ),
            ("xoxb-1234567890-abcdef", "a Slack token"),
            (
                "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234",
                "a Google API key",
            ),
            ("Bearer ya29.a0AfH6SMBx3abc", "a Google OAuth access token"),
            (
                "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
                "a JSON Web Token",
            ),
        ];
        for (text, kind) in cases {
            assert_eq!(scan(text), Scan::Found(kind), "{text}");
        }
    }

    #[test]
    fn ordinary_text_is_clean() {
        for text in [
            "fn main() { println!(\"hello\"); }",
            "task-abcdefghijklmnopqrstuvwxyz0123",
            "sk-short",
            "-----BEGIN CERTIFICATE-----",
            "-----BEGIN PUBLIC KEY-----",
            "grep -r 'sk-ant-' .",
            "AKIA lowercase akiaiosfodnn7example",
        ] {
            assert_eq!(scan(text), Scan::Clean, "{text}");
        }
    }
}
