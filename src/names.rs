//! Model names as config writes them: an exact name, or a prefix pattern ending in `*`
//! (`claude-haiku-4-5*` matches the dated snapshot `claude-haiku-4-5-20251001`). Used by
//! `[[models]]`, `[[prices]]`, `[[limits]]` and metric labels alike, so one rule decides
//! everywhere: an exact name beats any pattern, and a longer pattern beats a shorter one.

/// Model names longer than this are refused (SPEC §3): they end up in logs, maps and labels.
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// Whether `pattern` is a prefix pattern.
pub fn is_pattern(pattern: &str) -> bool {
    pattern.ends_with('*')
}

/// Whether `label`, the metric label `route::Labels::model` gave `model`, is the model's own
/// name: a name the config spells out. A caller naming a model literally like a configured
/// pattern (`claude-*`), or `other`, gets that label too, yet is as unbounded as any unknown name.
pub fn labels_itself(label: &str, model: &str) -> bool {
    label == model && !is_pattern(model) && model != "other"
}

/// How specifically `pattern` matches `name`: `None` when it does not; an exact name ranks
/// above every pattern, a longer prefix above a shorter one.
pub fn specificity(pattern: &str, name: &str) -> Option<usize> {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix).then_some(prefix.len()),
        None => (pattern == name).then_some(usize::MAX),
    }
}

/// The most specific of `entries` (pattern, value) matching `name`; on a tie the first wins.
pub fn best<'a, T>(
    entries: impl IntoIterator<Item = (&'a str, T)>,
    name: &str,
) -> Option<(&'a str, T)> {
    let mut found: Option<(usize, &'a str, T)> = None;
    for (pattern, value) in entries {
        if let Some(rank) = specificity(pattern, name)
            && found.as_ref().is_none_or(|(r, _, _)| rank > *r)
        {
            found = Some((rank, pattern, value));
        }
    }
    found.map(|(_, pattern, value)| (pattern, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_beats_patterns_and_longer_patterns_beat_shorter_ones() {
        let entries = [
            ("claude-*", 1),
            ("claude-haiku-4-5*", 2),
            ("claude-haiku-4-5-20251001", 3),
        ];
        let pick = |name: &str| best(entries.iter().map(|(p, v)| (*p, *v)), name);
        assert_eq!(
            pick("claude-haiku-4-5-20251001"),
            Some(("claude-haiku-4-5-20251001", 3))
        );
        assert_eq!(
            pick("claude-haiku-4-5-20991231"),
            Some(("claude-haiku-4-5*", 2))
        );
        assert_eq!(pick("claude-opus-4-5"), Some(("claude-*", 1)));
        assert_eq!(pick("gpt-4o"), None);
    }

    #[test]
    fn a_pattern_is_a_plain_prefix() {
        assert_eq!(specificity("gpt-4o*", "gpt-4o"), Some(6));
        assert_eq!(specificity("gpt-4o*", "gpt-4o-mini"), Some(6));
        assert_eq!(specificity("*", "anything"), Some(0));
        assert_eq!(specificity("gpt-4o", "gpt-4o-mini"), None);
        assert!(is_pattern("x*") && !is_pattern("x"));
        assert!(labels_itself("claude-x", "claude-x"));
        assert!(
            !labels_itself("claude-*", "claude-*"),
            "a pattern named literally"
        );
        assert!(!labels_itself("other", "other"));
        assert!(!labels_itself("claude-*", "claude-x"));
    }
}
