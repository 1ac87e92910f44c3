//! A Responses request rewritten as a Chat Completions request: the pivot of every translated
//! Responses call (a Chat-only step takes it as is; an Anthropic step takes it through the
//! Chat → Messages translation). The mapping table is in the module docs of `responses`.

use serde_json::{Map, Value, json};

use super::Labels;
use crate::translate::Untranslatable;

/// Top-level fields with no Chat Completions counterpart, each its own drop label.
const DROPPED_FIELDS: &[&str] = &[
    "store",
    "include",
    "metadata",
    "truncation",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
    "safety_identifier",
    "top_logprobs",
    "max_tool_calls",
    "stream_options",
];

/// Fields that ask for something only OpenAI's own servers hold: never served elsewhere.
const UNFIT_FIELDS: &[(&str, &str)] = &[
    ("background", "background mode runs on OpenAI's servers"),
    (
        "conversation",
        "a conversation object lives on OpenAI's servers",
    ),
    (
        "prompt",
        "a stored prompt template lives on OpenAI's servers",
    ),
];

/// Fields read by the translation itself.
const MAPPED_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "text",
    "reasoning",
    "user",
    "previous_response_id",
];

fn unfit(msg: impl Into<String>) -> Untranslatable {
    Untranslatable(msg.into())
}

/// Translates a Responses request body (its `input` already rebuilt from the store when it
/// named a `previous_response_id`) into a Chat Completions body for `target_model`.
pub fn to_chat(body: &[u8], target_model: &str) -> Result<(Value, Labels), Untranslatable> {
    let req: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| unfit(format!("the body is not a valid Responses request: {e}")))?;
    let mut labels = Labels::default();
    for (key, value) in req.iter().filter(|(_, v)| !v.is_null()) {
        if let Some((_, why)) = UNFIT_FIELDS.iter().find(|(k, _)| k == key) {
            if *key != "background" || value == &Value::Bool(true) {
                return Err(unfit(format!("`{key}` cannot be served here: {why}")));
            }
        } else if let Some(label) = DROPPED_FIELDS.iter().find(|k| **k == key.as_str()) {
            labels.add(label);
        } else if !MAPPED_FIELDS.contains(&key.as_str()) {
            labels.add("unknown_fields");
        }
    }
    let mut messages = Vec::new();
    // A field of the wrong type would otherwise be dropped unseen, and the model answer
    // without the system prompt or the tools the caller sent.
    match req.get("instructions") {
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        None | Some(Value::Null) => {}
        Some(_) => return Err(unfit("`instructions` must be a string")),
    }
    let prompt = messages.len();
    match req.get("input") {
        // An empty string is no input either (it would go out as an empty user message).
        Some(Value::String(text)) if text.is_empty() => {}
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => input_items(items, &mut messages, &mut labels)?,
        None | Some(Value::Null) => {}
        Some(_) => return Err(unfit("`input` must be a string or a list of items")),
    }
    if messages.len() == prompt {
        return Err(unfit(
            "the request has no `input` a model could answer (none, empty, or only items this step drops)",
        ));
    }
    if !matches!(req.get("tools"), None | Some(Value::Null | Value::Array(_))) {
        return Err(unfit("`tools` must be a list"));
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(target_model));
    out.insert("messages".into(), Value::Array(messages));
    let tools = tools(req.get("tools"), &mut labels)?;
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = req.get("tool_choice").filter(|v| !v.is_null()) {
        out.insert("tool_choice".into(), tool_choice(choice)?);
    }
    for (from, to) in [
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("user", "user"),
    ] {
        if let Some(v) = req.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    text_format(req.get("text"), &mut out, &mut labels)?;
    reasoning(req.get("reasoning"), &mut out, &mut labels);
    if req.get("stream") == Some(&Value::Bool(true)) {
        out.insert("stream".into(), json!(true));
        // Usage is only in the stream when asked for; the Responses caller always gets it.
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok((Value::Object(out), labels))
}

/// Input items become messages. Consecutive `function_call`s (and an assistant message just
/// before them) fold into one assistant message with `tool_calls`.
fn input_items(
    items: &[Value],
    messages: &mut Vec<Value>,
    labels: &mut Labels,
) -> Result<(), Untranslatable> {
    for item in items {
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            // An item without a type is a message (the easy input message form).
            None | Some("message") => messages.push(message(item, labels)?),
            Some("function_call") => push_call(messages, item)?,
            Some("function_call_output") => messages.push(json!({
                "role": "tool",
                "tool_call_id": str_field(item, "call_id")?,
                "content": output_text(item.get("output"), labels),
            })),
            Some("reasoning") => labels.add("reasoning_items"),
            Some("item_reference") => {
                return Err(unfit(
                    "an `item_reference` input item names an item stored on OpenAI's servers",
                ));
            }
            Some(_) => labels.add("builtin_tool_items"),
        }
    }
    Ok(())
}

fn str_field<'a>(item: &'a Value, key: &str) -> Result<&'a str, Untranslatable> {
    str_of(item, key, "an input item")
}

/// `what`'s string member `key`, or the step is unfit, naming what lacked it (an input item,
/// a tool, a tool choice).
fn str_of<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a str, Untranslatable> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| unfit(format!("{what} lacks the string `{key}`")))
}

fn push_call(messages: &mut Vec<Value>, item: &Value) -> Result<(), Untranslatable> {
    let call = json!({
        "id": str_field(item, "call_id")?,
        "type": "function",
        "function": {"name": str_field(item, "name")?, "arguments": str_field(item, "arguments")?},
    });
    if let Some(last) = messages.last_mut()
        && last["role"] == "assistant"
    {
        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
            Some(calls) => calls.push(call),
            None => last["tool_calls"] = json!([call]),
        }
        return Ok(());
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    Ok(())
}

/// A message item: roles map one to one; parts map to Chat parts (module docs).
fn message(item: &Value, labels: &mut Labels) -> Result<Value, Untranslatable> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant" | "system" | "developer")) => role,
        _ => {
            return Err(unfit(
                "a message item needs a role: user, assistant, system or developer",
            ));
        }
    };
    let content = match item.get("content") {
        Some(Value::String(text)) => json!(text),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for part in parts {
                if let Some(p) = content_part(part, labels)? {
                    out.push(p);
                }
            }
            // Assistant and system content is text only in Chat Completions: join it.
            if role != "user" && out.iter().all(|p| p["type"] == "text") {
                let text: String = out.iter().filter_map(|p| p["text"].as_str()).collect();
                json!(text)
            } else {
                Value::Array(out)
            }
        }
        _ => {
            return Err(unfit(
                "a message item needs `content`: a string or a list of parts",
            ));
        }
    };
    Ok(json!({"role": role, "content": content}))
}

fn content_part(part: &Value, labels: &mut Labels) -> Result<Option<Value>, Untranslatable> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    Ok(match kind {
        "input_text" | "output_text" | "text" => {
            Some(json!({"type": "text", "text": part.get("text").cloned().unwrap_or(json!(""))}))
        }
        "refusal" => {
            Some(json!({"type": "text", "text": part.get("refusal").cloned().unwrap_or(json!(""))}))
        }
        "input_image" => {
            let Some(url) = part.get("image_url").and_then(Value::as_str) else {
                return Err(unfit(
                    "an `input_image` by `file_id` names a file stored on OpenAI's servers",
                ));
            };
            let mut image = json!({"url": url});
            if let Some(detail) = part.get("detail").filter(|d| !d.is_null()) {
                image["detail"] = detail.clone();
            }
            Some(json!({"type": "image_url", "image_url": image}))
        }
        "input_file" => {
            let mut file = Map::new();
            for key in ["file_data", "file_id", "filename"] {
                if let Some(v) = part.get(key).filter(|v| !v.is_null()) {
                    file.insert(key.into(), v.clone());
                }
            }
            Some(json!({"type": "file", "file": file}))
        }
        _ => {
            labels.add("unsupported_parts");
            None
        }
    })
}

/// A function call's output: a string, or parts whose texts are joined (images dropped).
fn output_text(output: Option<&Value>, labels: &mut Labels) -> Value {
    match output {
        Some(Value::String(s)) => json!(s),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.get("text").and_then(Value::as_str) {
                    Some(t) => text.push_str(t),
                    None => labels.add("tool_output_media"),
                }
            }
            json!(text)
        }
        Some(other) => json!(other.to_string()),
        None => json!(""),
    }
}

/// Function tools map to Chat function tools; built-in and custom tools run on OpenAI's side
/// or need its grammar support, and are dropped.
fn tools(tools: Option<&Value>, labels: &mut Labels) -> Result<Vec<Value>, Untranslatable> {
    let Some(Value::Array(list)) = tools else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for tool in list {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            labels.add("builtin_tools");
            continue;
        }
        let mut function = Map::new();
        function.insert(
            "name".into(),
            json!(str_of(tool, "name", "a function tool")?),
        );
        for key in ["description", "parameters", "strict"] {
            if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

fn tool_choice(choice: &Value) -> Result<Value, Untranslatable> {
    if let Some(mode @ ("auto" | "none" | "required")) = choice.as_str() {
        return Ok(json!(mode));
    }
    match choice.get("type").and_then(Value::as_str) {
        Some("function") => Ok(json!({
            "type": "function", "function": {"name": str_of(choice, "name", "`tool_choice`")?},
        })),
        Some("allowed_tools") => Ok(json!(
            choice.get("mode").and_then(Value::as_str).unwrap_or("auto")
        )),
        _ => Err(unfit(
            "`tool_choice` forces a built-in tool, which runs on OpenAI's servers",
        )),
    }
}

/// `text.format` becomes `response_format` (a JSON schema keeps name, schema and strict).
fn text_format(
    text: Option<&Value>,
    out: &mut Map<String, Value>,
    labels: &mut Labels,
) -> Result<(), Untranslatable> {
    let Some(text) = text.filter(|t| !t.is_null()) else {
        return Ok(());
    };
    if text.get("verbosity").is_some_and(|v| !v.is_null()) {
        labels.add("verbosity");
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(());
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") | None => {}
        Some("json_object") => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some("json_schema") => {
            let mut schema = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": schema}),
            );
        }
        Some(other) => return Err(unfit(format!("`text.format` type `{other}` is unknown"))),
    }
    Ok(())
}

fn reasoning(reasoning: Option<&Value>, out: &mut Map<String, Value>, labels: &mut Labels) {
    let Some(reasoning) = reasoning.filter(|r| !r.is_null()) else {
        return;
    };
    if let Some(effort) = reasoning.get("effort").filter(|e| !e.is_null()) {
        out.insert("reasoning_effort".into(), effort.clone());
    }
    if reasoning.get("summary").is_some_and(|s| !s.is_null()) {
        labels.add("reasoning_summary");
    }
}
