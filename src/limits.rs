//! Output-token limits per model: a built-in table of known models, extended and overridden by
//! `[[limits]]`. Fitting caps `max_tokens` at the step's limit whenever legate chose the model
//! (an alias, a fallback step, a translated step), so that no step receives a `max_tokens` its
//! model refuses (SPEC §10). The caller naming a model itself gets its request as sent.

use crate::names;

/// One `[[limits]]` entry: a model name or `*` pattern and its largest `max_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLimit {
    pub model: String,
    pub max_output_tokens: u64,
}

/// Largest output (tokens) of known models, from the providers' model documentation. Patterns
/// cover dated snapshots; the most specific entry wins, so a family default can sit beside a
/// model that differs from it.
const BUILT_IN: &[(&str, u64)] = &[
    // Anthropic
    ("claude-opus-4-5*", 64_000),
    ("claude-opus-4-1*", 32_000),
    ("claude-opus-4-0*", 32_000),
    ("claude-opus-4-2*", 32_000),
    ("claude-sonnet-4-5*", 64_000),
    ("claude-sonnet-4-0*", 64_000),
    ("claude-sonnet-4-2*", 64_000),
    ("claude-haiku-4-5*", 64_000),
    ("claude-3-7-sonnet*", 64_000),
    ("claude-3-5-sonnet*", 8_192),
    ("claude-3-5-haiku*", 8_192),
    ("claude-3-opus*", 4_096),
    ("claude-3-haiku*", 4_096),
    // OpenAI
    ("gpt-5*", 128_000),
    ("gpt-4.1*", 32_768),
    ("gpt-4o*", 16_384),
    ("chatgpt-4o*", 16_384),
    ("gpt-4-turbo*", 4_096),
    ("gpt-4-0125*", 4_096),
    ("gpt-4-1106*", 4_096),
    ("gpt-4", 8_192),
    ("gpt-4-0613", 8_192),
    ("gpt-3.5-turbo*", 4_096),
    ("o1*", 100_000),
    ("o1-mini*", 65_536),
    ("o3*", 100_000),
    ("o4-mini*", 100_000),
];

/// The output limit of `model`: the most specific `[[limits]]` entry, else the built-in table.
/// Configured entries come first so an operator's number always wins over the built-in one.
pub fn max_output_tokens(configured: &[OutputLimit], model: &str) -> Option<u64> {
    let from_config = configured
        .iter()
        .map(|l| (l.model.as_str(), l.max_output_tokens));
    names::best(from_config, model)
        .or_else(|| names::best(BUILT_IN.iter().copied(), model))
        .map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_snapshots_and_families_are_known() {
        assert_eq!(max_output_tokens(&[], "gpt-4o-mini"), Some(16_384));
        assert_eq!(
            max_output_tokens(&[], "claude-haiku-4-5-20251001"),
            Some(64_000)
        );
        assert_eq!(
            max_output_tokens(&[], "claude-opus-4-20250514"),
            Some(32_000)
        );
        assert_eq!(max_output_tokens(&[], "o1-mini-2024-09-12"), Some(65_536));
        assert_eq!(max_output_tokens(&[], "llama-3.1-8b"), None);
    }

    #[test]
    fn configured_limits_override_and_extend_the_table() {
        let configured = [
            OutputLimit {
                model: "gpt-4o*".into(),
                max_output_tokens: 1000,
            },
            OutputLimit {
                model: "llama*".into(),
                max_output_tokens: 2048,
            },
        ];
        assert_eq!(max_output_tokens(&configured, "gpt-4o-mini"), Some(1000));
        assert_eq!(max_output_tokens(&configured, "llama-3.1-8b"), Some(2048));
        assert_eq!(max_output_tokens(&configured, "gpt-4.1"), Some(32_768));
    }
}
