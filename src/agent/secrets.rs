//! Keeping keys away from the model: the agent holds none of its own (legate holds the
//! provider's), but the shell it was started from often does — `ANTHROPIC_API_KEY` exported
//! for `legate serve` in the same terminal, `LEGATE_AGENT_KEY`, a `GITHUB_TOKEN`. A command the
//! model runs gets an environment without them, and what any tool hands back to the model (and
//! to the transcript) has them, and every key-like string (`key_shapes`), replaced by a note.
//!
//! The shell is not confined (it runs as the user), so this keeps keys from reaching the model
//! by accident or by a plain `env`; a command that reads them from a file on purpose gets its
//! output redacted, which is what stands between the key and the provider.

use std::borrow::Cow;
use std::sync::LazyLock;

use crate::key_shapes::{self, Scan};

/// Parts of a variable's name (split at `_`) that mark it as holding a credential.
const SECRET_PARTS: [&str; 10] = [
    "KEY",
    "APIKEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "CREDENTIALS",
    "AUTHTOKEN",
    "PAT",
];

/// Whether a variable of this name holds a credential: any whose name says so, and legate's
/// config overrides (`LEGATE__…`), which may carry a key or a URL with a password.
fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("LEGATE__") || upper.split('_').any(|part| SECRET_PARTS.contains(&part))
}

/// Whether a scrubbed variable's value is looked for in outputs: one that could be a secret,
/// 16 bytes or more of letters and digits both, without spaces, and not a URL or a path. A
/// short or plain value (`legate-agent`, the agent key's documented default; `true`; a
/// directory) would blank out ordinary text wherever it occurs.
fn worth_redacting(value: &str) -> bool {
    value.len() >= 16
        && !value.contains(char::is_whitespace)
        && !value.contains("://")
        && !value.starts_with('/')
        && value.bytes().any(|b| b.is_ascii_digit())
        && value.bytes().any(|b| b.is_ascii_alphabetic())
}

/// A variable kept from commands: its name, and its value when outputs are searched for it.
type Scrubbed = (String, Option<String>);

/// Of `vars`, those a command does not get.
fn scrub(vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>) -> Vec<Scrubbed> {
    vars.filter_map(|(name, value)| {
        let name = name.to_string_lossy().into_owned();
        let value = value.to_string_lossy().into_owned();
        let secret = secret_name(&name) || key_shapes::scan(&value) != Scan::Clean;
        secret.then(|| (name, worth_redacting(&value).then_some(value)))
    })
    .collect()
}

/// The variables of this process's environment that a command does not get. Read once: the
/// environment does not change while the agent runs.
static SCRUBBED: LazyLock<Vec<Scrubbed>> = LazyLock::new(|| scrub(std::env::vars_os()));

/// The names a command's environment is cleared of.
pub(super) fn scrubbed_names() -> impl Iterator<Item = &'static str> {
    SCRUBBED.iter().map(|(name, _)| name.as_str())
}

/// Whether `text` holds a note [`redact`] writes in a key's place.
pub(super) fn holds_note(text: &str) -> bool {
    static NOTE: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
        regex::Regex::new(r"\[(?:\$[A-Za-z_][A-Za-z0-9_]*|an? [A-Za-z -]{1,40}) withheld\]").ok()
    });
    text.contains(" withheld]") && NOTE.as_ref().is_none_or(|note| note.is_match(text))
}

/// `text` as the model and the transcript may see it: the scrubbed variables' values and every
/// key-like string replaced by a note naming what was there.
pub(super) fn redact(text: &str) -> Cow<'_, str> {
    redact_with(text, &SCRUBBED)
}

fn redact_with<'a>(text: &'a str, scrubbed: &[Scrubbed]) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for (name, value) in scrubbed {
        let Some(value) = value else { continue };
        if out.contains(value.as_str()) {
            out = Cow::Owned(out.replace(value.as_str(), &format!("[${name} withheld]")));
        }
    }
    match key_shapes::redact(&out) {
        Ok(Cow::Borrowed(_)) => out,
        Ok(Cow::Owned(redacted)) => Cow::Owned(redacted),
        // The patterns are constants that compile (a unit test says so); were they not, the
        // text is withheld whole rather than passed on unchecked.
        Err(()) => Cow::Borrowed("[withheld: the secret patterns failed to load]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names_are_told_from_ordinary_ones() {
        for name in [
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "LEGATE_AGENT_KEY",
            "LEGATE__PROVIDERS__ANTHROPIC__API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "GITHUB_TOKEN",
            "hf_token",
            "DB_PASSWORD",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GITLAB_PAT",
            "LEGATE__RATELIMIT__REDIS_URL",
        ] {
            assert!(secret_name(name), "{name}");
        }
        for name in [
            "LEGATE_URL",
            "LEGATE_LOG",
            "PATH",
            "HOME",
            "SSH_AUTH_SOCK",
            "TOKENIZERS_PARALLELISM",
            "KEYBOARD_LAYOUT",
            "PATHEXT",
        ] {
            assert!(!secret_name(name), "{name}");
        }
    }

    /// Which variables a command loses, and whose values are looked for in outputs.
    #[test]
    fn the_scrub_keeps_ordinary_variables_and_plain_values() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("LEGATE_URL", "http://127.0.0.1:8787"),
            ("LEGATE_AGENT_KEY", "legate-agent"),
            ("GITHUB_TOKEN", "opaque0123456789abcdef"),
            ("NOTES", "sk-ant-api03-abcdefghijklmnop_QRSTUV"),
            ("LEGATE__RATELIMIT__REDIS_URL", "redis://:pw@h:6379"),
        ];
        let scrubbed = scrub(vars.iter().map(|(n, v)| ((*n).into(), (*v).into())));
        let names: Vec<(&str, bool)> = scrubbed
            .iter()
            .map(|(n, v)| (n.as_str(), v.is_some()))
            .collect();
        assert_eq!(
            names,
            [
                ("LEGATE_AGENT_KEY", false),
                ("GITHUB_TOKEN", true),
                ("NOTES", true),
                ("LEGATE__RATELIMIT__REDIS_URL", false),
            ]
        );
    }

    #[test]
    fn outputs_lose_the_scrubbed_values_and_key_like_strings() {
        let scrubbed = [
            (
                "MY_TOKEN".to_owned(),
                Some("opaque-value-0123456789".to_owned()),
            ),
            ("SHORT_KEY".to_owned(), None),
        ];
        let text = "MY_TOKEN=opaque-value-0123456789\nSHORT_KEY=abc\n\
                    ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnop_QRSTUV\n";
        assert_eq!(
            redact_with(text, &scrubbed),
            "MY_TOKEN=[$MY_TOKEN withheld]\nSHORT_KEY=abc\n\
             ANTHROPIC_API_KEY=[an Anthropic API key withheld]\n"
        );
        assert!(matches!(
            redact_with("plain", &scrubbed),
            Cow::Borrowed("plain")
        ));
        let notes = redact_with(text, &scrubbed);
        assert!(holds_note(&notes));
        assert!(holds_note("A=[$LEGATE_AGENT_KEY withheld]"));
        assert!(!holds_note("the line is withheld] here") && !holds_note("plain"));
    }
}
