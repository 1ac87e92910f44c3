//! `[[limits]]`: the largest `max_tokens` a model accepts, extending the built-in table.

use std::collections::BTreeMap;

use super::{Cx, repeat_of};
use crate::config::file::LimitFile;
use crate::limits::OutputLimit;
use crate::names::MAX_MODEL_NAME_BYTES;

pub(crate) fn build(items: &[LimitFile], cx: &mut Cx) -> Vec<OutputLimit> {
    let mut out: Vec<OutputLimit> = Vec::new();
    let mut first_seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, l) in items.iter().enumerate() {
        let at = format!("limits[{i}].model");
        let model = cx.required(l.model.as_deref(), &at);
        let max = cx.required(
            l.max_output_tokens,
            &format!("limits[{i}].max_output_tokens"),
        );
        let Some(model) = model else {
            continue;
        };
        if model.trim().is_empty() {
            cx.err(&at, "must not be empty");
        } else if model.len() > MAX_MODEL_NAME_BYTES {
            cx.err(
                &at,
                format!("model names are at most {MAX_MODEL_NAME_BYTES} bytes"),
            );
        } else if let Some(j) = repeat_of(&mut first_seen, model, i) {
            cx.err(&at, format!("`{model}` already has a limit at limits[{j}]"));
        } else if let Some(max) = max {
            out.push(OutputLimit {
                model: model.to_owned(),
                max_output_tokens: max.get(),
            });
        }
    }
    out
}
