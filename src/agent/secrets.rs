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

/// Values shorter than this are not looked for in outputs: a short value (`1`, `true`) would
/// blank out ordinary text, and no key is that short.
const MIN_REDACTED_LEN: usize = 12;

/// Whether a variable of this name holds a credential: legate's own (`LEGATE_…`: the agent's
/// key, config overrides that may carry provider keys) and any whose name says so.
fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("LEGATE_") || upper.split('_').any(|part| SECRET_PARTS.contains(&part))
}

/// The variables of this process's environment that a command does not get, with their values.
/// Read once: the environment does not change while the agent runs.
static SCRUBBED: LazyLock<Vec<(String, String)>> = LazyLock::new(|| {
    std::env::vars_os()
        .filter_map(|(name, value)| {
            let name = name.to_string_lossy().into_owned();
            let value = value.to_string_lossy().into_owned();
            let secret = secret_name(&name) || key_shapes::scan(&value) != Scan::Clean;
            secret.then_some((name, value))
        })
        .collect()
});

/// The names a command's environment is cleared of.
pub(super) fn scrubbed_names() -> impl Iterator<Item = &'static str> {
    SCRUBBED.iter().map(|(name, _)| name.as_str())
}

/// `text` as the model and the transcript may see it: the scrubbed variables' values and every
/// key-like string replaced by a note naming what was there.
pub(super) fn redact(text: &str) -> Cow<'_, str> {
    redact_with(text, &SCRUBBED)
}

fn redact_with<'a>(text: &'a str, scrubbed: &[(String, String)]) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for (name, value) in scrubbed {
        if value.len() >= MIN_REDACTED_LEN && out.contains(value.as_str()) {
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
        ] {
            assert!(secret_name(name), "{name}");
        }
        for name in [
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

    #[test]
    fn outputs_lose_the_scrubbed_values_and_key_like_strings() {
        let scrubbed = [
            ("MY_TOKEN".to_owned(), "opaque-value-0123456789".to_owned()),
            ("SHORT_KEY".to_owned(), "abc".to_owned()),
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
    }
}
