//! Recognising key-like strings: provider API keys, cloud access keys, tokens and private keys.
//! Used by the agent's secret-scan hook (nothing key-like is written) and by config validation
//! (a key pasted into the wrong field is not printed back, `config::shown`). A match names the
//! kind of secret, never the secret itself, so the reason recorded in the transcript does not
//! leak it a second time.

use std::sync::LazyLock;

use std::borrow::Cow;

use regex::{Regex, RegexSet};

/// (kind, pattern). The first matching kind is reported, so narrower kinds come first. A
/// pattern starts at a word boundary where its prefix is short enough to occur inside a word
/// (`task-…` is no `sk-` key), or also after `_`, as in `TOKEN_ghp_…`. Boundaries are ASCII
/// ones (`(?-u:\b)`): a Unicode boundary makes the regex engine leave its fast path on text
/// that is not ASCII, and these run over every tool result.
const PATTERNS: [(&str, &str); 17] = [
    ("an Anthropic API key", r"sk-ant-[A-Za-z0-9_\-]{16,}"),
    (
        "an OpenAI-style API key",
        r"(?:(?-u:\b)|_)sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
    ),
    (
        "an AWS access key id",
        r"(?-u:\b)(?:AKIA|ASIA)[0-9A-Z]{16}(?-u:\b)",
    ),
    (
        "an AWS secret access key",
        r"(?i)aws_?secret_?access_?key\W{1,4}[A-Za-z0-9/+]{40}",
    ),
    // The block with its body: base64 and line breaks (raw, or written `\n` in source), and
    // the headers of an encrypted key, up to its end line if there is one. Redacted whole, and
    // an edit that fills the body of an empty block makes a block the file lacked. Nothing
    // else belongs to it: a header quoted in code or prose takes no more than its line.
    (
        "a private key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:(?:Proc-Type|DEK-Info):[^\n]*|[A-Za-z0-9+/=\s]|\\[rn])*(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----)?",
    ),
    ("a GitHub token", r"gh[pousr]_[A-Za-z0-9]{36,}"),
    ("a GitHub token", r"github_pat_[A-Za-z0-9_]{22,}"),
    ("a GitLab token", r"glpat-[A-Za-z0-9_\-]{20,}"),
    (
        "a Slack token",
        r"(?:(?-u:\b)|_)xox[abprs]-[A-Za-z0-9\-]{10,}",
    ),
    (
        "a Stripe key",
        r"(?:(?-u:\b)|_)[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",
    ),
    ("a Hugging Face token", r"(?:(?-u:\b)|_)hf_[A-Za-z0-9]{30,}"),
    ("a Google API key", r"(?:(?-u:\b)|_)AIza[0-9A-Za-z_\-]{35}"),
    (
        "a Google OAuth access token",
        r"(?:(?-u:\b)|_)ya29\.[0-9A-Za-z_\-]{10,}",
    ),
    (
        "a JSON Web Token",
        r"(?:(?-u:\b)|_)eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}",
    ),
    ("an npm token", r"(?:(?-u:\b)|_)npm_[A-Za-z0-9]{36}"),
    ("a PyPI token", r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{20,}"),
    (
        "a bearer token",
        r"(?i)(?-u:\b)bearer\s+[A-Za-z0-9\-._~+/]{20,}=*",
    ),
];

static SET: LazyLock<Option<RegexSet>> =
    LazyLock::new(|| RegexSet::new(PATTERNS.iter().map(|(_, p)| *p)).ok());

/// Each pattern alone, to find where it matches.
static EACH: LazyLock<Option<Vec<Regex>>> =
    LazyLock::new(|| PATTERNS.iter().map(|(_, p)| Regex::new(p).ok()).collect());

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

/// A key-like string in `after` that `before` did not hold (found there by the same pattern),
/// as an edit makes one: the kind of the first. An edit may leave a key the file held already (the file is the user's), but not
/// complete or add one.
pub(crate) fn introduced(before: &str, after: &str) -> Scan {
    let (Some(set), Some(each)) = (SET.as_ref(), EACH.as_ref()) else {
        return Scan::Unavailable;
    };
    for i in set.matches(after).iter() {
        // What the pattern finds in the text before, gathered once: a file with many
        // key-like strings is not searched again for each.
        let held: std::collections::HashSet<&str> =
            each[i].find_iter(before).map(|m| m.as_str()).collect();
        if each[i].find_iter(after).any(|m| !held.contains(m.as_str())) {
            return Scan::Found(PATTERNS[i].0);
        }
    }
    Scan::Clean
}

/// `text` with every key-like string replaced by a note naming its kind (`Err` when the
/// patterns did not compile: the caller withholds the whole text then).
pub(crate) fn redact(text: &str) -> Result<Cow<'_, str>, ()> {
    let (Some(set), Some(each)) = (SET.as_ref(), EACH.as_ref()) else {
        return Err(());
    };
    let found = set.matches(text);
    if !found.matched_any() {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = text.to_owned();
    for i in found.iter() {
        let note = format!("[{} withheld]", PATTERNS[i].0);
        if let Cow::Owned(replaced) = each[i].replace_all(&out, regex::NoExpand(&note)) {
            out = replaced;
        }
    }
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patterns_compile() {
        assert!(SET.is_some());
        assert!(EACH.as_ref().is_some_and(|e| e.len() == PATTERNS.len()));
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
            (
                "TOKEN_ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                "a GitHub token",
            ),
            ("glpat-abcdefghij0123456789", "a GitLab token"),
            ("STRIPE=sk_live_abcdefghij0123456789", "a Stripe key"),
            (
                "hf_abcdefghijklmnopqrstuvwxyz01234567",
                "a Hugging Face token",
            ),
            (
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "an AWS secret access key",
            ),
            (
                "Authorization: Bearer 0123456789abcdef0123456789abcdef",
                "a bearer token",
            ),
            (
                "X_sk-proj-abcdefghijklmnopqrstuvwx",
                "an OpenAI-style API key",
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
            "Authorization: Bearer ${TOKEN}",
            "ask_live_session",
        ] {
            assert_eq!(scan(text), Scan::Clean, "{text}");
        }
    }

    #[test]
    fn an_edit_may_keep_a_key_but_not_complete_or_add_one() {
        let key = "sk-ant-api03-abcdefghijklmnop_QRSTUV";
        let kept = format!("A={key}\nB=1\n");
        assert_eq!(introduced(&kept, &kept.replace("B=1", "B=2")), Scan::Clean);
        let stub = "A=sk-ant-api03-CHANGEME\n";
        let done = stub.replace("CHANGEME", "abcdefghijklmnop_QRSTUV");
        assert_eq!(introduced(stub, &done), Scan::Found("an Anthropic API key"));
        let empty = "-----BEGIN RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY-----\n";
        let filled = empty.replace("KEY-----\n-----END", "KEY-----\nMIIEowIBAAKCAQEA\n-----END");
        assert_eq!(introduced(empty, &filled), Scan::Found("a private key"));
    }

    /// A header quoted in code or prose is not a block that runs to the next end line (or to
    /// the end of the text): what follows it stays, and an edit below it is free.
    #[test]
    fn a_quoted_header_takes_no_more_than_its_line() -> Result<(), ()> {
        let code = "if line == \"-----BEGIN OPENSSH PRIVATE KEY-----\" {\n    parse();\n}\n";
        assert_eq!(
            redact(code)?,
            "if line == \"[a private key withheld]\" {\n    parse();\n}\n"
        );
        assert_eq!(
            introduced(code, &code.replace("parse", "read")),
            Scan::Clean
        );
        let in_source = "(\"-----BEGIN RSA PRIVATE KEY-----\\nMIIE\", \"a private key\"),";
        assert_eq!(
            redact(in_source)?,
            "(\"[a private key withheld]\", \"a private key\"),"
        );
        let encrypted = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\
                         DEK-Info: AES-128-CBC,00FF\n\nMIIE+abc/==\n-----END RSA PRIVATE KEY-----\nnext";
        assert_eq!(redact(encrypted)?, "[a private key withheld]\nnext");
        Ok(())
    }

    #[test]
    fn redaction_names_the_kind_and_keeps_the_rest() -> Result<(), ()> {
        let text = "env: ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnop_QRSTUV PATH=/bin\n\
                    -----BEGIN PRIVATE KEY-----\nMIIE\nabc\n-----END PRIVATE KEY-----\nafter";
        assert_eq!(
            redact(text)?,
            "env: ANTHROPIC_API_KEY=[an Anthropic API key withheld] PATH=/bin\n\
             [a private key withheld]\nafter"
        );
        assert!(matches!(redact("nothing here")?, Cow::Borrowed(_)));
        Ok(())
    }
}
