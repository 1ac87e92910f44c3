//! Bookkeeping of the fitting rules: what a translated request left behind, named by static
//! labels so logs and metrics stay bounded.

use serde_json::{Map, Value};

/// The labels of what was dropped, each once, in the order first met.
#[derive(Debug, Default)]
pub(super) struct Fitting {
    dropped: Vec<&'static str>,
}

impl Fitting {
    pub(super) fn drop(&mut self, what: &'static str) {
        if !self.dropped.contains(&what) {
            self.dropped.push(what);
        }
    }

    /// Notes a field that the other API may or may not hold: dropped only when present.
    pub(super) fn drop_if<T>(&mut self, field: &Option<T>, what: &'static str) {
        if field.is_some() {
            self.drop(what);
        }
    }

    /// Notes every top-level field the translation does not carry (a `null` carries nothing).
    /// Known ones are named by their own label; anything else counts as `unknown_fields`.
    pub(super) fn drop_extra(&mut self, extra: &Map<String, Value>, known: &[&'static str]) {
        for (key, _) in extra.iter().filter(|(_, v)| !v.is_null()) {
            match known.iter().find(|k| **k == key.as_str()) {
                Some(label) => self.drop(label),
                None => self.drop("unknown_fields"),
            }
        }
    }

    pub(super) fn into_labels(self) -> Vec<&'static str> {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_are_listed_once_in_first_seen_order() {
        let mut fit = Fitting::default();
        fit.drop("top_k");
        fit.drop("thinking");
        fit.drop("top_k");
        fit.drop_if(&None::<u8>, "never");
        fit.drop_if(&Some(1), "cache_control");
        assert_eq!(fit.into_labels(), ["top_k", "thinking", "cache_control"]);
    }

    #[test]
    fn unknown_extra_fields_share_one_label_and_nulls_carry_nothing() {
        let mut fit = Fitting::default();
        let extra = json!({"seed": 1, "frobnicate": true, "zzz": 2, "logprobs": null});
        let Value::Object(map) = extra else {
            panic!("object literal");
        };
        fit.drop_extra(&map, &["seed", "logprobs"]);
        let mut labels = fit.into_labels();
        labels.sort_unstable();
        assert_eq!(labels, ["seed", "unknown_fields"]);
    }
}
