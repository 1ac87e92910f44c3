//! A whole Chat Completions answer brought back as a Responses `response` object, and the
//! parts of it the stream translation shares: items, usage, status and the request echo.

use serde_json::{Map, Value, json};

use crate::translate::Untranslatable;

/// What a translated response is named and stamped with, chosen by legate (the upstream's
/// own id names a Chat completion or a Message, not a response).
#[derive(Debug, Clone)]
pub struct ResponseCtx {
    /// `resp_…`, the id the store keeps the conversation under.
    pub id: String,
    pub created_at: u64,
    /// The request fields a response object echoes (instructions, tools, sampling, …).
    pub echo: Map<String, Value>,
}

/// Request fields the response object repeats, with their defaults when the caller set none.
const ECHOED: &[(&str, Value)] = &[
    ("instructions", Value::Null),
    ("max_output_tokens", Value::Null),
    ("previous_response_id", Value::Null),
    ("parallel_tool_calls", Value::Bool(true)),
    ("tool_choice", Value::Null),
    ("temperature", Value::Null),
    ("top_p", Value::Null),
    ("tools", Value::Null),
    ("text", Value::Null),
    ("reasoning", Value::Null),
    ("store", Value::Bool(true)),
    ("metadata", Value::Null),
];

impl ResponseCtx {
    /// Picks the echoed fields out of the caller's request body (not rebuilt: the caller's own
    /// `previous_response_id` is echoed).
    pub fn new(id: String, created_at: u64, request: &[u8]) -> Self {
        let req: Map<String, Value> = serde_json::from_slice(request).unwrap_or_default();
        let mut echo = Map::new();
        for (key, default) in ECHOED {
            let value = req.get(*key).filter(|v| !v.is_null()).cloned();
            echo.insert((*key).to_owned(), value.unwrap_or_else(|| default.clone()));
        }
        for (key, empty) in [("tools", json!([])), ("metadata", json!({}))] {
            if echo[key].is_null() {
                echo.insert(key.to_owned(), empty);
            }
        }
        if echo["tool_choice"].is_null() {
            echo.insert("tool_choice".into(), json!("auto"));
        }
        if echo["text"].is_null() {
            echo.insert("text".into(), json!({"format": {"type": "text"}}));
        }
        ResponseCtx {
            id,
            created_at,
            echo,
        }
    }

    /// The response object around `output`, in `status`, with `usage` (null while running).
    pub fn object(&self, model: &str, status: &str, output: Vec<Value>, usage: Value) -> Value {
        let mut obj = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": false, "error": null, "incomplete_details": null,
            "model": model, "output": output, "truncation": "disabled", "usage": usage,
        });
        if let Some(map) = obj.as_object_mut() {
            map.extend(self.echo.clone());
        }
        obj
    }
}

/// `completed`, or `incomplete` and its reason, from a Chat `finish_reason`.
pub fn status_for(finish_reason: Option<&str>) -> (&'static str, Value) {
    match finish_reason {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// Chat usage in Responses terms: both count cached tokens inside the input. The cache writes
/// of a chat answer translated from Anthropic (`cache_write_tokens`, legate's own member) are
/// kept, so that they are metered at their price, not as input.
pub fn usage_from_chat(usage: Option<&Value>) -> Value {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let Some(u) = usage.filter(|u| u.is_object()) else {
        return Value::Null;
    };
    let input = n(u.get("prompt_tokens"));
    let output = n(u.get("completion_tokens"));
    let mut details = json!({
        "cached_tokens": n(u.pointer("/prompt_tokens_details/cached_tokens")),
    });
    if let Some(w) = u
        .pointer("/prompt_tokens_details/cache_write_tokens")
        .and_then(Value::as_u64)
    {
        details["cache_write_tokens"] = w.into();
    }
    json!({
        "input_tokens": input,
        "input_tokens_details": details,
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": n(u.pointer("/completion_tokens_details/reasoning_tokens")),
        },
        "total_tokens": input + output,
    })
}

/// An assistant message item with one text (or refusal) part: `completed`, or `incomplete`
/// when the output limit cut it (`cut`: it was the answer's last item, and the answer ended
/// with finish reason `length`), as OpenAI marks a message cut by `max_output_tokens`.
pub fn message_item(id: &str, text: &str, refusal: bool, cut: bool) -> Value {
    let part = if refusal {
        json!({"type": "refusal", "refusal": text})
    } else {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    };
    let status = if cut { "incomplete" } else { "completed" };
    json!({
        "id": id, "type": "message", "status": status, "role": "assistant",
        "content": [part],
    })
}

/// A completed function call item; the arguments must be a JSON object (SPEC §10). A call the
/// output limit cut (`cut`: finish reason `length`) ends mid-way by design and would be cut the
/// same way again: it is passed on as it came, as an `incomplete` item of the `incomplete`
/// response, as OpenAI's own answer cut by `max_output_tokens` is.
pub fn call_item(
    call_id: &str,
    name: &str,
    arguments: &str,
    cut: bool,
) -> Result<Value, Untranslatable> {
    let whole = serde_json::from_str::<Value>(arguments).is_ok_and(|v| v.is_object());
    if !whole && !cut {
        return Err(Untranslatable(format!(
            "the model called the tool `{name}` with arguments that are not a JSON object"
        )));
    }
    let status = if whole { "completed" } else { "incomplete" };
    Ok(json!({
        "id": format!("fc_{call_id}"), "type": "function_call", "status": status,
        "call_id": call_id, "name": name, "arguments": arguments,
    }))
}

/// A whole `chat.completion` as a response object.
pub fn from_chat(body: &[u8], ctx: &ResponseCtx) -> Result<Value, Untranslatable> {
    let chat: Value = serde_json::from_slice(body)
        .map_err(|e| Untranslatable(format!("the upstream answer is not JSON: {e}")))?;
    let Some(choice) = chat.pointer("/choices/0") else {
        return Err(Untranslatable(
            "the upstream answer has no choices".to_owned(),
        ));
    };
    let message = &choice["message"];
    let mut output = Vec::new();
    let item_id = format!("msg_{}", ctx.id.trim_start_matches("resp_"));
    let cut = choice["finish_reason"].as_str() == Some("length");
    // Tool calls follow the text: the text is the last item, and the cut one, only without them.
    let text_cut = cut
        && message["tool_calls"]
            .as_array()
            .is_none_or(|calls| calls.is_empty());
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        output.push(message_item(&item_id, text, false, text_cut));
    } else if let Some(text) = message["refusal"].as_str().filter(|t| !t.is_empty()) {
        output.push(message_item(&item_id, text, true, text_cut));
    }
    for (n, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        // A call without an id (some compatible servers) gets a stand-in, as a streamed one
        // does: calls sharing `""` could not be told apart when their outputs come back.
        let id = match call["id"].as_str().filter(|id| !id.is_empty()) {
            Some(id) => std::borrow::Cow::Borrowed(id),
            None => std::borrow::Cow::Owned(format!("call_legate_{n}")),
        };
        let name = call.pointer("/function/name").and_then(Value::as_str);
        let args = call.pointer("/function/arguments").and_then(Value::as_str);
        output.push(call_item(
            &id,
            name.unwrap_or_default(),
            args.unwrap_or("{}"),
            cut,
        )?);
    }
    let (status, incomplete) = status_for(choice["finish_reason"].as_str());
    let model = chat["model"].as_str().unwrap_or_default();
    let mut obj = ctx.object(model, status, output, usage_from_chat(chat.get("usage")));
    obj["incomplete_details"] = incomplete;
    Ok(obj)
}
