//! `[[limits]]`: the largest `max_tokens` a model accepts, extending the built-in table.

use config::Value;

use super::reader::{self, Cx, Table};
use crate::limits::OutputLimit;
use crate::names::MAX_MODEL_NAME_BYTES;

pub(crate) fn parse(items: &[Value], path: &str, cx: &mut Cx) -> Vec<OutputLimit> {
    let mut out: Vec<OutputLimit> = Vec::new();
    let mut first_seen: std::collections::BTreeMap<String, usize> = Default::default();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let Some(mut t) = Table::of(item, &item_path, cx) else {
            continue;
        };
        let model = t.req(cx, "model", reader::non_empty_string);
        let max = t.req(cx, "max_output_tokens", reader::positive_uint);
        if let Some(model) = &model {
            if model.len() > MAX_MODEL_NAME_BYTES {
                cx.err(
                    &t.child("model"),
                    format!("model names are at most {MAX_MODEL_NAME_BYTES} bytes"),
                );
            } else if let Some(j) = first_seen.get(model) {
                cx.err(
                    &t.child("model"),
                    format!("`{model}` already has a limit at {path}[{j}]"),
                );
            } else {
                first_seen.insert(model.clone(), i);
            }
        }
        t.finish(cx);
        if let (Some(model), Some(max_output_tokens)) = (model, max) {
            out.push(OutputLimit {
                model,
                max_output_tokens,
            });
        }
    }
    out
}
