//! `[[prices]]`: USD per million tokens for each `provider:model`, as exact decimals.

use std::collections::BTreeMap;

use super::{Cx, repeat_of};
use crate::config::file::PriceFile;
use crate::meter::Price;

pub(crate) fn build(items: &[PriceFile], cx: &mut Cx) -> BTreeMap<String, Price> {
    let mut out = BTreeMap::new();
    let mut first_seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, p) in items.iter().enumerate() {
        let at = format!("prices[{i}]");
        let model = cx
            .required(p.model.as_deref(), &format!("{at}.model"))
            .filter(|m| target(m, &format!("{at}.model"), cx));
        let input = cx.required(p.input, &format!("{at}.input"));
        let output = cx.required(p.output, &format!("{at}.output"));
        if let Some(model) = model
            && let Some(j) = repeat_of(&mut first_seen, model, i)
        {
            let message = format!("`{model}` already has a price at prices[{j}]");
            cx.err(&format!("{at}.model"), message);
        }
        if let (Some(model), Some(input), Some(output)) = (model, input, output) {
            let price = Price {
                input: input.0,
                output: output.0,
                cache_write: p.cache_write.0,
                cache_read: p.cache_read.0,
            };
            out.insert(model.to_owned(), price);
        }
    }
    out
}

/// `provider:model`, with a well-formed provider name. The provider need not be configured:
/// a price table may be shared between deployments.
fn target(s: &str, path: &str, cx: &mut Cx) -> bool {
    match super::split_target(s) {
        Err(m) => cx.err(path, m),
        Ok((provider, _)) if !super::is_ident(provider) => cx.err(
            path,
            format!(
                "provider name `{}` is not a lowercase identifier ([a-z0-9_-]+)",
                crate::config::shown::shown(provider)
            ),
        ),
        Ok(_) => return true,
    }
    false
}
