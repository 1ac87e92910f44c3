//! `GET /v1/responses/{id}/input_items` for a response legate keeps itself: the turn's input
//! items as OpenAI lists them, a page at a time (`limit` 1–100, default 20; `order` `desc`,
//! the default, or `asc`; `after` an item id), each item with an `id` (one it lacked is named
//! after the response and its place in the input, so that `after` can point at it).

use serde_json::{Value, json};

use crate::error::ProxyError;

const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 100;

fn invalid(message: String) -> ProxyError {
    ProxyError::InvalidRequest { message }
}

/// One page of `input`, the items kept for response `id`, as asked by `query`.
pub(super) fn page(id: &str, input: &[Value], query: Option<&str>) -> Result<Value, ProxyError> {
    let mut limit = DEFAULT_LIMIT;
    let mut ascending = false;
    let mut after: Option<&str> = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        invalid(format!(
                            "`limit` must be a whole number from 1 to {MAX_LIMIT}"
                        ))
                    })?;
            }
            "order" => {
                ascending = match value {
                    "asc" => true,
                    "desc" => false,
                    _ => return Err(invalid("`order` must be `asc` or `desc`".to_owned())),
                };
            }
            "after" => after = Some(value),
            // `include[]` and anything else ask for what a kept item already has, or nothing.
            _ => {}
        }
    }
    let named: Vec<Value> = input
        .iter()
        .enumerate()
        .map(|(i, item)| with_id(id, i, item))
        .collect();
    let mut ordered: Box<dyn Iterator<Item = Value>> = if ascending {
        Box::new(named.into_iter())
    } else {
        Box::new(named.into_iter().rev())
    };
    if let Some(cursor) = after {
        let mut found = false;
        ordered = Box::new(ordered.skip_while(move |item| {
            let before = !found;
            found = found || item["id"] == cursor;
            before
        }));
    }
    let mut data: Vec<Value> = ordered.by_ref().take(limit + 1).collect();
    let has_more = data.len() > limit;
    data.truncate(limit);
    if let (Some(cursor), true) = (after, data.is_empty()) {
        // The cursor named no item, or the last one: both list nothing after it; only the
        // first is a mistake worth saying.
        if !input
            .iter()
            .enumerate()
            .any(|(i, item)| with_id(id, i, item)["id"] == cursor)
        {
            return Err(invalid(format!(
                "`after` names no input item of response `{id}`"
            )));
        }
    }
    let first_id = data.first().map(|i| i["id"].clone()).unwrap_or(Value::Null);
    let last_id = data.last().map(|i| i["id"].clone()).unwrap_or(Value::Null);
    Ok(json!({"object": "list", "data": data, "first_id": first_id,
              "last_id": last_id, "has_more": has_more}))
}

/// `item` with an `id`: its own, or `<response id>_item_<place>`.
fn with_id(id: &str, place: usize, item: &Value) -> Value {
    let mut item = match item {
        Value::Object(_) => item.clone(),
        // A bare string in the input is a user message.
        Value::String(text) => json!({"type": "message", "role": "user", "content": text}),
        other => json!({"type": "message", "role": "user", "content": other}),
    };
    if !item.get("id").is_some_and(Value::is_string) {
        item["id"] = Value::String(format!("{id}_item_{place}"));
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"type": "message", "role": "user", "content": format!("m{i}")}))
            .collect()
    }

    fn ids(v: &Value) -> Vec<String> {
        v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["id"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn newest_first_twenty_at_a_time_by_default() {
        let got = page("r", &items(23), None).unwrap_or_default();
        let want: Vec<String> = (3..23).rev().map(|i| format!("r_item_{i}")).collect();
        assert_eq!(ids(&got), want);
        assert_eq!(got["has_more"], true);
        assert_eq!(got["first_id"], "r_item_22");
        assert_eq!(got["last_id"], "r_item_3");
        let next = page("r", &items(23), Some("after=r_item_3")).unwrap_or_default();
        assert_eq!(ids(&next), ["r_item_2", "r_item_1", "r_item_0"]);
        assert_eq!(next["has_more"], false);
    }

    #[test]
    fn ascending_pages_walk_the_whole_input_once() {
        let input = items(7);
        let mut seen = Vec::new();
        let mut query = "order=asc&limit=3".to_owned();
        loop {
            let got = page("r", &input, Some(&query)).unwrap_or_default();
            seen.extend(ids(&got));
            if got["has_more"] != true {
                break;
            }
            query = format!(
                "order=asc&limit=3&after={}",
                got["last_id"].as_str().unwrap_or("")
            );
        }
        let want: Vec<String> = (0..7).map(|i| format!("r_item_{i}")).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn an_item_keeps_its_own_id_and_bad_parameters_are_named() {
        let input = vec![
            json!({"id": "msg_1", "role": "user", "content": "x"}),
            json!("hi"),
        ];
        let got = page("r", &input, Some("order=asc")).unwrap_or_default();
        assert_eq!(ids(&got), ["msg_1", "r_item_1"]);
        assert_eq!(got["data"][1]["content"], "hi");
        for (query, word) in [
            ("limit=0", "`limit`"),
            ("limit=101", "`limit`"),
            ("limit=x", "`limit`"),
            ("order=up", "`order`"),
            ("after=nope", "`after`"),
        ] {
            match page("r", &input, Some(query)) {
                Err(ProxyError::InvalidRequest { message }) => {
                    assert!(message.contains(word), "{query}: {message}")
                }
                other => panic!("{query}: {other:?}"),
            }
        }
        // After the last item: nothing more, not an error.
        let got = page("r", &input, Some("order=asc&after=r_item_1")).unwrap_or_default();
        assert_eq!(ids(&got), Vec::<String>::new());
        assert_eq!(got["first_id"], Value::Null);
    }
}
